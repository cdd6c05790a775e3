//! A small HTTP client for the server tests: ureq for whole requests, a raw socket where a
//! test must control the connection (streaming, hanging up mid-stream).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::Value;

pub const TIMEOUT: Duration = Duration::from_secs(120);

pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpResponse {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|err| panic!("not JSON ({err}): {}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// The `data:` payloads of a server-sent-events body, in order.
    pub fn events(&self) -> Vec<String> {
        self.body
            .lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }
}

pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(TIMEOUT))
        .build()
        .into()
}

pub fn request(
    method: &str,
    address: SocketAddr,
    path: &str,
    body: Option<&str>,
    key: Option<&str>,
) -> HttpResponse {
    let url = format!("http://{address}{path}");
    let agent = agent();
    let authorization = key.map(|key| format!("Bearer {key}"));
    let result = match (method, body) {
        ("GET", _) => {
            let mut request = agent.get(&url);
            if let Some(value) = &authorization {
                request = request.header("Authorization", value);
            }
            request.call()
        }
        (_, body) => {
            let mut request = agent.post(&url).header("Content-Type", "application/json");
            if let Some(value) = &authorization {
                request = request.header("Authorization", value);
            }
            request.send(body.unwrap_or_default())
        }
    };
    let mut response = result.unwrap_or_else(|err| panic!("{method} {path}: {err}"));
    let headers = response
        .headers()
        .iter()
        .map(|(name, value)| {
            (
                name.to_string(),
                value.to_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let status = response.status().as_u16();
    let body = response
        .body_mut()
        .read_to_string()
        .unwrap_or_else(|err| panic!("{method} {path} body: {err}"));
    HttpResponse {
        status,
        headers,
        body,
    }
}

pub fn post(address: SocketAddr, path: &str, body: &Value) -> HttpResponse {
    request("POST", address, path, Some(&body.to_string()), None)
}

pub fn get(address: SocketAddr, path: &str) -> HttpResponse {
    request("GET", address, path, None, None)
}

/// A streaming request on a socket of its own: read events one at a time, hang up at will.
pub struct RawStream {
    reader: BufReader<TcpStream>,
    pub status: u16,
}

impl RawStream {
    pub fn open(address: SocketAddr, path: &str, body: &Value) -> Self {
        let mut stream = TcpStream::connect(address).expect("connect");
        stream.set_read_timeout(Some(TIMEOUT)).expect("timeout");
        let body = body.to_string();
        write!(
            stream,
            "POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("send");
        let mut reader = BufReader::new(stream);
        let mut status_line = String::new();
        reader.read_line(&mut status_line).expect("status line");
        let status = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).expect("header");
            if line == "\r\n" || line.is_empty() {
                break;
            }
        }
        Self { reader, status }
    }

    /// The next `data:` payload (chunked framing is skipped: chunk-size lines never start
    /// with `data: `).
    pub fn next_event(&mut self) -> Option<String> {
        loop {
            let mut line = String::new();
            if self.reader.read_line(&mut line).ok()? == 0 {
                return None;
            }
            if let Some(data) = line.trim_end().strip_prefix("data: ") {
                return Some(data.to_string());
            }
        }
    }

    /// The next comment line, which a stream sends where a request stands before its reply.
    pub fn next_comment(&mut self) -> Option<String> {
        loop {
            let mut line = String::new();
            if self.reader.read_line(&mut line).ok()? == 0 {
                return None;
            }
            if line.starts_with(':') {
                return Some(line.trim_end().to_string());
            }
        }
    }

    /// Everything left, for a body that is not a stream.
    pub fn rest(mut self) -> String {
        let mut rest = String::new();
        let _ = self.reader.read_to_string(&mut rest);
        rest
    }
}
