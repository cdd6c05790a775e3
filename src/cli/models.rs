//! `smolchat models`: the models on this machine, as the window's first screen finds them.

use clap::Subcommand;

use crate::model_library;
use crate::store::Paths;

#[derive(Debug, Subcommand)]
pub enum ModelsCommand {
    /// Every model on this machine: smolchat's folder, the Hugging Face cache, and Ollama's,
    /// LM Studio's, llama.cpp's, GPT4All's and Jan's stores, read in place.
    List,
}

pub fn run(command: ModelsCommand) -> Result<(), String> {
    match command {
        ModelsCommand::List => list(),
    }
}

fn list() -> Result<(), String> {
    let paths = Paths::from_env().ok_or(
        "cannot find a home folder for smolchat's models; set SMOLCHAT_DATA_DIR".to_string(),
    )?;
    let library = model_library::scan(&model_library::locations(&paths));
    for reason in &library.skipped {
        eprintln!("skipped: {reason}");
    }
    if library.models.is_empty() {
        eprintln!("no models found; `smolchat download` fetches one");
        return Ok(());
    }
    let name_width = library
        .models
        .iter()
        .map(|model| model.name.chars().count())
        .max()
        .unwrap_or(0);
    for model in &library.models {
        println!(
            "{:<name_width$}  {:>9}  {:<18}  {}",
            model.name,
            size(model.bytes),
            model.store.label(),
            model.path.display()
        );
    }
    Ok(())
}

fn size(bytes: u64) -> String {
    if bytes < 1_000_000_000 {
        format!("{:.0} MB", bytes as f64 / 1e6)
    } else {
        format!("{:.1} GB", bytes as f64 / 1e9)
    }
}
