use clap::Args;

use crate::hub::DEFAULT_MODEL_ID;

#[derive(Debug, Args)]
pub struct DownloadArgs {
    /// The hub id of the model.
    #[arg(default_value = DEFAULT_MODEL_ID)]
    model_id: String,
}

/// Fetches the model into the shared Hugging Face cache and prints the folder it is in.
pub fn run(args: DownloadArgs) -> Result<(), String> {
    let dir = super::resolve_model(super::ModelSource::Hub(args.model_id))?;
    println!("{}", dir.display());
    Ok(())
}
