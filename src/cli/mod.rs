//! The command line: the same engine as the app, scriptable and measurable.

mod bench;
mod desktop;
mod dev;
mod download;
mod generate;
mod models;
mod sampling_args;
mod serve;

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;

use clap::{Parser, Subcommand};

use crate::hub::stderr_progress;
use crate::model::LoadProgress;
pub(crate) use crate::model_source::ModelSource;

#[derive(Debug, Parser)]
#[command(
    name = "smolchat",
    version,
    about = "Chat with a small language model, entirely on your machine"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Generate a reply (or continue a raw prompt) and stream it to stdout.
    Generate(generate::GenerateArgs),
    /// Serve the model over an OpenAI-compatible HTTP API (http://127.0.0.1:8080/v1).
    Serve(serve::ServeArgs),
    /// Measure prefill and decode speed, time to first token, load time and peak memory.
    Bench(bench::BenchArgs),
    /// Download a model from the Hugging Face hub into the shared cache.
    Download(download::DownloadArgs),
    /// The models on this machine.
    #[command(subcommand)]
    Models(models::ModelsCommand),
    /// Add smolchat to the desktop's application menu (XDG .desktop file and icon).
    InstallDesktopEntry(desktop::InstallArgs),
    /// Developer tools (random checkpoints for benchmarks and tests).
    #[command(subcommand, hide = true)]
    Dev(dev::DevCommand),
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Generate(args)) => generate::run(args),
        Some(Command::Serve(args)) => serve::run(args),
        Some(Command::Bench(args)) => bench::run(args),
        Some(Command::Download(args)) => download::run(args),
        Some(Command::Models(command)) => models::run(command),
        Some(Command::InstallDesktopEntry(args)) => desktop::run(args),
        Some(Command::Dev(command)) => dev::run(command),
        None => crate::store::Paths::from_env()
            .ok_or_else(|| {
                "cannot find a home folder for settings and conversations; set SMOLCHAT_DATA_DIR and SMOLCHAT_CONFIG_DIR".to_string()
            })
            .and_then(crate::ui::run),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// A model's loading on one line of a terminal's stderr, wiped after the last layer; nothing
/// when stderr is not a terminal, where each `\r` line would only fill a log.
fn stderr_load_progress() -> impl FnMut(LoadProgress) {
    let terminal = std::io::stderr().is_terminal();
    move |progress: LoadProgress| {
        if !terminal {
            return;
        }
        let mut err = std::io::stderr().lock();
        // Terminal output is best effort, as for downloads.
        let _ = write!(
            err,
            "\rloading the model: layer {} of {}\x1b[K",
            progress.layers_read, progress.layers
        );
        if progress.layers_read == progress.layers {
            let _ = write!(err, "\r\x1b[K");
        }
        let _ = err.flush();
    }
}

/// The model's folder, a hub model fetched first with a progress bar on stderr.
fn resolve_model(source: ModelSource) -> Result<PathBuf, String> {
    let never_cancelled = AtomicBool::new(false);
    crate::engine::resolve_source(&source, &mut stderr_progress(), &never_cancelled)
        .map_err(|err| err.to_string())
}
