//! The command line: the same engine as the app, scriptable and measurable.

mod bench;
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
        Some(Command::Dev(command)) => dev::run(command),
        None => {
            use clap::CommandFactory;
            Cli::command().print_help().map_err(|err| err.to_string())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}
