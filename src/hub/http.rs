//! Minimal hub HTTP protocol: metadata from a `HEAD` on the resolve URL and
//! redirects handled by hand, because the headers that matter
//! (`x-repo-commit`, `x-linked-etag`) are on the redirect itself.

use std::time::Duration;

use ureq::Agent;
use ureq::http::{HeaderMap, Response};

use super::error::HubError;

const MAX_REDIRECTS: usize = 10;

/// Network time limits; a slow or silent server must never hang the app.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    pub connect: Duration,
    /// Longest wait for any single read, so a stalled transfer fails while
    /// a slow but moving one goes on.
    pub read: Duration,
}

/// How a broken transfer is retried: up to `attempts` tries in a row that receive nothing,
/// waiting `first_wait`, then twice as long before each next one. Any try that receives bytes
/// starts the count again, so a slow, flaky line still finishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retries {
    pub attempts: usize,
    pub first_wait: Duration,
}

impl Default for Retries {
    /// 1 + 2 + 4 + 8 s of waiting: a router restart or a Wi-Fi hand-over, not an outage.
    fn default() -> Self {
        Retries {
            attempts: 5,
            first_wait: Duration::from_secs(1),
        }
    }
}

impl Retries {
    /// The wait before try `attempt` (2 for the first retry).
    pub fn wait_before(&self, attempt: usize) -> Duration {
        let doublings = attempt.saturating_sub(2).min(16) as u32;
        self.first_wait.saturating_mul(1 << doublings)
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(10),
            read: Duration::from_secs(30),
        }
    }
}

pub(crate) fn agent(timeouts: Timeouts) -> Agent {
    Agent::config_builder()
        .timeout_connect(Some(timeouts.connect))
        .timeout_per_read(Some(timeouts.read))
        .http_status_as_error(false)
        .max_redirects(0)
        .user_agent(concat!("smolchat/", env!("CARGO_PKG_VERSION")))
        .build()
        .into()
}

/// What the hub says about one file of one revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileMetadata {
    pub commit: String,
    /// Blob name in the cache; the content's sha256 for LFS files.
    pub etag: String,
    pub size: Option<u64>,
    /// Where the bytes are, often a CDN URL for LFS files.
    pub download_url: String,
}

impl FileMetadata {
    /// LFS etags are the content's sha256, which is worth checking; git
    /// blob ids of small files hash a header too and are not.
    pub fn expected_sha256(&self) -> Option<&str> {
        (self.etag.len() == 64 && self.etag.bytes().all(|b| b.is_ascii_hexdigit()))
            .then_some(self.etag.as_str())
    }
}

pub(crate) enum Lookup {
    Found(FileMetadata),
    NotFound,
}

/// `HEAD` on the resolve URL, following only redirects within the hub
/// (renamed repos) and stopping at the first answer that carries metadata.
pub(crate) fn head_file(agent: &Agent, url: &str) -> Result<Lookup, HubError> {
    let mut current = url.to_string();
    for _ in 0..=MAX_REDIRECTS {
        let response = agent
            .head(&current)
            .header("Accept-Encoding", "identity")
            .call()
            .map_err(|e| network_error(&current, e))?;
        let status = response.status().as_u16();
        let headers = response.headers();
        if status == 404 {
            return Ok(Lookup::NotFound);
        }
        let location = header(headers, "location").map(|l| join_url(&current, l));
        if (300..400).contains(&status) && header(headers, "x-repo-commit").is_none() {
            current = location.ok_or_else(|| HubError::MissingHeader {
                url: current.clone(),
                header: "location",
            })?;
            continue;
        }
        if !(200..400).contains(&status) {
            return Err(HubError::Http {
                url: current,
                status,
            });
        }
        return metadata(headers, &current, location).map(Lookup::Found);
    }
    Err(HubError::TooManyRedirects {
        url: url.to_string(),
    })
}

fn metadata(
    headers: &HeaderMap,
    url: &str,
    location: Option<String>,
) -> Result<FileMetadata, HubError> {
    let missing = |header| HubError::MissingHeader {
        url: url.to_string(),
        header,
    };
    let commit = header(headers, "x-repo-commit").ok_or_else(|| missing("x-repo-commit"))?;
    let etag = header(headers, "x-linked-etag")
        .or_else(|| header(headers, "etag"))
        .map(normalize_etag)
        .filter(|e| !e.is_empty() && !e.contains(['/', '\\']))
        .ok_or_else(|| missing("etag"))?;
    let size = header(headers, "x-linked-size")
        .or_else(|| header(headers, "content-length"))
        .and_then(|s| s.trim().parse().ok());
    Ok(FileMetadata {
        commit: commit.trim().to_string(),
        etag,
        size,
        download_url: location.unwrap_or_else(|| url.to_string()),
    })
}

/// `GET` that follows redirects by hand so headers such as `Range` survive
/// every hop.
pub(crate) fn get(
    agent: &Agent,
    url: &str,
    range_start: Option<u64>,
) -> Result<Response<ureq::Body>, HubError> {
    let mut current = url.to_string();
    for _ in 0..=MAX_REDIRECTS {
        let mut request = agent.get(&current).header("Accept-Encoding", "identity");
        if let Some(start) = range_start {
            request = request.header("Range", format!("bytes={start}-"));
        }
        let response = request.call().map_err(|e| network_error(&current, e))?;
        let status = response.status().as_u16();
        if (300..400).contains(&status) {
            let location =
                header(response.headers(), "location").ok_or_else(|| HubError::MissingHeader {
                    url: current.clone(),
                    header: "location",
                })?;
            current = join_url(&current, location);
            continue;
        }
        return Ok(response);
    }
    Err(HubError::TooManyRedirects {
        url: url.to_string(),
    })
}

pub(crate) fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

pub(crate) fn network_error(url: &str, error: ureq::Error) -> HubError {
    HubError::Network {
        url: url.to_string(),
        reason: error.to_string(),
    }
}

fn normalize_etag(etag: &str) -> String {
    etag.trim()
        .trim_start_matches("W/")
        .trim_matches('"')
        .to_string()
}

/// Resolves a `location` header against the URL that sent it.
pub(crate) fn join_url(base: &str, location: &str) -> String {
    if location.contains("://") {
        return location.to_string();
    }
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let path_start = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |i| i + scheme_end);
    if let Some(rest) = location.strip_prefix("//") {
        return format!("{}{rest}", &base[..scheme_end]);
    }
    if location.starts_with('/') {
        return format!("{}{location}", &base[..path_start]);
    }
    let path = base[path_start..].split(['?', '#']).next().unwrap_or("");
    let dir = path.rfind('/').map_or("/", |i| &path[..=i]);
    format!("{}{dir}{location}", &base[..path_start])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joins_absolute_and_relative_locations() {
        let base = "https://hub.example/org/m/resolve/main/a.json?x=1";
        assert_eq!(
            join_url(base, "https://cdn.example/b"),
            "https://cdn.example/b"
        );
        assert_eq!(join_url(base, "//cdn.example/b"), "https://cdn.example/b");
        assert_eq!(join_url(base, "/api/x"), "https://hub.example/api/x");
        assert_eq!(
            join_url(base, "b.json"),
            "https://hub.example/org/m/resolve/main/b.json"
        );
    }

    #[test]
    fn strips_weak_marker_and_quotes_from_etags() {
        assert_eq!(normalize_etag("W/\"abc\""), "abc");
        assert_eq!(normalize_etag("\"abc\""), "abc");
    }
}
