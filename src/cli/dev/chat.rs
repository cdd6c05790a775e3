use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;

use crate::engine::EngineHandle;
use crate::store::Paths;
use crate::ui::{Action, AppState, ModelStatus};

#[derive(Debug, Args)]
pub struct ChatArgs {
    /// Conversations are written under DATA_DIR/conversations.
    #[arg(long)]
    data_dir: PathBuf,
    /// The model folder.
    #[arg(long)]
    model: PathBuf,
    #[arg(long)]
    message: String,
    #[arg(long, default_value_t = 512)]
    max_new_tokens: usize,
    /// How often the streaming reply is saved.
    #[arg(long, default_value_t = 1000)]
    save_interval_ms: u64,
    /// Give up after this long.
    #[arg(long, default_value_t = 120)]
    timeout_s: u64,
}

pub fn run(args: ChatArgs) -> Result<(), String> {
    let (wake_tx, wake_rx) = crossbeam_channel::unbounded();
    let paths = Paths {
        data_dir: args.data_dir.clone(),
        config_dir: args.data_dir.join("config"),
    };
    let engine = EngineHandle::spawn(move || {
        let _ = wake_tx.send(());
    })
    .map_err(|err| format!("cannot start the inference thread: {err}"))?;
    let mut state = AppState::new(paths, engine)
        .with_save_interval(Duration::from_millis(args.save_interval_ms));
    let mut settings = state.settings().clone();
    settings.max_new_tokens = args.max_new_tokens;
    state.apply(Action::UpdateSettings(settings));
    state.apply(Action::UseModelFolder(args.model));
    let deadline = Instant::now() + Duration::from_secs(args.timeout_s);
    let mut sent = false;
    while Instant::now() < deadline {
        let wait = state.next_save_in().unwrap_or(Duration::from_millis(200));
        let _ = wake_rx.recv_timeout(wait);
        state.poll();
        if let Some(error) = state.errors().first() {
            return Err(error.clone());
        }
        if let ModelStatus::Failed(message) = state.model() {
            return Err(message.clone());
        }
        if !sent && state.model_ready() {
            sent = state.apply(Action::Send(args.message.clone()));
            println!("{}", state.conversation_path(&state.current().id).display());
        } else if sent && !state.is_generating() {
            return Ok(());
        }
    }
    Err("timed out".into())
}
