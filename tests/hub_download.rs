use crate::fake_hub;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use fake_hub::{COMMIT, FakeHub, MODEL_ID, Repo, fixture, sha256_hex};
use smolchat::hub::{
    DownloadProgress, HubCache, HubError, HubOptions, ModelDownloader, Retries, Timeouts,
    resolve_cache_dir, resolve_endpoint,
};

fn downloader(endpoint: &str, cache: &Path, read_timeout: Duration) -> ModelDownloader {
    ModelDownloader::new(HubOptions {
        endpoint: endpoint.to_string(),
        cache: HubCache::new(cache),
        revision: "main".to_string(),
        timeouts: Timeouts {
            connect: Duration::from_secs(2),
            read: read_timeout,
        },
        retries: Retries {
            attempts: 3,
            first_wait: Duration::from_millis(20),
        },
    })
}

fn fetch(dl: &ModelDownloader) -> (Result<PathBuf, HubError>, Vec<DownloadProgress>) {
    let mut seen = Vec::new();
    let result = dl.ensure_model(MODEL_ID, &mut |p| seen.push(p), &AtomicBool::new(false));
    (result, seen)
}

fn repo_dir(cache: &Path) -> PathBuf {
    cache.join("models--TestOrg--tiny-smollm")
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn first_download_fills_the_standard_cache_layout() {
    let hub = FakeHub::start(Repo {
        redirect_lfs: true,
        ..Repo::fixture()
    });
    let cache = tempfile::tempdir().unwrap();
    let (result, progress) = fetch(&downloader(
        &hub.endpoint,
        cache.path(),
        Duration::from_secs(5),
    ));
    let dir = result.unwrap();
    let loaded = smolchat::generation::LoadedModel::load(&dir, Default::default())
        .expect("the downloaded snapshot loads as a model");
    assert_eq!(loaded.model.config().num_hidden_layers, 2);

    let repo = repo_dir(cache.path());
    assert_eq!(dir, repo.join("snapshots").join(COMMIT));
    assert_eq!(
        std::fs::read_to_string(repo.join("refs/main")).unwrap(),
        COMMIT
    );
    for (file, content) in &Repo::fixture().files {
        assert_eq!(&std::fs::read(dir.join(file)).unwrap(), content, "{file}");
    }
    let weights_sha = sha256_hex(&fixture("model.safetensors"));
    assert!(repo.join("blobs").join(&weights_sha).is_file());
    #[cfg(unix)]
    assert_eq!(
        std::fs::read_link(dir.join("model.safetensors")).unwrap(),
        Path::new("../../blobs").join(&weights_sha)
    );
    assert_eq!(files_in(&repo.join("blobs")).len(), 6);
    assert!(
        files_in(&repo.join("blobs"))
            .iter()
            .all(|f| !f.ends_with(".incomplete"))
    );

    let last = progress
        .iter()
        .rfind(|p| p.file == "model.safetensors")
        .unwrap();
    assert_eq!(
        last.bytes_total,
        Some(fixture("model.safetensors").len() as u64)
    );
    assert_eq!(last.bytes_done, last.bytes_total.unwrap());
    assert_eq!(last.file_count, 6);
    assert!(
        hub.gets()
            .iter()
            .any(|r| r.path == "/cdn/model.safetensors")
    );
}

#[test]
fn second_run_uses_the_cache_without_any_request_even_offline() {
    let hub = FakeHub::start(Repo::fixture());
    let cache = tempfile::tempdir().unwrap();
    let dl = downloader(&hub.endpoint, cache.path(), Duration::from_secs(5));
    let first = fetch(&dl).0.unwrap();
    assert_eq!(hub.gets().len(), 6);
    hub.clear_log();

    let (second, progress) = fetch(&dl);
    assert_eq!(second.unwrap(), first);
    assert!(hub.requests().is_empty());
    assert!(progress.is_empty());

    let offline = downloader(
        &closed_port_endpoint(),
        cache.path(),
        Duration::from_secs(1),
    );
    assert_eq!(offline.cached_model_dir(MODEL_ID), Some(first.clone()));
    assert_eq!(fetch(&offline).0.unwrap(), first);
}

#[test]
fn only_files_missing_from_cache_are_downloaded() {
    let hub = FakeHub::start(Repo::fixture());
    let cache = tempfile::tempdir().unwrap();
    let dl = downloader(&hub.endpoint, cache.path(), Duration::from_secs(5));
    let dir = fetch(&dl).0.unwrap();
    // config.json loses its snapshot entry but keeps its blob;
    // tokenizer_config.json loses both.
    std::fs::remove_file(dir.join("config.json")).unwrap();
    let blob = std::fs::canonicalize(dir.join("tokenizer_config.json")).unwrap();
    std::fs::remove_file(dir.join("tokenizer_config.json")).unwrap();
    std::fs::remove_file(blob).unwrap();
    hub.clear_log();

    fetch(&dl).0.unwrap();
    let gets: Vec<String> = hub.gets().into_iter().map(|r| r.path).collect();
    assert_eq!(
        gets,
        vec![format!(
            "/{MODEL_ID}/resolve/{COMMIT}/tokenizer_config.json"
        )]
    );
    for file in ["config.json", "tokenizer_config.json"] {
        assert_eq!(
            std::fs::read(dir.join(file)).unwrap(),
            fixture(file),
            "{file}"
        );
    }
}

#[test]
fn a_dropped_connection_reconnects_by_itself_and_resumes() {
    const CUT: usize = 1_000_000;
    let hub = FakeHub::start(Repo {
        cut_gets: Some(("model.safetensors".into(), CUT, 1)),
        redirect_lfs: true,
        ..Repo::fixture()
    });
    let cache = tempfile::tempdir().unwrap();
    let dl = downloader(&hub.endpoint, cache.path(), Duration::from_secs(5));

    let (dir, seen) = fetch(&dl);
    let dir = dir.unwrap();
    let resumed: Vec<_> = hub
        .gets()
        .into_iter()
        .filter(|r| r.path.ends_with("model.safetensors"))
        .collect();
    assert_eq!(resumed.len(), 2, "one cut, one resume");
    assert_eq!(
        resumed.last().unwrap().range.as_deref(),
        Some("bytes=1000000-")
    );
    let weights_sha = sha256_hex(&fixture("model.safetensors"));
    let content = std::fs::read(dir.join("model.safetensors")).unwrap();
    assert_eq!(sha256_hex(&content), weights_sha);
    let reconnect = seen
        .iter()
        .find_map(|p| p.reconnecting.clone())
        .expect("the reconnect was reported");
    assert_eq!((reconnect.attempt, reconnect.attempts), (2, 3));
    let line = smolchat::hub::render_progress_line(
        seen.iter().find(|p| p.reconnecting.is_some()).unwrap(),
        10,
    );
    assert!(
        line.contains("reconnecting in 1 s (attempt 2 of 3)"),
        "{line}"
    );
}

#[test]
fn a_connection_that_keeps_dropping_gives_up_and_a_rerun_resumes() {
    const CUT: usize = 0;
    let hub = FakeHub::start(Repo {
        cut_gets: Some(("model.safetensors".into(), CUT, 3)),
        redirect_lfs: true,
        ..Repo::fixture()
    });
    let cache = tempfile::tempdir().unwrap();
    let dl = downloader(&hub.endpoint, cache.path(), Duration::from_secs(5));

    let (result, seen) = fetch(&dl);
    let error = result.unwrap_err();
    assert!(matches!(error, HubError::Network { .. }), "{error}");
    let weights = hub
        .gets()
        .into_iter()
        .filter(|r| r.path.ends_with("model.safetensors"))
        .count();
    assert_eq!(
        weights, 3,
        "three tries that received nothing, then the error"
    );
    assert_eq!(seen.iter().filter(|p| p.reconnecting.is_some()).count(), 2);
    assert!(dl.cached_model_dir(MODEL_ID).is_none());

    // The server is back: a second run completes.
    let dir = fetch(&dl).0.unwrap();
    let content = std::fs::read(dir.join("model.safetensors")).unwrap();
    assert_eq!(
        sha256_hex(&content),
        sha256_hex(&fixture("model.safetensors"))
    );
}

#[test]
fn corrupted_download_is_rejected_and_removed() {
    let hub = FakeHub::start(Repo {
        corrupt: Some("model.safetensors".into()),
        ..Repo::fixture()
    });
    let cache = tempfile::tempdir().unwrap();
    let dl = downloader(&hub.endpoint, cache.path(), Duration::from_secs(5));

    let error = fetch(&dl).0.unwrap_err();
    let expected = sha256_hex(&fixture("model.safetensors"));
    match &error {
        HubError::ChecksumMismatch {
            file,
            expected: want,
            found,
        } => {
            assert_eq!(file, "model.safetensors");
            assert_eq!(want, &expected);
            assert_ne!(found, &expected);
        }
        other => panic!("expected a checksum mismatch, got {other}"),
    }
    assert!(error.to_string().contains("model.safetensors"));
    let repo = repo_dir(cache.path());
    assert!(
        !repo
            .join("snapshots")
            .join(COMMIT)
            .join("model.safetensors")
            .exists()
    );
    assert!(
        files_in(&repo.join("blobs"))
            .iter()
            .all(|f| !f.starts_with(&expected))
    );
    assert!(dl.cached_model_dir(MODEL_ID).is_none());
}

fn closed_port_endpoint() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

fn assert_offline_message(error: &HubError, cache: &Path, endpoint: &str) {
    assert!(matches!(error, HubError::Offline { .. }), "{error}");
    let message = error.to_string();
    for needle in [
        MODEL_ID,
        &repo_dir(cache).display().to_string(),
        endpoint,
        "local model folder",
        "HF_ENDPOINT",
    ] {
        assert!(
            message.contains(needle),
            "`{needle}` missing from: {message}"
        );
    }
}

#[test]
fn refused_connection_explains_how_to_go_on() {
    let cache = tempfile::tempdir().unwrap();
    let endpoint = closed_port_endpoint();
    let started = Instant::now();
    let error = fetch(&downloader(&endpoint, cache.path(), Duration::from_secs(1)))
        .0
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_offline_message(&error, cache.path(), &endpoint);
}

#[test]
fn silent_server_times_out_instead_of_hanging() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        // Accept and hold connections open without ever answering.
        let held: Vec<_> = listener.incoming().take(4).collect();
        std::thread::sleep(Duration::from_secs(30));
        drop(held);
    });
    let cache = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let error = fetch(&downloader(&endpoint, cache.path(), Duration::from_secs(1)))
        .0
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_offline_message(&error, cache.path(), &endpoint);
}

#[test]
fn cache_and_endpoint_follow_hugging_face_variables() {
    let home = Path::new("/home/u");
    assert_eq!(
        resolve_cache_dir(None, None, Some(home)),
        Some(PathBuf::from("/home/u/.cache/huggingface/hub"))
    );
    assert_eq!(
        resolve_cache_dir(None, Some("/data/hf"), Some(home)),
        Some(PathBuf::from("/data/hf/hub"))
    );
    assert_eq!(
        resolve_cache_dir(Some("/fast/hub"), Some("/data/hf"), Some(home)),
        Some(PathBuf::from("/fast/hub"))
    );
    assert_eq!(
        resolve_cache_dir(Some(""), None, Some(home)),
        Some(PathBuf::from("/home/u/.cache/huggingface/hub"))
    );
    assert_eq!(resolve_cache_dir(None, None, None), None);
    assert_eq!(resolve_endpoint(None), "https://huggingface.co");
    assert_eq!(resolve_endpoint(Some("")), "https://huggingface.co");
    assert_eq!(
        resolve_endpoint(Some("https://hf-mirror.com/")),
        "https://hf-mirror.com"
    );
}

#[test]
fn sharded_checkpoint_is_fetched_completely() {
    let mut repo = Repo::fixture();
    let weights = repo.files.remove("model.safetensors").unwrap();
    let (a, b) = weights.split_at(weights.len() / 2);
    let index = serde_json::json!({
        "metadata": {"total_size": weights.len()},
        "weight_map": {
            "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
            "model.norm.weight": "model-00002-of-00002.safetensors",
            "lm_head.weight": "model-00002-of-00002.safetensors",
        }
    });
    repo.files.insert(
        "model.safetensors.index.json".into(),
        index.to_string().into_bytes(),
    );
    repo.files
        .insert("model-00001-of-00002.safetensors".into(), a.to_vec());
    repo.files
        .insert("model-00002-of-00002.safetensors".into(), b.to_vec());
    repo.lfs.insert("model-00001-of-00002.safetensors".into());
    repo.lfs.insert("model-00002-of-00002.safetensors".into());
    repo.redirect_lfs = true;
    let hub = FakeHub::start(repo.clone());
    let cache = tempfile::tempdir().unwrap();
    let dl = downloader(&hub.endpoint, cache.path(), Duration::from_secs(5));

    let dir = fetch(&dl).0.unwrap();
    for (file, content) in &repo.files {
        assert_eq!(&std::fs::read(dir.join(file)).unwrap(), content, "{file}");
    }
    assert!(!dir.join("model.safetensors").exists());
    hub.clear_log();
    assert_eq!(fetch(&dl).0.unwrap(), dir);
    assert!(hub.requests().is_empty());
}

#[test]
fn missing_optional_files_are_fine_and_remembered() {
    let mut repo = Repo::fixture();
    repo.files.remove("generation_config.json");
    repo.files.remove("special_tokens_map.json");
    let hub = FakeHub::start(repo);
    let cache = tempfile::tempdir().unwrap();
    let dl = downloader(&hub.endpoint, cache.path(), Duration::from_secs(5));

    let dir = fetch(&dl).0.unwrap();
    assert!(dir.join("config.json").is_file());
    assert!(!dir.join("generation_config.json").exists());
    assert!(
        repo_dir(cache.path())
            .join(".no_exist")
            .join(COMMIT)
            .join("generation_config.json")
            .is_file()
    );
    hub.clear_log();
    assert_eq!(fetch(&dl).0.unwrap(), dir);
    assert!(hub.requests().is_empty());
}

#[test]
fn missing_required_file_is_a_clear_error() {
    let mut repo = Repo::fixture();
    repo.files.remove("tokenizer.json");
    let hub = FakeHub::start(repo);
    let cache = tempfile::tempdir().unwrap();
    let error = fetch(&downloader(
        &hub.endpoint,
        cache.path(),
        Duration::from_secs(5),
    ))
    .0
    .unwrap_err();
    assert!(
        matches!(error, HubError::MissingFile { ref file, .. } if file == "tokenizer.json"),
        "{error}"
    );
    let message = error.to_string();
    assert!(
        message.contains("tokenizer.json") && message.contains(MODEL_ID),
        "{message}"
    );
    assert!(!repo_dir(cache.path()).join("refs/main").exists());
}

#[test]
fn cancelled_download_stops_and_leaves_nothing_loadable() {
    let hub = FakeHub::start(Repo::fixture());
    let cache = tempfile::tempdir().unwrap();
    let dl = downloader(&hub.endpoint, cache.path(), Duration::from_secs(5));
    let cancel = AtomicBool::new(true);
    let error = dl.ensure_model(MODEL_ID, &mut |_| {}, &cancel).unwrap_err();
    assert!(matches!(error, HubError::Cancelled { .. }), "{error}");
    assert!(dl.cached_model_dir(MODEL_ID).is_none());
    assert!(hub.gets().is_empty());
}

#[test]
fn a_quantization_picks_one_gguf_file_and_downloads_only_it() {
    let hub = FakeHub::start(Repo {
        redirect_lfs: true,
        ..Repo::gguf_files()
    });
    let cache = tempfile::tempdir().unwrap();
    let dl = downloader(&hub.endpoint, cache.path(), Duration::from_secs(5));
    let never = AtomicBool::new(false);

    let file = dl
        .ensure_gguf(MODEL_ID, "q4_k_m", &mut |_| {}, &never)
        .unwrap();
    assert_eq!(
        file,
        repo_dir(cache.path())
            .join("snapshots")
            .join(COMMIT)
            .join("tiny-smollm-Q4_K_M.gguf")
    );
    assert_eq!(
        std::fs::read(&file).unwrap(),
        Repo::gguf_files().files["tiny-smollm-Q4_K_M.gguf"]
    );
    let fetched: Vec<String> = hub.gets().into_iter().map(|r| r.path).collect();
    assert!(
        fetched.iter().all(|path| !path.contains("Q8_0")),
        "{fetched:?}"
    );

    hub.clear_log();
    let again = dl
        .ensure_gguf(MODEL_ID, "Q4_K_M", &mut |_| {}, &never)
        .unwrap();
    assert_eq!(again, file);
    assert!(hub.requests().is_empty(), "the cached file is used offline");

    let error = dl
        .ensure_gguf(MODEL_ID, "Q5_K_M", &mut |_| {}, &never)
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "TestOrg/tiny-smollm has no .gguf file for Q5_K_M; it has Q4_K_M, Q8_0"
    );
}
