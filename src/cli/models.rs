//! `smolchat models`: the models on this machine, as the window's first screen finds them,
//! and what one of them is.

use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;

use clap::Subcommand;

use super::download::{self, DownloadArgs};

use crate::generation::{MemoryPlan, available_memory};
use crate::hub::ModelDownloader;
use crate::model_files::{model_name, weight_bytes};
use crate::model_library::{self, Library, LocalModel, facts, removal, size_text};
use crate::store::Paths;

#[derive(Debug, Subcommand)]
pub enum ModelsCommand {
    /// Every model on this machine: smolchat's folder, the Hugging Face cache, and Ollama's,
    /// LM Studio's, llama.cpp's, GPT4All's and Jan's stores, read in place.
    List,
    /// What one model is, from its files alone: family, weights, context, the memory it
    /// needs here, and whether this build runs it.
    Show {
        /// A name `list` prints, or a path.
        model: String,
    },
    /// Look for models on the Hugging Face hub: repositories whose name matches, most
    /// downloaded first.
    Search {
        query: String,
        /// How many to list.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// A hub repository's files and their sizes: each GGUF file's quantization and whether it
    /// fits in the memory free now (`models pull ORG/NAME:QUANT` downloads one).
    Files {
        /// The repository, `org/name`.
        model_id: String,
    },
    /// Download a model from the Hugging Face hub into the shared cache (as `download`).
    Pull(DownloadArgs),
    /// Delete a model from smolchat's folder or the Hugging Face cache, after asking; other
    /// apps' models are left to those apps.
    Rm {
        /// A name `list` prints, or the path it prints.
        model: String,
        /// Delete without asking.
        #[arg(long, short)]
        yes: bool,
    },
}

pub fn run(command: ModelsCommand) -> Result<(), String> {
    match command {
        ModelsCommand::List => list(),
        ModelsCommand::Show { model } => show(&model),
        ModelsCommand::Search { query, limit } => search(&query, limit),
        ModelsCommand::Files { model_id } => files(&model_id),
        ModelsCommand::Pull(args) => download::run(args),
        ModelsCommand::Rm { model, yes } => remove(&model, yes),
    }
}

fn hub() -> Result<ModelDownloader, String> {
    ModelDownloader::from_env().map_err(|err| err.to_string())
}

fn search(query: &str, limit: usize) -> Result<(), String> {
    let found = hub()?.search(query, limit).map_err(|err| err.to_string())?;
    if found.is_empty() {
        eprintln!("no models on the hub match {query:?}");
    }
    let width = found.iter().map(|model| model.id.chars().count()).max();
    for model in &found {
        println!(
            "{:<width$}  {:>9} downloads  {:>6} likes  {}",
            model.id,
            model.downloads,
            model.likes,
            model.formats.join(", "),
            width = width.unwrap_or(0)
        );
    }
    Ok(())
}

fn files(model_id: &str) -> Result<(), String> {
    let files = hub()?
        .repository_files(model_id)
        .map_err(|err| err.to_string())?;
    let available = available_memory();
    let width = files.iter().map(|file| file.name.chars().count()).max();
    for file in &files {
        let fits = match (file.quant.as_ref(), file.size, available) {
            (Some(_), Some(bytes), Some(free)) if MemoryPlan::weights_may_fit(bytes, free) => {
                "fits"
            }
            (Some(_), Some(_), Some(_)) => "too big",
            _ => "",
        };
        println!(
            "{:<width$}  {:>9}  {:<8}  {fits}",
            file.name,
            file.size.map(size_text).unwrap_or_default(),
            file.quant.as_deref().unwrap_or(""),
            width = width.unwrap_or(0)
        );
    }
    Ok(())
}

fn locations() -> Result<Vec<model_library::Location>, String> {
    let paths = Paths::from_env().ok_or(
        "cannot find a home folder for smolchat's models; set SMOLCHAT_DATA_DIR".to_string(),
    )?;
    Ok(model_library::locations(&paths))
}

fn library() -> Result<Library, String> {
    Ok(model_library::scan(&locations()?))
}

/// The library's model called `model`, by the name or the path `list` prints.
fn find<'a>(library: &'a Library, model: &str) -> Result<&'a LocalModel, String> {
    library
        .models
        .iter()
        .find(|found| found.name == model || found.path == Path::new(model))
        .ok_or_else(|| format!("no model named {model:?} here (`smolchat models list` names them)"))
}

fn remove(model: &str, yes: bool) -> Result<(), String> {
    let locations = locations()?;
    let library = model_library::scan(&locations);
    let found = find(&library, model)?;
    let removal = removal::plan(found, &library, &locations)?;
    println!(
        "{} ({}, {}):",
        found.name,
        size_text(removal.bytes),
        found.store.label()
    );
    for path in &removal.paths {
        println!("  {}", path.display());
    }
    if !yes {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Err("not deleted: pass --yes to delete without being asked".into());
        }
        print!("Delete? [y/N] ");
        std::io::stdout()
            .flush()
            .map_err(|err| format!("cannot write to the terminal: {err}"))?;
        let mut answer = String::new();
        stdin
            .lock()
            .read_line(&mut answer)
            .map_err(|err| format!("cannot read the answer: {err}"))?;
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            println!("kept");
            return Ok(());
        }
    }
    removal.apply()?;
    println!("deleted, {} freed", size_text(removal.bytes));
    Ok(())
}

fn show(model: &str) -> Result<(), String> {
    let path = Path::new(model);
    let path = if path.exists() {
        path.to_path_buf()
    } else {
        find(&library()?, model)
            .map_err(|err| format!("{err}, and no such path"))?
            .path
            .clone()
    };
    let row = |label: &str, value: &dyn std::fmt::Display| println!("{label:<11} {value}");
    row("name", &model_name(&path));
    row("path", &path.display());
    row("files", &size_text(weight_bytes(&path)));
    match facts::read(&path) {
        Ok(facts) => {
            if let Some(parameters) = facts.parameters {
                row("parameters", &format!("{:.2} B", parameters as f64 / 1e9));
            }
            if let Some(weights) = &facts.weights {
                row("weights", weights);
            }
            row("family", &facts.family);
            row("context", &format!("{} tokens", facts.plan.model_context));
            row("memory", &facts.plan.describe());
            row("runs here", &"yes");
        }
        Err(reason) => row("runs here", &format!("no: {reason}")),
    }
    Ok(())
}

fn list() -> Result<(), String> {
    let library = library()?;
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
        let (family, weights, fits) = match facts::read(&model.path) {
            Ok(facts) => (
                facts.family_name().to_string(),
                facts.main_type().unwrap_or("?").to_string(),
                match facts.fits {
                    Some(true) => "fits",
                    Some(false) => "too big",
                    None => "?",
                },
            ),
            Err(_) => ("unsupported".to_string(), String::new(), ""),
        };
        println!(
            "{:<name_width$}  {:>9}  {family:<11}  {weights:<8}  {fits:<7}  {:<18}  {}",
            model.name,
            size_text(model.bytes),
            model.store.label(),
            model.path.display()
        );
    }
    Ok(())
}
