//! The download manager against the fake hub: downloads run one after another, pause and go
//! on from their bytes, go on after a restart, and a cancelled one leaves nothing behind.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::fake_hub::{FakeHub, MODEL_ID, Repo};
use smolchat::downloads::{Download, DownloadState, Downloads};
use smolchat::hub::{HubCache, HubOptions, Retries, Timeouts};

const Q8: &str = "tiny-smollm-Q8_0.gguf";
const Q4: &str = "tiny-smollm-Q4_K_M.gguf";

/// A manager's folders, both temporary: the Hugging Face cache, and the one holding its list
/// of downloads (`file`).
struct Folders {
    cache: TempDir,
    _data: TempDir,
    file: PathBuf,
}

impl Folders {
    fn new() -> Self {
        let data = tempfile::tempdir().unwrap();
        Self {
            cache: tempfile::tempdir().unwrap(),
            file: data.path().join("downloads.json"),
            _data: data,
        }
    }

    /// A manager on `hub` with these folders, as the app starts one.
    fn start(&self, hub: &FakeHub) -> Downloads {
        Downloads::start(options(hub, self.cache.path()), Some(self.file.clone()))
    }

    /// What is kept of the downloads for the next start.
    fn saved(&self) -> String {
        std::fs::read_to_string(&self.file).unwrap()
    }
}

fn options(hub: &FakeHub, cache: &Path) -> Option<HubOptions> {
    Some(HubOptions {
        endpoint: hub.endpoint.clone(),
        cache: HubCache::new(cache),
        revision: "main".to_string(),
        timeouts: Timeouts {
            connect: Duration::from_secs(2),
            read: Duration::from_secs(5),
        },
        retries: Retries {
            attempts: 3,
            first_wait: Duration::from_millis(20),
        },
    })
}

/// The two GGUF files, sent slowly enough (about 0.6 s for Q8_0) to be caught half-way.
fn slow_repo() -> Repo {
    Repo {
        redirect_lfs: true,
        slow: Some(Duration::from_millis(10)),
        ..Repo::gguf_files()
    }
}

fn spec(file: &str) -> String {
    let quant = file
        .trim_start_matches("tiny-smollm-")
        .trim_end_matches(".gguf");
    format!("{MODEL_ID}:{quant}")
}

fn state(downloads: &Downloads, id: u64) -> Option<DownloadState> {
    downloads
        .list()
        .iter()
        .find(|download| download.id == id)
        .map(|download| download.state.clone())
}

/// Polls until `done` holds (30 s at most); returns the downloads completed meanwhile.
fn wait_until(downloads: &mut Downloads, done: impl Fn(&Downloads) -> bool) -> Vec<Download> {
    let started = Instant::now();
    let mut completed = Vec::new();
    loop {
        completed.extend(downloads.poll());
        if done(downloads) {
            return completed;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "waited 30 s: {:?}",
            downloads.list()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Running with some bytes received, and not all of them.
fn half_way(downloads: &Downloads, id: u64) -> bool {
    matches!(state(downloads, id), Some(DownloadState::Running(Some(progress)))
        if progress.bytes_done > 0 && progress.fraction().is_some_and(|done| done < 1.0))
}

fn partial_files(cache: &Path) -> Vec<PathBuf> {
    let blobs = cache.join("models--TestOrg--tiny-smollm").join("blobs");
    std::fs::read_dir(blobs)
        .map(|entries| {
            entries
                .flatten()
                .map(|entry| entry.path())
                .filter(|path| path.extension().is_some_and(|ext| ext == "incomplete"))
                .collect()
        })
        .unwrap_or_default()
}

/// The starts of the ranges asked for `file`, 0 for a request from the beginning.
fn range_starts(hub: &FakeHub, file: &str) -> Vec<u64> {
    hub.gets()
        .into_iter()
        .filter(|seen| seen.path.ends_with(file))
        .map(|seen| {
            seen.range
                .and_then(|range| {
                    range
                        .trim_start_matches("bytes=")
                        .trim_end_matches('-')
                        .parse()
                        .ok()
                })
                .unwrap_or(0)
        })
        .collect()
}

fn done_path(downloads: &Downloads, id: u64) -> PathBuf {
    match state(downloads, id) {
        Some(DownloadState::Done(path)) => path,
        other => panic!("download {id} is {other:?}"),
    }
}

#[test]
fn downloads_run_in_turn_and_a_paused_one_goes_on_from_its_bytes() {
    let hub = FakeHub::start(slow_repo());
    let folders = Folders::new();
    let mut downloads = folders.start(&hub);
    let q8 = downloads.add(&spec(Q8));
    let q4 = downloads.add(&spec(Q4));
    assert_eq!(state(&downloads, q4), Some(DownloadState::Queued));
    assert_eq!(
        downloads.add(&spec(Q4)),
        q4,
        "the same model is not queued twice"
    );

    wait_until(&mut downloads, |d| half_way(d, q8));
    assert!(downloads.pause(q8));
    wait_until(&mut downloads, |d| {
        matches!(state(d, q8), Some(DownloadState::Paused(Some(_))))
    });
    assert_eq!(
        partial_files(folders.cache.path()).len(),
        1,
        "the paused part is kept"
    );
    // The next in the queue runs as soon as the first is paused.
    let completed = wait_until(&mut downloads, |d| {
        matches!(state(d, q4), Some(DownloadState::Done(_)))
    });
    assert_eq!(completed.iter().map(|d| d.id).collect::<Vec<_>>(), [q4]);
    let q4_path = done_path(&downloads, q4);
    assert_eq!(
        std::fs::read(&q4_path).unwrap(),
        Repo::gguf_files().files[Q4]
    );
    let saved = folders.saved();
    assert!(
        saved.contains("Q8_0") && !saved.contains("Q4_K_M"),
        "{saved}"
    );

    hub.clear_log();
    assert!(downloads.resume(q8));
    wait_until(&mut downloads, |d| {
        matches!(state(d, q8), Some(DownloadState::Done(_)))
    });
    let q8_path = done_path(&downloads, q8);
    assert_eq!(
        std::fs::read(&q8_path).unwrap(),
        Repo::gguf_files().files[Q8]
    );
    let starts = range_starts(&hub, Q8);
    assert!(
        !starts.is_empty() && starts.iter().all(|&start| start > 0),
        "resumed from its bytes: {starts:?}"
    );
    assert!(partial_files(folders.cache.path()).is_empty());
    assert!(!folders.saved().contains("tiny-smollm"));

    // A finished download leaves the list; the model stays on disk.
    assert!(downloads.cancel(q4));
    assert_eq!(state(&downloads, q4), None);
    assert!(q4_path.is_file());
}

#[test]
fn an_unfinished_download_goes_on_after_a_restart() {
    let hub = FakeHub::start(slow_repo());
    let folders = Folders::new();
    let mut downloads = folders.start(&hub);
    let q8 = downloads.add(&spec(Q8));
    let paused = downloads.add(&spec(Q4));
    assert!(downloads.pause(paused));
    wait_until(&mut downloads, |d| half_way(d, q8));
    // The app closes mid-download; its thread stops at the next piece.
    drop(downloads);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(partial_files(folders.cache.path()).len(), 1);

    hub.clear_log();
    let mut downloads = folders.start(&hub);
    let [running, waiting] = downloads.list() else {
        panic!("{:?}", downloads.list());
    };
    assert_eq!(running.spec, spec(Q8));
    assert_eq!(running.state, DownloadState::Running(None));
    assert_eq!(waiting.spec, spec(Q4));
    assert_eq!(
        waiting.state,
        DownloadState::Paused(None),
        "paused stays paused"
    );
    let id = running.id;
    wait_until(&mut downloads, |d| {
        matches!(state(d, id), Some(DownloadState::Done(_)))
    });
    let path = done_path(&downloads, id);
    assert_eq!(std::fs::read(path).unwrap(), Repo::gguf_files().files[Q8]);
    let starts = range_starts(&hub, Q8);
    assert!(
        !starts.is_empty() && starts.iter().all(|&start| start > 0),
        "went on from its bytes: {starts:?}"
    );
}

#[test]
fn a_cancelled_download_leaves_nothing_and_a_failed_one_says_why() {
    let hub = FakeHub::start(Repo {
        // The connection drops once a fifth of the way in: resumed by itself.
        cut_gets: Some((Q4.to_string(), 60_000, 1)),
        ..slow_repo()
    });
    let folders = Folders::new();
    let mut downloads = folders.start(&hub);
    let q8 = downloads.add(&spec(Q8));
    let queued = downloads.add(&spec(Q4));
    assert!(
        downloads.cancel(queued),
        "a queued download is taken off at once"
    );
    assert_eq!(state(&downloads, queued), None);

    wait_until(&mut downloads, |d| half_way(d, q8));
    assert!(downloads.cancel(q8));
    assert!(downloads.list().is_empty(), "off the list at once");
    wait_until(&mut downloads, |d| !d.busy());
    assert!(
        partial_files(folders.cache.path()).is_empty(),
        "its part is deleted"
    );
    assert!(!folders.saved().contains("tiny-smollm"));

    let missing = downloads.add(&format!("{MODEL_ID}:Q5_K_M"));
    wait_until(&mut downloads, |d| {
        matches!(state(d, missing), Some(DownloadState::Failed(_)))
    });
    let Some(DownloadState::Failed(reason)) = state(&downloads, missing) else {
        unreachable!()
    };
    assert!(reason.contains("no .gguf file for Q5_K_M"), "{reason}");

    hub.clear_log();
    let q4 = downloads.add(&spec(Q4));
    wait_until(&mut downloads, |d| {
        matches!(state(d, q4), Some(DownloadState::Done(_)))
    });
    assert_eq!(
        std::fs::read(done_path(&downloads, q4)).unwrap(),
        Repo::gguf_files().files[Q4]
    );
    assert_eq!(
        range_starts(&hub, Q4),
        [0, 60_000],
        "the dropped connection went on"
    );
}
