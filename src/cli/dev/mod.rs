use std::path::{Path, PathBuf};

use clap::Subcommand;

mod chat;

use crate::model::ModelConfig;
use crate::model::random_checkpoint::{StorageDtype, write_random_weights};
use crate::model_files::{
    CONFIG_FILE, GENERATION_CONFIG_FILE, SPECIAL_TOKENS_MAP_FILE, TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
};

/// Files copied next to a random checkpoint so that it is a complete model folder.
const COMPANION_FILES: [&str; 4] = [
    GENERATION_CONFIG_FILE,
    TOKENIZER_FILE,
    TOKENIZER_CONFIG_FILE,
    SPECIAL_TOKENS_MAP_FILE,
];

#[derive(Debug, Subcommand)]
pub enum DevCommand {
    /// Write a checkpoint with random weights for a config.json (tokenizer files beside the
    /// config are copied too).
    RandomCheckpoint {
        /// The config.json to build the checkpoint for.
        #[arg(long)]
        config: PathBuf,
        /// The folder to write; created if missing.
        #[arg(long)]
        out: PathBuf,
        /// Storage precision; defaults to the config's torch_dtype.
        #[arg(long, value_enum)]
        dtype: Option<StorageDtype>,
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Send one message through the app's own state, engine and store, saving the streaming
    /// reply as the window does (used to test that a kill -9 never corrupts a conversation).
    Chat(chat::ChatArgs),
}

pub fn run(command: DevCommand) -> Result<(), String> {
    match command {
        DevCommand::RandomCheckpoint {
            config,
            out,
            dtype,
            seed,
        } => random_checkpoint(&config, &out, dtype, seed),
        DevCommand::Chat(args) => chat::run(args),
    }
}

fn random_checkpoint(
    config_path: &Path,
    out: &Path,
    dtype: Option<StorageDtype>,
    seed: u64,
) -> Result<(), String> {
    let config = ModelConfig::from_file(config_path).map_err(|err| err.to_string())?;
    std::fs::create_dir_all(out)
        .map_err(|err| format!("cannot create {}: {err}", out.display()))?;
    let source_dir = config_path.parent().unwrap_or(Path::new("."));
    for name in std::iter::once(CONFIG_FILE).chain(COMPANION_FILES) {
        let source = if name == CONFIG_FILE {
            config_path.to_path_buf()
        } else {
            source_dir.join(name)
        };
        if source.is_file() {
            let target = out.join(name);
            std::fs::copy(&source, &target).map_err(|err| {
                format!(
                    "cannot copy {} to {}: {err}",
                    source.display(),
                    target.display()
                )
            })?;
        }
    }
    let dtype =
        dtype.unwrap_or_else(|| StorageDtype::from_torch_dtype(config.torch_dtype.as_deref()));
    write_random_weights(&config, dtype, seed, out).map_err(|err| err.to_string())?;
    println!("wrote a random {dtype:?} checkpoint to {}", out.display());
    Ok(())
}
