//! The command line tested as a process, the way scripts use it.

use crate::common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{Golden, tiny_model_dir};

fn smolchat(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_smolchat"))
        .args(args)
        .output()
        .expect("the smolchat binary runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn json_stdout(output: &Output) -> serde_json::Value {
    assert!(output.status.success(), "failed: {}", stderr(output));
    serde_json::from_slice(&output.stdout).unwrap_or_else(|err| {
        panic!(
            "stdout is one JSON object ({err}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// Greedy raw generation of the reference prompt, as the golden test's `greedy_ids` were made.
fn greedy_reference_run(backend: &str, env: &[(&str, &str)]) -> Output {
    let golden = Golden::load();
    let prompt = golden.json["prompt"].as_str().expect("prompt").to_string();
    let model = tiny_model_dir();
    Command::new(env!("CARGO_BIN_EXE_smolchat"))
        .args([
            "generate",
            "--model",
            model.to_str().expect("utf-8 path"),
            "--raw",
            "--prompt",
            &prompt,
            "--temperature",
            "0",
            "--max-tokens",
            "24",
            "--backend",
            backend,
            "--json",
        ])
        .envs(env.iter().copied())
        .output()
        .expect("the smolchat binary runs")
}

fn token_ids(report: &serde_json::Value) -> Vec<u32> {
    report["token_ids"]
        .as_array()
        .expect("token_ids")
        .iter()
        .map(|v| v.as_u64().expect("id") as u32)
        .collect()
}

/// The genuine Q4_1 file and the tiny bf16 checkpoint (float weights at the default f32
/// precision) answer a chat question with the same tokens and the same log-probabilities, bit
/// for bit, on this CPU's widest kernels and on the path a CPU without AVX-512 takes
/// (`SMOLCHAT_MAX_CPU=avx2`): the integer and float products, attention and the rest sum
/// each value in one order on both. (Where the CPU has no AVX-512, both runs take that path.)
#[test]
fn the_avx2_path_answers_with_the_bits_of_the_widest_one() {
    for model in [crate::gguf::builder::real_model(), tiny_model_dir()] {
        assert_avx2_path_answers_as_the_widest(&model);
    }
}

fn assert_avx2_path_answers_as_the_widest(model: &std::path::Path) {
    let run = |env: &[(&str, &str)]| -> Vec<(u64, u64)> {
        let output = Command::new(env!("CARGO_BIN_EXE_smolchat"))
            .args(["generate", "--model", model.to_str().expect("utf-8 path")])
            .args([
                "--prompt",
                "What is the capital of France?",
                "--temperature",
                "0",
            ])
            .args(["--max-tokens", "8", "--json", "--logprobs", "1"])
            .envs(env.iter().copied())
            .output()
            .expect("the smolchat binary runs");
        let tokens = json_stdout(&output)["tokens"].clone();
        (tokens.as_array().expect("tokens").iter())
            .map(|token| {
                let logprob = token["logprob"].as_f64().expect("a log-probability");
                (token["id"].as_u64().expect("an id"), logprob.to_bits())
            })
            .collect()
    };
    let widest = run(&[]);
    assert!(
        !widest.is_empty(),
        "{}: no tokens generated",
        model.display()
    );
    assert_eq!(
        run(&[("SMOLCHAT_MAX_CPU", "avx2")]),
        widest,
        "{}: (token, log-probability bits) on the AVX2 path against the widest",
        model.display()
    );
}

#[test]
fn raw_greedy_generation_prints_the_reference_ids() {
    let golden = Golden::load();
    let report = json_stdout(&greedy_reference_run("flex", &[]));
    assert_eq!(token_ids(&report), golden.ids("greedy_ids"));
    assert_eq!(report["device"], "CPU (flex)");
    assert_eq!(report["prompt_tokens"], golden.ids("prompt_ids").len());
    assert_eq!(report["finish_reason"], "max_tokens");
    for field in ["ttft_ms", "prefill_tok_s", "decode_tok_s", "peak_rss_mb"] {
        assert!(
            report[field].as_f64().is_some_and(|v| v > 0.0),
            "{field}: {}",
            report[field]
        );
    }
    assert!(!report["text"].as_str().expect("text").is_empty());
}

#[test]
fn the_gpu_backend_prints_the_reference_ids_and_names_the_adapter() {
    let output = greedy_reference_run("gpu", &[]);
    let report = json_stdout(&output);
    assert_eq!(token_ids(&report), Golden::load().ids("greedy_ids"));
    let device = report["device"].as_str().expect("device");
    assert!(device.ends_with("(gpu)"), "device: {device}");
    assert!(
        !stderr(&output).contains("warning"),
        "stderr: {}",
        stderr(&output)
    );
}

/// Linux only: elsewhere the GPU is reached through Metal or other drivers this cannot hide.
#[cfg(target_os = "linux")]
#[test]
fn without_a_gpu_the_gpu_backend_says_so_and_runs_on_the_cpu() {
    // No Vulkan driver at all: the loader finds no adapter.
    let no_driver = "/nonexistent/vulkan_icd.json";
    let output = greedy_reference_run(
        "gpu",
        &[
            ("VK_ICD_FILENAMES", no_driver),
            ("VK_DRIVER_FILES", no_driver),
        ],
    );
    let report = json_stdout(&output);
    assert_eq!(token_ids(&report), Golden::load().ids("greedy_ids"));
    assert_eq!(report["device"], "CPU (flex)");
    let stderr = stderr(&output);
    assert!(
        stderr.contains("warning: no usable GPU") && stderr.contains("running on the CPU"),
        "stderr: {stderr}"
    );
}

#[test]
fn chat_generation_streams_text_and_is_reproducible_with_a_seed() {
    let model = tiny_model_dir();
    let run = || {
        smolchat(&[
            "generate",
            "--model",
            model.to_str().expect("utf-8 path"),
            "--prompt",
            "Hello there",
            "--system",
            "Be brief.",
            "--max-tokens",
            "12",
            "--temperature",
            "0.9",
            "--top-p",
            "0.95",
            "--top-k",
            "50",
            "--seed",
            "42",
        ])
    };
    let first = run();
    assert!(first.status.success(), "{}", stderr(&first));
    assert!(!first.stdout.is_empty());
    assert_eq!(first.stdout, run().stdout, "same seed, same text");
}

#[test]
fn invalid_sampling_values_are_named() {
    let model = tiny_model_dir();
    for (flag, value, name) in [
        ("--temperature", "-1", "temperature"),
        ("--top-p", "1.5", "top_p"),
    ] {
        let output = smolchat(&[
            "generate",
            "--model",
            model.to_str().expect("utf-8 path"),
            "--prompt",
            "x",
            flag,
            value,
        ]);
        assert!(!output.status.success());
        let message = stderr(&output);
        assert!(
            message.contains(name) && message.contains(value),
            "{message}"
        );
    }
}

/// A raw prompt is held to the context as a chat is, with the reply's room: the same rule as
/// the engine's (it used to be sent to the model unchecked).
#[test]
fn a_raw_prompt_too_long_for_the_context_is_refused_with_the_numbers() {
    let model = tiny_model_dir();
    let long = "word ".repeat(2100);
    let output = smolchat(&[
        "generate",
        "--model",
        model.to_str().expect("utf-8 path"),
        "--raw",
        "--prompt",
        &long,
        "--max-tokens",
        "16",
    ]);
    assert!(!output.status.success());
    let message = stderr(&output);
    assert!(
        message.contains("does not fit") && message.contains("context window holds 2048"),
        "{message}"
    );
}

#[test]
fn missing_model_folder_is_a_clear_error() {
    let output = smolchat(&["generate", "--model", "./no/such/folder", "--prompt", "x"]);
    assert!(!output.status.success());
    let message = stderr(&output);
    assert!(
        message.contains("./no/such/folder") && message.contains("does not exist"),
        "{message}"
    );
}

#[test]
fn hub_id_with_the_hub_unreachable_says_what_to_do() {
    let cache = tempfile::tempdir().expect("temp dir");
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_smolchat"))
        .args([
            "generate",
            "--model",
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "--prompt",
            "x",
        ])
        .env("HF_HUB_CACHE", cache.path())
        .env("HF_ENDPOINT", "http://127.0.0.1:9")
        .output()
        .expect("runs");
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(!output.status.success());
    let message = stderr(&output);
    assert!(
        message.contains("HuggingFaceTB/SmolLM2-135M-Instruct"),
        "{message}"
    );
    assert!(message.contains("HF_ENDPOINT"), "{message}");
}

#[test]
fn bench_reports_speed_memory_and_load_time_as_json() {
    let model = tiny_model_dir();
    let output = smolchat(&[
        "bench",
        "--model",
        model.to_str().expect("utf-8 path"),
        "--prompt-tokens",
        "16",
        "--gen-tokens",
        "4",
        "--runs",
        "3",
        "--json",
    ]);
    let report = json_stdout(&output);
    assert_eq!(report["runs"], 3);
    for field in [
        "prefill_tok_s",
        "decode_tok_s",
        "decode_ms_per_token",
        "ttft_ms",
    ] {
        let summary = &report[field];
        let (min, median, max) = (
            summary["min"].as_f64(),
            summary["median"].as_f64(),
            summary["max"].as_f64(),
        );
        assert!(
            min.is_some_and(|v| v > 0.0) && min <= median && median <= max,
            "{field}: {summary}"
        );
    }
    assert!(report["load_s"].as_f64().is_some_and(|v| v > 0.0));
    assert!(
        report["peak_rss_generate_mb"]
            .as_f64()
            .is_some_and(|v| v > 0.0)
    );
}

/// A decode step on the GPU is five launches per layer (the norm with q/k/v, attention, the
/// output projection, the norm with gate/up, the gate with down; past one chunk of positions
/// attention takes a second) and ten at most around them
/// (the embedding, the likeliest tokens and the row's weight), and each step reads back only
/// those. Burn's own operations took about twenty launches per layer.
#[test]
fn bench_profiles_the_gpus_launches_per_decoded_token() {
    let model = tiny_model_dir();
    let output = smolchat(&[
        "bench",
        "--model",
        model.to_str().expect("utf-8 path"),
        "--prompt-tokens",
        "8",
        "--gen-tokens",
        "4",
        "--runs",
        "1",
        "--backend",
        "gpu",
        "--profile-dispatches",
        "--json",
    ]);
    let report = json_stdout(&output);
    assert_eq!(report["backend"], "gpu", "{}", stderr(&output));
    let profile = &report["dispatches"];
    let layers = 2.0;
    let launches = profile["per_token"].as_f64().expect("launches per token");
    assert!(
        (5.0 * layers..=5.0 * layers + 10.0).contains(&launches),
        "{launches} launches per token: {profile}"
    );
    assert_eq!(profile["reads_per_token"].as_f64(), Some(1.0), "{profile}");
    let by_kernel = profile["by_kernel"].as_array().expect("kernels");
    let count = |name: &str| {
        by_kernel
            .iter()
            .find(|entry| entry[0] == name)
            .and_then(|entry| entry[1].as_f64())
    };
    assert_eq!(count("DecodeAttentionKernel"), Some(layers), "{profile}");
}

#[test]
fn random_checkpoint_writes_a_loadable_model_folder() {
    let out = tempfile::tempdir().expect("temp dir");
    let config = tiny_model_dir().join("config.json");
    let output = smolchat(&[
        "dev",
        "random-checkpoint",
        "--config",
        config.to_str().expect("utf-8 path"),
        "--out",
        out.path().to_str().expect("utf-8 path"),
        "--dtype",
        "f16",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    for file in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        assert!(out.path().join(file).is_file(), "{file} missing");
    }
    let generated = smolchat(&[
        "generate",
        "--model",
        out.path().to_str().expect("utf-8 path"),
        "--prompt",
        "hi",
        "--max-tokens",
        "3",
        "--json",
    ]);
    let report = json_stdout(&generated);
    assert!(
        report["prompt_tokens"].as_u64().is_some_and(|n| n > 0),
        "{report}"
    );
    assert!(report["token_ids"].is_array(), "{report}");
}

/// smolchat with `home` as the home folder and every model store inside it, so that a test
/// sees only the models it puts there.
fn in_home(home: &std::path::Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_smolchat"));
    command
        .env("HOME", home)
        .env("SMOLCHAT_DATA_DIR", home.join("smolchat"))
        .env("HF_HUB_CACHE", home.join("hub"))
        .env("OLLAMA_MODELS", home.join("ollama"))
        .env("LLAMA_CACHE", home.join("llama.cpp"))
        .env("XDG_DATA_HOME", home.join("data"))
        .env("XDG_CACHE_HOME", home.join("cache"));
    command
}

/// Other apps' stores, found and opened in place: the genuine GGUF file as Ollama keeps it
/// (a hash-named blob behind a manifest) and as LM Studio, llama.cpp's cache and GPT4All do,
/// beside an Ollama manifest whose blob is gone. `models list` names each with its store and
/// says why it skipped the manifest; the blob, which has no `.gguf` name, and llama.cpp's
/// copy then answer as the file itself does.
#[test]
fn models_list_finds_other_apps_models_and_each_opens() {
    let genuine = crate::gguf::builder::real_model();
    let home = tempfile::tempdir().expect("temp dir");
    let ollama = home.path().join("ollama");
    let blob = ollama.join("blobs/sha256-0123abcd");
    let lm_studio = home
        .path()
        .join(".lmstudio/models/HuggingFaceTB/SmolLM2-GGUF");
    let manifests = ollama.join("manifests/registry.ollama.ai/library");
    // `in_home` points LLAMA_CACHE and XDG_DATA_HOME inside the home folder.
    let llama_cpp = home.path().join("llama.cpp");
    let gpt4all = home.path().join("data/nomic.ai/GPT4All");
    for dir in [
        blob.parent().unwrap(),
        &lm_studio,
        &manifests.join("smollm2"),
        &manifests.join("gone"),
        &llama_cpp,
        &gpt4all,
    ] {
        std::fs::create_dir_all(dir).expect("folders");
    }
    let llama_cpp_file =
        llama_cpp.join("HuggingFaceTB_SmolLM2-135M-Instruct-GGUF_SmolLM2-135M-Instruct-Q4_1.gguf");
    for link in [
        blob.clone(),
        lm_studio.join("SmolLM2-135M-Instruct.Q4_1.gguf"),
        llama_cpp_file.clone(),
        gpt4all.join("SmolLM2-135M-Instruct-Q4_1.gguf"),
    ] {
        std::os::unix::fs::symlink(&genuine, link).expect("link");
    }
    let manifest = |digest: &str| {
        format!(
            r#"{{"schemaVersion":2,"layers":[{{"mediaType":"application/vnd.ollama.image.model","digest":"sha256:{digest}","size":1}}]}}"#
        )
    };
    std::fs::write(manifests.join("smollm2/135m"), manifest("0123abcd")).expect("manifest");
    std::fs::write(manifests.join("gone/latest"), manifest("4567")).expect("manifest");

    let run = |args: &[&str]| {
        in_home(home.path())
            .args(args)
            .env("OLLAMA_MODELS", &ollama)
            .output()
            .expect("the smolchat binary runs")
    };
    let listed = run(&["models", "list"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    let stdout = String::from_utf8_lossy(&listed.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    for (line, (name, store)) in lines.iter().zip([
        (
            "HuggingFaceTB_SmolLM2-135M-Instruct-GGUF_SmolLM2-135M-Instruct-Q4_1 ",
            "llama.cpp",
        ),
        ("SmolLM2-135M-Instruct-Q4_1 ", "GPT4All"),
        ("SmolLM2-135M-Instruct.Q4_1 ", "LM Studio"),
        ("smollm2:135m ", "Ollama"),
    ]) {
        assert!(line.starts_with(name) && line.contains(store), "{stdout}");
    }
    assert!(lines[3].ends_with("sha256-0123abcd"), "{stdout}");
    let skipped = stderr(&listed);
    assert!(
        skipped.contains("skipped: Ollama's gone:latest"),
        "{skipped}"
    );

    // `show` finds a model by the name `list` gives, and says what it is from its files.
    let shown = run(&["models", "show", "smollm2:135m"]);
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    for line in [
        "weights     Q4_1 \u{d7}210, F32 \u{d7}61, Q8_0 \u{d7}1",
        "family      LlamaForCausalLM",
        "context     8192 tokens",
        "runs here   yes",
    ] {
        assert!(
            shown.lines().any(|shown| shown == line),
            "{line:?} in\n{shown}"
        );
    }
    let vocabulary_only = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/models/llama.cpp-vocab/ggml-vocab-gpt-2.gguf");
    let refused = run(&[
        "models",
        "show",
        vocabulary_only.to_str().expect("utf-8 path"),
    ]);
    let refused = String::from_utf8_lossy(&refused.stdout).into_owned();
    assert!(
        refused.contains("runs here   no: ") && refused.contains("\"gpt2\" is not supported"),
        "{refused}"
    );

    let answer = |model: &std::path::Path| {
        let output = run(&[
            "generate",
            "--model",
            model.to_str().expect("utf-8 path"),
            "--prompt",
            "What is 2+2?",
            "--max-tokens",
            "6",
            "--temperature",
            "0",
            "--json",
        ]);
        token_ids(&json_stdout(&output))
    };
    let genuine_answer = answer(&genuine);
    assert_eq!(answer(&blob), genuine_answer);
    assert_eq!(answer(&llama_cpp_file), genuine_answer);
}

/// A model's life from the command line: `models pull` fetches it from the (fake) hub into
/// the cache, `list` shows it there, `rm` will not delete without `--yes` when no one can be
/// asked, then deletes it and the cache's repository with it; another app's model is refused
/// and stays.
#[test]
fn models_pull_list_and_rm_manage_the_cache() {
    let hub = crate::fake_hub::FakeHub::start(crate::fake_hub::Repo::fixture());
    let home = tempfile::tempdir().expect("temp dir");
    let lm_studio = home.path().join(".lmstudio/models/org/repo/other.gguf");
    std::fs::create_dir_all(lm_studio.parent().expect("parent")).expect("folders");
    std::fs::write(&lm_studio, b"GGUF\x03\0\0\0").expect("file");
    let run = |args: &[&str]| {
        in_home(home.path())
            .args(args)
            .env("HF_ENDPOINT", &hub.endpoint)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("the smolchat binary runs")
    };
    let model = crate::fake_hub::MODEL_ID;
    let pulled = run(&["models", "pull", model]);
    assert!(pulled.status.success(), "{}", stderr(&pulled));
    let listed = run(&["models", "list"]);
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert!(
        listed
            .lines()
            .any(|line| line.starts_with(model) && line.contains("Hugging Face cache")),
        "{listed}"
    );

    let unasked = run(&["models", "rm", model]);
    assert!(!unasked.status.success());
    assert!(stderr(&unasked).contains("--yes"), "{}", stderr(&unasked));
    let repository = home.path().join("hub/models--TestOrg--tiny-smollm");
    assert!(repository.is_dir(), "kept when not confirmed");

    let removed = run(&["models", "rm", model, "--yes"]);
    assert!(removed.status.success(), "{}", stderr(&removed));
    let said = String::from_utf8_lossy(&removed.stdout).into_owned();
    assert!(said.contains(&repository.display().to_string()), "{said}");
    assert!(said.contains("freed"), "{said}");
    assert!(!repository.exists());
    let listed = run(&["models", "list"]);
    assert!(
        !String::from_utf8_lossy(&listed.stdout).contains(model),
        "gone from the list"
    );

    let refused = run(&["models", "rm", "other", "--yes"]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("belongs to LM Studio"),
        "{}",
        stderr(&refused)
    );
    assert!(lm_studio.is_file());
}

/// Looking on the (fake) hub: `models search` lists the matching repositories, most
/// downloaded first, with their formats; `models files` lists a repository's files with
/// their sizes and each GGUF file's quantization, marking what fits here.
#[test]
fn models_search_and_files_look_on_the_hub() {
    let hub = crate::fake_hub::FakeHub::start(crate::fake_hub::Repo::gguf_files());
    let home = tempfile::tempdir().expect("temp dir");
    let run = |args: &[&str]| {
        let output = in_home(home.path())
            .args(args)
            .env("HF_ENDPOINT", &hub.endpoint)
            .output()
            .expect("the smolchat binary runs");
        assert!(output.status.success(), "{}", stderr(&output));
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let found = run(&["models", "search", "tiny smollm"]);
    assert_eq!(
        found.lines().count(),
        0,
        "no id holds both words as one: {found}"
    );
    let found = run(&["models", "search", "Tiny-SmolLM"]);
    let lines: Vec<&str> = found.lines().collect();
    assert_eq!(lines.len(), 2, "{found}");
    assert!(lines[0].starts_with("TestOrg/tiny-smollm "), "{found}");
    assert!(
        lines[0].contains("1200 downloads") && lines[0].ends_with("safetensors"),
        "{found}"
    );
    assert!(lines[1].starts_with("TestOrg/tiny-smollm-GGUF ") && lines[1].ends_with("gguf"));
    let limited = run(&["models", "search", "tiny", "--limit", "1"]);
    assert_eq!(limited.lines().count(), 1, "{limited}");

    let files = run(&["models", "files", crate::fake_hub::MODEL_ID]);
    let q4 = files
        .lines()
        .find(|line| line.starts_with("tiny-smollm-Q4_K_M.gguf"))
        .unwrap_or_else(|| panic!("{files}"));
    assert!(
        q4.contains("300 KB") && q4.contains("Q4_K_M") && q4.ends_with("fits"),
        "{q4}"
    );
    let readme = files
        .lines()
        .find(|line| line.starts_with("README.md"))
        .unwrap_or_else(|| panic!("{files}"));
    assert!(!readme.contains("fits"), "{readme}");
}
