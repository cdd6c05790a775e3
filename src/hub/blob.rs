//! Fetching one blob: resumable, cancellable, verified before it becomes
//! visible under its final name.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use ureq::Agent;

use super::error::HubError;
use super::http::{self, FileMetadata, Retries};
use super::progress::{DownloadProgress, ProgressTracker, Reconnecting};

const CHUNK: usize = 64 * 1024;

/// The extension of a blob still growing, as `huggingface_hub` names it too.
pub(crate) const INCOMPLETE: &str = "incomplete";

/// Where a blob grows until it is complete and verified; model loaders
/// never look at this name.
pub(crate) fn incomplete_path(blob: &Path) -> PathBuf {
    let mut name = blob.as_os_str().to_owned();
    name.push(".");
    name.push(INCOMPLETE);
    PathBuf::from(name)
}

/// Everything one blob download needs besides the network client.
pub(crate) struct BlobRequest<'a> {
    pub file: &'a str,
    pub meta: &'a FileMetadata,
    pub blob: &'a Path,
}

/// Downloads into `{blob}.incomplete`, continuing a previous attempt with a
/// range request, then checks size and sha256 and renames into place. A
/// transfer that breaks is resumed by itself as `retries` allows, each wait
/// reported as [`Reconnecting`].
pub(crate) fn download_blob(
    agent: &Agent,
    request: &BlobRequest<'_>,
    retries: Retries,
    tracker: &mut ProgressTracker,
    progress: &mut dyn FnMut(DownloadProgress),
    cancel: &AtomicBool,
) -> Result<(), HubError> {
    let partial = incomplete_path(request.blob);
    if let Some(parent) = partial.parent() {
        fs::create_dir_all(parent).map_err(|e| HubError::io("cannot create", parent, e))?;
    }
    let mut have = fs::metadata(&partial).map(|m| m.len()).unwrap_or(0);
    if request.meta.size.is_some_and(|size| have > size) {
        have = 0;
    }
    tracker.restart_at(have);
    tracker.update(have, true, progress);
    let mut fruitless = 0;
    while request.meta.size != Some(have) || have == 0 {
        let before = have;
        let error = match receive(agent, request, &partial, have, tracker, progress, cancel) {
            Ok(done) if request.meta.size.is_none_or(|size| done == size) => {
                have = done;
                break;
            }
            Ok(done) => HubError::Network {
                url: request.meta.download_url.clone(),
                reason: format!(
                    "the connection closed after {done} of {} bytes",
                    request.meta.size.unwrap_or_default()
                ),
            },
            Err(error) if error.is_transient() => error,
            Err(error) => return Err(error),
        };
        // What reached the disk before the break is kept and resumed from.
        have = fs::metadata(&partial).map_or(0, |meta| meta.len());
        fruitless = if have > before { 1 } else { fruitless + 1 };
        if fruitless >= retries.attempts {
            return Err(error);
        }
        let after = retries.wait_before(fruitless + 1);
        let status = Reconnecting {
            attempt: fruitless + 1,
            attempts: retries.attempts,
            after,
            reason: error.to_string(),
        };
        tracker.reconnecting(status, progress);
        wait_unless_cancelled(after, cancel, request.file)?;
        tracker.restart_at(have);
    }
    tracker.update(have, true, progress);
    verify(request, &partial, have)?;
    fs::rename(&partial, request.blob)
        .map_err(|e| HubError::io("cannot move into place", request.blob, e))
}

/// Streams the missing bytes into `partial`; returns its final length.
fn receive(
    agent: &Agent,
    request: &BlobRequest<'_>,
    partial: &Path,
    have: u64,
    tracker: &mut ProgressTracker,
    progress: &mut dyn FnMut(DownloadProgress),
    cancel: &AtomicBool,
) -> Result<u64, HubError> {
    let url = &request.meta.download_url;
    let mut response = http::get(agent, url, (have > 0).then_some(have))?;
    let mut start = have;
    match response.status().as_u16() {
        206 if content_range_start(&response) == Some(have) => {}
        // The server ignored or rejected the range: start over with the
        // whole file rather than append to bytes we cannot trust.
        200 => start = 0,
        206 | 416 => {
            response = http::get(agent, url, None)?;
            start = 0;
        }
        status => {
            return Err(HubError::Http {
                url: url.clone(),
                status,
            });
        }
    }
    if response.status().as_u16() != 200 && start == 0 {
        return Err(HubError::Http {
            url: url.clone(),
            status: response.status().as_u16(),
        });
    }
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(partial)
        .map_err(|e| HubError::io("cannot open", partial, e))?;
    if start == 0 {
        file.set_len(0)
            .map_err(|e| HubError::io("cannot truncate", partial, e))?;
        tracker.restart_at(0);
    }
    let mut reader = response.body_mut().as_reader();
    let mut buffer = vec![0u8; CHUNK];
    let mut done = start;
    loop {
        if cancel.load(Ordering::Relaxed) {
            return Err(HubError::Cancelled {
                file: request.file.to_string(),
            });
        }
        let n = match reader.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(HubError::Network {
                    url: url.clone(),
                    reason: e.to_string(),
                });
            }
        };
        file.write_all(&buffer[..n])
            .map_err(|e| HubError::io("cannot write", partial, e))?;
        done += n as u64;
        tracker.update(done, false, progress);
    }
    file.flush()
        .map_err(|e| HubError::io("cannot write", partial, e))?;
    Ok(done)
}

fn wait_unless_cancelled(wait: Duration, cancel: &AtomicBool, file: &str) -> Result<(), HubError> {
    let until = Instant::now() + wait;
    while Instant::now() < until {
        if cancel.load(Ordering::Relaxed) {
            return Err(HubError::Cancelled {
                file: file.to_string(),
            });
        }
        std::thread::sleep(Duration::from_millis(20).min(until - Instant::now()));
    }
    Ok(())
}

fn content_range_start(response: &ureq::http::Response<ureq::Body>) -> Option<u64> {
    let value = http::header(response.headers(), "content-range")?;
    let range = value.trim().strip_prefix("bytes ")?;
    range.split('-').next()?.trim().parse().ok()
}

/// Deletes the partial file on any mismatch so the next attempt starts
/// clean instead of resuming corrupt bytes.
fn verify(request: &BlobRequest<'_>, partial: &Path, have: u64) -> Result<(), HubError> {
    let discard = |error: HubError| {
        // The error being returned matters more than a failed cleanup.
        let _ = fs::remove_file(partial);
        Err(error)
    };
    if let Some(expected) = request.meta.size
        && expected != have
    {
        return discard(HubError::SizeMismatch {
            file: request.file.to_string(),
            expected,
            found: have,
        });
    }
    if let Some(expected) = request.meta.expected_sha256() {
        let found = sha256_file(partial)?;
        if !found.eq_ignore_ascii_case(expected) {
            return discard(HubError::ChecksumMismatch {
                file: request.file.to_string(),
                expected: expected.to_string(),
                found,
            });
        }
    }
    Ok(())
}

pub(crate) fn sha256_file(path: &Path) -> Result<String, HubError> {
    let mut file = File::open(path).map_err(|e| HubError::io("cannot open", path, e))?;
    let mut hasher = Sha256::new();
    io::copy(&mut file, &mut hasher).map_err(|e| HubError::io("cannot read", path, e))?;
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}
