use std::io::{IsTerminal, Write};
use std::ops::ControlFlow;

use clap::Args;

use super::sampling_args::SamplingArgs;
use crate::backend::BackendKind;
use crate::generation::{
    CheckedPrompt, FinishReason, GenerationSession, LoadedModel, ModelOptions, PROMPT_CHUNK,
    Prompt, PromptFit, PromptProgress, Step, TokenLogprobs,
};
use crate::model::Precision;
use crate::stats::memory;
use crate::text::reasoning::THINKING_VARIABLE;
use crate::text::{ChatMessage, OverflowPolicy, TemplateVariables};

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// A model folder, a .gguf file, a hub id such as HuggingFaceTB/SmolLM2-135M-Instruct, or
    /// owner/repo:Q4_K_M for one GGUF file of a hub repository.
    #[arg(long)]
    model: String,
    /// Feed the prompt as plain text, without the chat template.
    #[arg(long)]
    raw: bool,
    #[arg(long)]
    prompt: String,
    /// A system prompt (chat mode only).
    #[arg(long, conflicts_with = "raw")]
    system: Option<String>,
    /// Ask a reasoning model (Qwen3, SmolLM3) to answer without thinking first: its template's
    /// `enable_thinking` set to false.
    #[arg(long, conflicts_with = "raw")]
    no_thinking: bool,
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[arg(long, value_enum, default_value_t)]
    backend: BackendKind,
    #[arg(long, value_enum, default_value_t)]
    precision: Precision,
    /// Print one JSON object with the text, token ids and speed figures instead of streaming.
    #[arg(long)]
    json: bool,
    /// With --json: each generated token's log-probability and the N likeliest alternatives',
    /// from the model's raw distribution (log-softmax at temperature 1, before any filter).
    #[arg(long, value_name = "N", requires = "json")]
    logprobs: Option<usize>,
}

#[derive(serde::Serialize)]
struct JsonReport {
    /// The GPU adapter or the CPU backend that ran the model.
    device: String,
    text: String,
    token_ids: Vec<u32>,
    prompt_tokens: usize,
    finish_reason: FinishReason,
    ttft_ms: f64,
    prefill_tok_s: Option<f64>,
    decode_tok_s: Option<f64>,
    peak_rss_mb: Option<f64>,
    /// Only with --logprobs.
    #[serde(skip_serializing_if = "Option::is_none")]
    tokens: Option<Vec<JsonToken>>,
}

#[derive(serde::Serialize)]
struct JsonToken {
    id: u32,
    text: String,
    logprob: f32,
    top_logprobs: Vec<JsonAlternative>,
}

#[derive(serde::Serialize)]
struct JsonAlternative {
    id: u32,
    text: String,
    logprob: f32,
}

impl JsonToken {
    fn new(id: u32, logprobs: TokenLogprobs) -> Self {
        Self {
            id,
            text: logprobs.text,
            logprob: logprobs.logprob,
            top_logprobs: logprobs
                .top
                .into_iter()
                .map(|(id, text, logprob)| JsonAlternative { id, text, logprob })
                .collect(),
        }
    }
}

pub fn run(args: GenerateArgs) -> Result<(), String> {
    let params = args.sampling.params().map_err(|err| err.to_string())?;
    let dir = super::resolve_model(super::ModelSource::parse(&args.model))?;
    let options = ModelOptions {
        backend: args.backend,
        precision: args.precision,
    };
    let loaded = LoadedModel::load_with_progress(&dir, options, &mut super::stderr_load_progress())
        .map_err(|err| err.to_string())?;
    if let Some(reason) = &loaded.device.fallback {
        eprintln!("warning: {reason}");
    }
    let mut variables = TemplateVariables::new();
    if args.no_thinking {
        variables.insert(THINKING_VARIABLE.into(), false.into());
    }
    let request = if args.raw {
        Prompt::Raw(args.prompt.clone())
    } else {
        if loaded.template.is_fallback() {
            eprintln!("note: {} has no chat template; using ChatML", dir.display());
        }
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(ChatMessage::system(system.clone()));
        }
        messages.push(ChatMessage::user(args.prompt.clone()));
        Prompt::Chat(messages)
    };
    // As the engine fits a request: the same room kept for the reply.
    let fit = PromptFit {
        limit: loaded.memory.context,
        max_new_tokens: Some(args.max_tokens),
        overflow: OverflowPolicy::Stop,
        variables: &variables,
    };
    let fitted = fit.ids(&loaded, &request).map_err(|err| err.to_string())?;
    let prompt_len = fitted.ids.len();
    let mut cache = loaded.new_cache();
    let checked = CheckedPrompt::new(fitted.ids, cache.max_len(), &params)
        .map_err(|err| err.to_string())?
        .with_history(fitted.history);
    // How far a long prompt has been read, on one line of the terminal.
    let terminal = std::io::stderr().is_terminal();
    let mut reading = |progress: PromptProgress| {
        if terminal {
            eprint!(
                "\rreading the prompt: {} / {} tokens",
                progress.done, progress.total
            );
        }
        ControlFlow::Continue(())
    };
    let session = GenerationSession::start_reading(
        &loaded,
        &mut cache,
        checked,
        args.max_tokens,
        &mut reading,
    );
    if terminal && prompt_len > PROMPT_CHUNK {
        eprint!("\r\x1b[K");
    }
    let mut session = session
        .map_err(|err| err.to_string())?
        .with_logprobs(args.logprobs);
    let mut text = String::new();
    let mut token_ids = Vec::new();
    let mut tokens = Vec::new();
    let mut stdout = std::io::stdout().lock();
    let reason = loop {
        let (piece, finished) = match session.step().map_err(|err| err.to_string())? {
            Step::Token(token) => {
                token_ids.push(token.id);
                if let Some(logprobs) = token.logprobs {
                    tokens.push(JsonToken::new(token.id, logprobs));
                }
                (token.text, None)
            }
            Step::Finished { reason, text } => (text, Some(reason)),
        };
        if !args.json {
            write!(stdout, "{piece}")
                .and_then(|()| stdout.flush())
                .map_err(|err| err.to_string())?;
        }
        text.push_str(&piece);
        if let Some(reason) = finished {
            break reason;
        }
    };
    let stats = session.stats().clone();
    if args.json {
        let report = JsonReport {
            device: loaded.device.name(),
            text,
            token_ids,
            prompt_tokens: stats.prompt_tokens,
            finish_reason: reason,
            ttft_ms: stats.time_to_first_token.as_secs_f64() * 1000.0,
            prefill_tok_s: stats.prefill_tokens_per_second(),
            decode_tok_s: stats.decode_tokens_per_second(),
            peak_rss_mb: memory::peak_resident_bytes().map(memory::mib),
            tokens: args.logprobs.map(|_| tokens),
        };
        let json = serde_json::to_string(&report).map_err(|err| err.to_string())?;
        writeln!(stdout, "{json}").map_err(|err| err.to_string())?;
    } else {
        writeln!(stdout).map_err(|err| err.to_string())?;
        if reason == FinishReason::ContextFull {
            eprintln!("note: the context window is full; the reply was cut there");
        }
    }
    Ok(())
}
