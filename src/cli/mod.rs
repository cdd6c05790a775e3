//! The command line: the same engine as the app, scriptable and measurable.

mod bench;
mod desktop;
mod dev;
mod download;
mod generate;
mod model_source;
mod sampling_args;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    /// Measure prefill and decode speed, time to first token, load time and peak memory.
    Bench(bench::BenchArgs),
    /// Download a model from the Hugging Face hub into the shared cache.
    Download(download::DownloadArgs),
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
        Some(Command::Bench(args)) => bench::run(args),
        Some(Command::Download(args)) => download::run(args),
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
