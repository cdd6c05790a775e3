//! A fake Hugging Face hub on 127.0.0.1 speaking just enough of the hub
//! protocol (resolve URLs, LFS redirects, etags, ranges) for the client.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread;

use sha2::{Digest, Sha256};

pub const FIXTURE_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tiny-smollm");
pub const MODEL_ID: &str = "TestOrg/tiny-smollm";
pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Files of one fake repository and how the server misbehaves.
#[derive(Clone, Default)]
pub struct Repo {
    pub files: BTreeMap<String, Vec<u8>>,
    /// Served like LFS files: sha256 etag, redirect to `/cdn/` when asked.
    pub lfs: BTreeSet<String>,
    pub redirect_lfs: bool,
    /// Close the connection after `.1` body bytes of the next `.2` GETs of file `.0`.
    pub cut_gets: Option<(String, usize, usize)>,
    /// Serve this file with one byte flipped (headers still claim the real hash).
    pub corrupt: Option<String>,
    /// Send file bodies 8 KiB at a time with this pause between, so a download can be
    /// caught half-way.
    pub slow: Option<std::time::Duration>,
}

impl Repo {
    /// Two GGUF files of one model, as quantized repositories hold them.
    pub fn gguf_files() -> Repo {
        let mut repo = Repo::default();
        for (name, len) in [
            ("tiny-smollm-Q4_K_M.gguf", 300_000),
            ("tiny-smollm-Q8_0.gguf", 500_000),
            ("README.md", 40),
        ] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            repo.files.insert(name.to_string(), bytes);
        }
        repo.lfs.insert("tiny-smollm-Q4_K_M.gguf".into());
        repo.lfs.insert("tiny-smollm-Q8_0.gguf".into());
        repo
    }

    /// The fixture checkpoint with `model.safetensors` and `tokenizer.json` as LFS files.
    pub fn fixture() -> Repo {
        let mut repo = Repo::default();
        for file in [
            "config.json",
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "model.safetensors",
        ] {
            repo.files.insert(file.to_string(), fixture(file));
        }
        repo.lfs.insert("model.safetensors".into());
        repo.lfs.insert("tokenizer.json".into());
        repo
    }
}

pub fn fixture(file: &str) -> Vec<u8> {
    std::fs::read(Path::new(FIXTURE_DIR).join(file)).expect("fixture file")
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub range: Option<String>,
}

pub struct FakeHub {
    pub endpoint: String,
    log: Arc<Mutex<Vec<Seen>>>,
}

impl FakeHub {
    pub fn start(repo: Repo) -> FakeHub {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
        let log = Arc::new(Mutex::new(Vec::new()));
        let state = Arc::new(Mutex::new(repo));
        let (log2, endpoint2) = (log.clone(), endpoint.clone());
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (log, state, endpoint) = (log2.clone(), state.clone(), endpoint2.clone());
                thread::spawn(move || {
                    // A client that hangs up early is not a test failure by itself.
                    let _ = serve(stream, &log, &state, &endpoint);
                });
            }
        });
        FakeHub { endpoint, log }
    }

    pub fn requests(&self) -> Vec<Seen> {
        self.log.lock().unwrap().clone()
    }

    pub fn clear_log(&self) {
        self.log.lock().unwrap().clear();
    }

    pub fn gets(&self) -> Vec<Seen> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == "GET")
            .collect()
    }
}

/// The repositories the hub's model listing knows, most downloaded first.
pub const LISTED: [(&str, u64, &str); 3] = [
    (
        MODEL_ID,
        1200,
        r#"["safetensors", "llama", "text-generation"]"#,
    ),
    ("TestOrg/tiny-smollm-GGUF", 300, r#"["gguf", "llama"]"#),
    ("OtherOrg/unrelated", 9, "[]"),
];

/// `/api/models?search=…&limit=…`: the listed repositories whose id holds the search word
/// (any case), as the hub's listing answers.
fn search(query: &str) -> String {
    let param = |name: &str| {
        query
            .split('&')
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
            .unwrap_or("")
    };
    let word = param("search").replace("%20", " ").to_lowercase();
    let limit = param("limit").parse().unwrap_or(usize::MAX);
    let found: Vec<String> = LISTED
        .iter()
        .filter(|(id, _, _)| id.to_lowercase().contains(&word))
        .take(limit)
        .map(|(id, downloads, tags)| {
            format!(r#"{{"id": "{id}", "downloads": {downloads}, "likes": 1, "tags": {tags}}}"#)
        })
        .collect();
    format!("[{}]", found.join(", "))
}

fn serve(
    stream: TcpStream,
    log: &Mutex<Vec<Seen>>,
    state: &Mutex<Repo>,
    endpoint: &str,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let path = parts.next().unwrap_or("").to_string();
    let mut range = None;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.eq_ignore_ascii_case("range")
        {
            range = Some(value.trim().to_string());
        }
    }
    log.lock().unwrap().push(Seen {
        method: method.clone(),
        path: path.clone(),
        range: range.clone(),
    });
    let mut out = stream;
    if let Some(query) = path.strip_prefix("/api/models?") {
        let body = search(query);
        return respond(&mut out, "200 OK", &[], body.as_bytes(), &method);
    }
    if path.starts_with(&format!("/api/models/{MODEL_ID}/revision/")) {
        let repo = state.lock().unwrap();
        let siblings: Vec<String> = repo
            .files
            .iter()
            .map(|(name, bytes)| {
                format!("{{\"rfilename\": \"{name}\", \"size\": {}}}", bytes.len())
            })
            .collect();
        let body = format!(
            "{{\"id\": \"{MODEL_ID}\", \"sha\": \"{COMMIT}\", \"siblings\": [{}]}}",
            siblings.join(", ")
        );
        return respond(&mut out, "200 OK", &[], body.as_bytes(), &method);
    }
    let prefix = format!("/{MODEL_ID}/resolve/");
    let (file, via_cdn) = if let Some(rest) = path.strip_prefix(&prefix) {
        match rest.split_once('/') {
            Some((_revision, file)) => (file.to_string(), false),
            None => return respond(&mut out, "404 Not Found", &[], b"", &method),
        }
    } else if let Some(file) = path.strip_prefix("/cdn/") {
        (file.to_string(), true)
    } else {
        return respond(&mut out, "404 Not Found", &[], b"", &method);
    };
    let mut repo = state.lock().unwrap();
    let Some(content) = repo.files.get(&file).cloned() else {
        return respond(&mut out, "404 Not Found", &[], b"", &method);
    };
    let is_lfs = repo.lfs.contains(&file);
    let etag = if is_lfs {
        sha256_hex(&content)
    } else {
        // Git blob ids are sha1-sized and not a hash of the bare content.
        sha256_hex(&content)[..40].to_string()
    };
    let mut headers = vec![("x-repo-commit", COMMIT.to_string())];
    if is_lfs && repo.redirect_lfs && !via_cdn {
        headers.push(("x-linked-etag", format!("\"{etag}\"")));
        headers.push(("x-linked-size", content.len().to_string()));
        headers.push(("etag", "\"not-the-content-hash\"".to_string()));
        headers.push(("location", format!("{endpoint}/cdn/{file}")));
        return respond(&mut out, "302 Found", &headers, b"", &method);
    }
    headers.push(("etag", format!("\"{etag}\"")));
    let mut body = content.clone();
    if repo.corrupt.as_deref() == Some(file.as_str()) {
        let middle = body.len() / 2;
        body[middle] ^= 0xff;
    }
    let slow = repo.slow;
    let mut cut = None;
    if method == "GET"
        && let Some((cut_file, after, times)) = repo.cut_gets.clone()
        && cut_file == file
    {
        repo.cut_gets = (times > 1).then(|| (cut_file, after, times - 1));
        cut = Some(after);
    }
    drop(repo);
    let start = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|s| s.parse::<usize>().ok());
    let status = match start {
        Some(start) if start < body.len() => {
            headers.push((
                "content-range",
                format!("bytes {start}-{}/{}", body.len() - 1, body.len()),
            ));
            body.drain(..start);
            "206 Partial Content"
        }
        _ => "200 OK",
    };
    if let Some(after) = cut {
        let head = header_block(status, &headers, body.len());
        out.write_all(head.as_bytes())?;
        out.write_all(&body[..after])?;
        out.flush()?;
        return out.shutdown(std::net::Shutdown::Both);
    }
    if let Some(pause) = slow.filter(|_| method == "GET") {
        out.write_all(header_block(status, &headers, body.len()).as_bytes())?;
        for piece in body.chunks(8 * 1024) {
            out.write_all(piece)?;
            out.flush()?;
            thread::sleep(pause);
        }
        return Ok(());
    }
    respond(&mut out, status, &headers, &body, &method)
}

fn header_block(status: &str, headers: &[(&str, String)], len: usize) -> String {
    let mut head = format!("HTTP/1.1 {status}\r\ncontent-length: {len}\r\nconnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    head
}

fn respond(
    out: &mut TcpStream,
    status: &str,
    headers: &[(&str, String)],
    body: &[u8],
    method: &str,
) -> std::io::Result<()> {
    out.write_all(header_block(status, headers, body.len()).as_bytes())?;
    if method != "HEAD" {
        out.write_all(body)?;
    }
    out.flush()
}
