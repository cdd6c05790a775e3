use std::time::{Duration, Instant};

use clap::Args;

use crate::backend::BackendKind;
use crate::generation::{GenerationError, GenerationSession, LoadedModel, ModelOptions, Step};
use crate::model::{KvCache, Precision};
use crate::stats::dispatches::LaunchCounts;
use crate::stats::memory;
use crate::stats::summary::Summary;
use crate::text::SamplingParams;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// A model folder (e.g. one written by `smolchat dev random-checkpoint`), a .gguf file, a
    /// hub id, or owner/repo:Q4_K_M.
    #[arg(long)]
    model: String,
    #[arg(long, default_value_t = 128)]
    prompt_tokens: usize,
    #[arg(long, default_value_t = 128)]
    gen_tokens: usize,
    #[arg(long, default_value_t = 5)]
    runs: usize,
    #[arg(long, value_enum, default_value_t)]
    backend: BackendKind,
    #[arg(long, value_enum, default_value_t)]
    precision: Precision,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// After the timed runs, decode once more counting the GPU's kernel launches and the
    /// reads back from the device, per decoded token and by kernel.
    #[arg(long)]
    profile_dispatches: bool,
}

#[derive(Debug, serde::Serialize)]
struct BenchReport {
    model: String,
    backend: BackendKind,
    /// The GPU adapter or the CPU backend that ran the model.
    device: String,
    precision: Precision,
    /// How the weight matrices are held (f32 runs on the CPU hold a bf16 checkpoint's
    /// weights and a GGUF file's integers as they are stored; see `LoadedModel::weights`).
    weights: String,
    threads: usize,
    prompt_tokens: usize,
    gen_tokens: usize,
    runs: usize,
    load_s: f64,
    prefill_tok_s: Summary,
    decode_tok_s: Summary,
    decode_ms_per_token: Summary,
    ttft_ms: Summary,
    peak_rss_load_mb: Option<f64>,
    peak_rss_generate_mb: Option<f64>,
    /// What the GPU's allocator held after the runs; absent on the CPU.
    device_memory_mb: Option<f64>,
    /// With `--profile-dispatches`.
    #[serde(skip_serializing_if = "Option::is_none")]
    dispatches: Option<DispatchProfile>,
}

/// What one decode step asks of the device, averaged over a run's decode steps.
#[derive(Debug, serde::Serialize)]
struct DispatchProfile {
    /// Kernel launches (compute dispatches).
    per_token: f64,
    /// Reads of results back to the host.
    reads_per_token: f64,
    /// Launches per token by kernel name, most first.
    by_kernel: Vec<(String, f64)>,
}

/// One run: a fresh cache, a prompt prefilled in one pass, then greedy decoding of exactly
/// `generated` tokens (no stop token ends a benchmark early), through the same generation
/// loop as the app.
struct RunTimes {
    prefill: Duration,
    first_token: Duration,
    decode: Duration,
}

fn run_once(
    loaded: &LoadedModel,
    prompt: &[u32],
    generated: usize,
) -> Result<RunTimes, GenerationError> {
    let mut cache = loaded.new_cache();
    let mut session = benchmark_session(loaded, &mut cache, prompt, generated)?;
    while let Step::Token(_) = session.step()? {}
    let stats = session.stats();
    Ok(RunTimes {
        prefill: stats.prefill_time,
        first_token: stats.time_to_first_token,
        decode: stats.decode_time,
    })
}

/// A fresh cache's generation of exactly `generated` greedy tokens.
fn benchmark_session<'a>(
    loaded: &'a LoadedModel,
    cache: &'a mut KvCache,
    prompt: &[u32],
    generated: usize,
) -> Result<GenerationSession<'a>, GenerationError> {
    let greedy = SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    };
    Ok(GenerationSession::start(loaded, cache, prompt, &greedy, generated)?.ignoring_stop_tokens())
}

/// Counts launches over the decode steps of one more run: the prompt's own launches are left
/// out, since a decode step is what a chat waits on for every token.
fn profile_dispatches(
    loaded: &LoadedModel,
    prompt: &[u32],
    generated: usize,
) -> Result<DispatchProfile, GenerationError> {
    let mut cache = loaded.new_cache();
    let mut session = benchmark_session(loaded, &mut cache, prompt, generated)?;
    let reads_before = session.stats().device_reads;
    let (counts, observing) = LaunchCounts::observe();
    let mut steps = 0usize;
    while let Step::Token(_) = session.step()? {
        steps += 1;
    }
    drop(observing);
    // Each step samples a token and runs it through the model.
    let forwards = steps.max(1) as f64;
    let mut by_kernel: Vec<(String, f64)> = counts
        .by_kernel()
        .into_iter()
        .map(|(kernel, count)| (kernel, count as f64 / forwards))
        .collect();
    by_kernel.sort_by(|a, b| b.1.total_cmp(&a.1));
    Ok(DispatchProfile {
        per_token: counts.total() as f64 / forwards,
        reads_per_token: (session.stats().device_reads - reads_before) as f64 / forwards,
        by_kernel,
    })
}

pub fn run(args: BenchArgs) -> Result<(), String> {
    if args.runs == 0 || args.prompt_tokens == 0 || args.gen_tokens < 2 {
        return Err(
            "--runs and --prompt-tokens must be at least 1, --gen-tokens at least 2".into(),
        );
    }
    let dir = super::resolve_model(super::ModelSource::parse(&args.model))?;
    memory::reset_peak();
    let started = Instant::now();
    let options = ModelOptions {
        backend: args.backend,
        precision: args.precision,
    };
    let loaded = LoadedModel::load(&dir, options).map_err(|err| err.to_string())?;
    if let Some(reason) = &loaded.device.fallback {
        eprintln!("warning: {reason}");
    }
    let load_s = started.elapsed().as_secs_f64();
    let peak_rss_load_mb = memory::peak_resident_bytes().map(memory::mib);
    let (model, device) = (&loaded.model, &loaded.device);
    let config = model.config();
    if args.prompt_tokens + args.gen_tokens > loaded.memory.context {
        return Err(format!(
            "--prompt-tokens + --gen-tokens = {} exceeds the model's context of {}",
            args.prompt_tokens + args.gen_tokens,
            loaded.memory.context
        ));
    }
    let vocab = config.vocab_size as u32;
    // Ordinary-looking ids spread over the vocabulary, the same on every run.
    let prompt: Vec<u32> = (0..args.prompt_tokens as u32)
        .map(|i| 100 + (i * 7919) % (vocab - 100))
        .collect();

    memory::reset_peak();
    run_once(&loaded, &prompt, 2).map_err(|err| err.to_string())?;
    let mut times = Vec::with_capacity(args.runs);
    for _ in 0..args.runs {
        times.push(run_once(&loaded, &prompt, args.gen_tokens).map_err(|err| err.to_string())?);
    }
    let peak_rss_generate_mb = memory::peak_resident_bytes().map(memory::mib);
    let dispatches = if args.profile_dispatches {
        Some(profile_dispatches(&loaded, &prompt, args.gen_tokens).map_err(|err| err.to_string())?)
    } else {
        None
    };

    let summary = |f: &dyn Fn(&RunTimes) -> f64| {
        Summary::of(&times.iter().map(f).collect::<Vec<_>>()).ok_or("no runs measured")
    };
    let decoded = (args.gen_tokens - 1) as f64;
    let report = BenchReport {
        model: dir.display().to_string(),
        backend: device.backend,
        device: device.name(),
        precision: args.precision,
        weights: loaded.weights(),
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        prompt_tokens: args.prompt_tokens,
        gen_tokens: args.gen_tokens,
        runs: args.runs,
        load_s,
        prefill_tok_s: summary(&|t| args.prompt_tokens as f64 / t.prefill.as_secs_f64())?,
        decode_tok_s: summary(&|t| decoded / t.decode.as_secs_f64())?,
        decode_ms_per_token: summary(&|t| t.decode.as_secs_f64() * 1000.0 / decoded)?,
        ttft_ms: summary(&|t| t.first_token.as_secs_f64() * 1000.0)?,
        peak_rss_load_mb,
        peak_rss_generate_mb,
        device_memory_mb: device.device_memory_bytes().map(memory::mib),
        dispatches,
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&report).map_err(|err| err.to_string())?
        );
    } else {
        print_table(&report);
    }
    Ok(())
}

fn print_table(r: &BenchReport) {
    let row = |name: &str, s: &Summary| {
        println!(
            "{name:<22} {:>10.1} {:>10.1} {:>10.1}",
            s.median, s.min, s.max
        )
    };
    println!(
        "{} on {} ({}, weights in {}, {} threads): {} prompt + {} generated tokens, {} runs",
        r.model, r.device, r.precision, r.weights, r.threads, r.prompt_tokens, r.gen_tokens, r.runs
    );
    println!("{:<22} {:>10} {:>10} {:>10}", "", "median", "min", "max");
    row("prefill tok/s", &r.prefill_tok_s);
    row("decode tok/s", &r.decode_tok_s);
    row("decode ms/token", &r.decode_ms_per_token);
    row("time to first token ms", &r.ttft_ms);
    println!("load time              {:>10.2} s", r.load_s);
    let mb = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.0} MiB"));
    println!("peak RSS loading       {:>10}", mb(r.peak_rss_load_mb));
    println!("peak RSS generating    {:>10}", mb(r.peak_rss_generate_mb));
    if r.device_memory_mb.is_some() {
        println!("GPU memory             {:>10}", mb(r.device_memory_mb));
    }
    if let Some(profile) = &r.dispatches {
        println!(
            "per decoded token: {:.1} kernel launches, {:.1} reads from the device",
            profile.per_token, profile.reads_per_token
        );
        for (kernel, count) in &profile.by_kernel {
            println!("  {count:>8.1}  {kernel}");
        }
    }
}
