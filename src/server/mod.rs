//! The local OpenAI-compatible HTTP server: other programs use the loaded model through
//! `/v1/chat/completions`, `/v1/completions` and `/v1/models`, as they would LM Studio's or
//! llama.cpp's. Each request is one client of the same inference engine as the window, so
//! requests queue fairly with the window's chat and never share a generation.
//!
//! HTTP is axum on tokio: well kept, with server-sent events, body limits and graceful
//! shutdown built in. The engine stays a plain thread; `bridge.rs` joins the two.

mod bridge;
mod connections;
mod error;
mod request;
mod response;

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, FromRequest, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tokio::sync::{oneshot, watch};

use crate::engine::Client;
use bridge::Output;
pub use connections::ServerLimits;
pub use error::ApiError;
pub use request::{Endpoint, Job, parse as parse_request};
use response::Responder;

/// Request bodies above this are refused with 413: a full 2048-token context is about 10 KB
/// of text, so this leaves room for any conversation the model can read and no more.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1 << 20;

/// How long a stopping server waits for open requests: long enough for a short completion,
/// short enough that the window's switch answers at once.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub host: IpAddr,
    pub port: u16,
    /// Required as `Authorization: Bearer KEY` on every endpoint but `/health` when set.
    pub api_key: Option<String>,
    /// Web origins (`http://localhost:3000`) whose pages may call the API, or `*` for any;
    /// a request from any other page is refused.
    pub cors: Vec<String>,
    /// Host names beside this machine's own that requests may be addressed to, for a reverse
    /// proxy in front of a loopback server.
    pub allowed_hosts: Vec<String>,
    /// What `/v1/models` lists, then the other names a request's `model` may give.
    pub model_names: Vec<String>,
    pub limits: ServerLimits,
}

impl ServerConfig {
    /// Refuses to listen beyond this machine without an API key: anyone on the network could
    /// otherwise use the model. An empty or blank key is no key: `Bearer ` with nothing after
    /// it would pass, so it is refused rather than taken for one.
    pub fn check(&self) -> Result<(), String> {
        if self
            .api_key
            .as_ref()
            .is_some_and(|key| key.trim().is_empty())
        {
            return Err("the API key is empty; give a key of visible characters, or none".into());
        }
        if !self.host.is_loopback() && self.api_key.is_none() {
            return Err(format!(
                "serving on {} would let other machines use the model; set an API key too",
                self.host
            ));
        }
        if self.model_names.is_empty() {
            return Err("the server needs a model name".into());
        }
        Ok(())
    }
}

struct AppState {
    engine: Client,
    config: ServerConfig,
    started: u64,
}

fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

/// Connections the kernel completes and holds while the accept loop catches up. The standard
/// library asks for 128: a burst beyond that (a flood of idle connections, many clients at
/// once on a busy machine) had new connections' first packet dropped, and each waited a
/// second for its retry. The kernel caps it at `net.core.somaxconn` (4096 on Linux).
const LISTEN_BACKLOG: i32 = 4096;

fn listen(address: SocketAddr) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(
        Domain::for_address(address),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    // As the standard library does on Unix: a restarted server can take its port back while
    // the last one's connections linger in TIME_WAIT. (On Windows the flag would let another
    // program take a port that is in use.)
    #[cfg(unix)]
    socket.set_reuse_address(true)?;
    socket.bind(&address.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// A bound server, not yet serving: bind first, so the address (port 0 picks a free one) is
/// known before anything waits on it.
pub struct Server {
    listener: TcpListener,
    router: Router,
    limits: ServerLimits,
}

impl Server {
    pub fn bind(config: ServerConfig, engine: Client) -> Result<Self, String> {
        config.check()?;
        let address = SocketAddr::new(config.host, config.port);
        let listener =
            listen(address).map_err(|err| format!("cannot listen on {address}: {err}"))?;
        let limits = config.limits;
        let router = router(AppState {
            engine,
            config,
            started: unix_seconds(),
        });
        Ok(Self {
            listener,
            router,
            limits,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Serves until `shutdown` completes, on a runtime of its own, blocking this thread. Open
    /// requests then get [`SHUTDOWN_GRACE`] to finish; any still streaming after it are cut,
    /// which stops their generations.
    pub fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> std::io::Result<()> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            // One thread: HTTP work is microseconds per token, and every thread that wakes
            // per token takes a core from the model's own threads.
            .worker_threads(1)
            .thread_name("smolchat-http")
            .enable_all()
            .build()?;
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(self.listener)?;
            let (stopping, stopped) = watch::channel(false);
            tokio::spawn(async move {
                shutdown.await;
                let _ = stopping.send(true);
            });
            connections::serve(listener, self.router, self.limits, stopped, SHUTDOWN_GRACE).await;
            Ok(())
        })
    }

    /// Serves on a thread of its own until the returned handle is dropped.
    pub fn spawn(self) -> std::io::Result<RunningServer> {
        let address = self.local_addr();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("smolchat-server".into())
            .spawn(move || {
                self.run(async move {
                    let _ = stopped.await;
                })
            })?;
        Ok(RunningServer {
            address,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

/// A server on its own thread; dropping it stops it and waits for open requests to end.
pub struct RunningServer {
    address: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<std::io::Result<()>>>,
}

impl RunningServer {
    pub fn address(&self) -> SocketAddr {
        self.address
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn router(state: AppState) -> Router {
    let state = Arc::new(state);
    Router::new()
        .route("/v1/models", get(models))
        .route("/v1/models/{*model}", get(model))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/health", get(health))
        .fallback(unknown_path)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(state.config.limits.max_body_bytes))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            authorize,
        ))
        .layer(middleware::from_fn_with_state(Arc::clone(&state), guard))
        .with_state(Arc::clone(&state))
}

/// What a request must be before anything reads it:
/// - addressed to this machine (`Host`), when the server listens on loopback: a web page
///   whose name an attacker points at 127.0.0.1 (DNS rebinding, Ollama's CVE-2024-28224)
///   sends its own host name;
/// - from no web page, or one `--cors` names: a page cannot use the model behind its user's
///   back;
/// - JSON when it is a POST: a page's `text/plain` form posts need no preflight.
///
/// The answers to allowed pages carry the CORS headers, and their preflights are answered here.
async fn guard(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let config = &state.config;
    let headers = request.headers();
    if config.host.is_loopback() {
        let host = headers
            .get(header::HOST)
            .and_then(|value| value.to_str().ok())
            .or_else(|| request.uri().authority().map(|a| a.as_str()))
            .unwrap_or_default();
        if !is_local_host(host) && !config.allowed_hosts.iter().any(|h| h == host_name(host)) {
            return ApiError::forbidden(format!(
                "requests to this server must be addressed to localhost, not {host:?} (a reverse proxy's name can be allowed with --allowed-hosts)"
            ))
            .into_response();
        }
    }
    let origin = headers
        .get(header::ORIGIN)
        .map(|value| value.to_str().unwrap_or_default().to_owned());
    if let Some(origin) = &origin
        && !config
            .cors
            .iter()
            .any(|allowed| allowed == "*" || allowed == origin)
    {
        return ApiError::forbidden(format!(
            "web pages may not call this server: {origin:?} is not among the origins --cors allows"
        ))
        .into_response();
    }
    let preflight = request.method() == Method::OPTIONS && origin.is_some();
    if request.method() == Method::POST {
        let content_type = headers
            .get(header::CONTENT_TYPE)
            .map(|value| value.to_str().unwrap_or_default())
            .unwrap_or_default();
        let mime = content_type.split(';').next().unwrap_or_default().trim();
        if !mime.eq_ignore_ascii_case("application/json") {
            return ApiError::unsupported_media_type(content_type).into_response();
        }
    }
    let mut response = if preflight {
        StatusCode::NO_CONTENT.into_response()
    } else {
        next.run(request).await
    };
    if let Some(origin) = origin {
        let headers = response.headers_mut();
        if let Ok(origin) = HeaderValue::from_str(&origin) {
            headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
            headers.insert(header::VARY, HeaderValue::from_static("origin"));
        }
        for (name, value) in [
            (header::ACCESS_CONTROL_ALLOW_METHODS, "GET, POST, OPTIONS"),
            (
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                "authorization, content-type",
            ),
        ] {
            headers.insert(name, HeaderValue::from_static(value));
        }
    }
    response
}

/// The name part of a `Host` header: without its port, and an IPv6 address without brackets.
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or_default();
    }
    host.rsplit_once(':').map_or(host, |(name, _)| name)
}

/// `localhost` or a loopback address, with any port.
fn is_local_host(host: &str) -> bool {
    let name = host_name(host);
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `Authorization: Bearer KEY`, compared in constant time; `/health` stays open for probes.
async fn authorize(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let Some(key) = &state.config.api_key else {
        return next.run(request).await;
    };
    if request.uri().path() == "/health" {
        return next.run(request).await;
    }
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .unwrap_or_default();
    if constant_time_eq(given.as_bytes(), key.as_bytes()) {
        next.run(request).await
    } else {
        ApiError::unauthorized().into_response()
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn unknown_path(method: Method, uri: Uri) -> ApiError {
    ApiError::unknown_path(method.as_str(), uri.path())
}

async fn wrong_method(method: Method, uri: Uri) -> ApiError {
    ApiError::method_not_allowed(method.as_str(), uri.path())
}

fn model_entry(state: &AppState) -> Value {
    json!({
        "id": state.config.model_names[0],
        "object": "model",
        "created": state.started,
        "owned_by": "smolchat",
    })
}

async fn models(State(state): State<Arc<AppState>>) -> Json<Value> {
    let data: Vec<Value> = state
        .engine
        .model()
        .map(|_| model_entry(&state))
        .into_iter()
        .collect();
    Json(json!({"object": "list", "data": data}))
}

async fn model(
    State(state): State<Arc<AppState>>,
    Path(model): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if state.config.model_names.contains(&model) && state.engine.model().is_some() {
        Ok(Json(model_entry(&state)))
    } else {
        Err(ApiError::unknown_model(
            &model,
            &state.config.model_names[0],
        ))
    }
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    let model = state.engine.model();
    let ok = model.is_some() && state.engine.engine_running();
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = json!({
        "status": if ok { "ok" } else { "unavailable" },
        "model": model.map(|_| state.config.model_names[0].clone()),
        "queued": state.engine.queued(),
        "generated_tokens": state.engine.generated_tokens(),
    });
    (status, Json(body)).into_response()
}

async fn chat_completions(
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Result<Response, ApiError> {
    generate(state, Endpoint::Chat, request).await
}

async fn completions(
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Result<Response, ApiError> {
    generate(state, Endpoint::Completions, request).await
}

/// The whole body within the body timeout: a client that trickles a body byte by byte
/// would otherwise keep its connection, and its place, for as long as it likes.
async fn read_body(state: &AppState, request: Request) -> Result<Bytes, ApiError> {
    let timeout = state.config.limits.read_timeout;
    match tokio::time::timeout(timeout, Bytes::from_request(request, &())).await {
        Ok(body) => body.map_err(ApiError::from_body),
        Err(_) => Err(ApiError::body_timeout(timeout)),
    }
}

/// Queues the request as a client of its own and answers once the engine has taken the
/// prompt in, so that a refusal (full queue, prompt too long) gets its own status even when
/// the client asked for a stream.
async fn generate(
    state: Arc<AppState>,
    endpoint: Endpoint,
    request: Request,
) -> Result<Response, ApiError> {
    let body = read_body(&state, request).await?;
    let job = request::parse(endpoint, &body, &state.config.model_names)?;
    let client = state.engine.clone_client();
    let id = client
        .submit(job.generate.clone())
        .ok_or_else(ApiError::engine_gone)?;
    let (out, mut outputs) = unbounded_channel();
    let stops = job.stop.clone();
    let prompt_field = endpoint.prompt_field();
    tokio::task::spawn_blocking(move || bridge::relay(client, id, stops, prompt_field, out));
    // Waiting in the queue or reading a long prompt starts a stream, which then says where
    // the request stands; a whole answer waits on. A streamed request refused once its turn
    // comes (a prompt longer than the context) then hears so in an error event, as a
    // refusal after its response began.
    let first = loop {
        match outputs.recv().await {
            Some(Output::Waiting { .. }) if !job.stream => continue,
            first => break first,
        }
    };
    let standing = first.as_ref().and_then(progress_comment);
    let prompt_tokens = match first {
        Some(Output::Started { prompt_tokens }) => prompt_tokens,
        Some(Output::Reading { total, .. }) => total,
        // Known once the prompt is read.
        Some(Output::Waiting { .. }) => 0,
        Some(Output::Failed(error)) => return Err(error),
        Some(other) => return Err(ApiError::internal(format!("unexpected {other:?}"))),
        None => return Err(ApiError::internal("the generation ended without a word")),
    };
    let responder = Responder::new(
        endpoint,
        id,
        unix_seconds(),
        state.config.model_names[0].clone(),
        job.logprobs.is_some(),
        prompt_tokens,
    );
    if job.stream {
        Ok(stream(responder, job, standing, outputs))
    } else {
        whole(responder, outputs)
            .await
            .map(IntoResponse::into_response)
    }
}

async fn whole(
    mut responder: Responder,
    mut outputs: UnboundedReceiver<Output>,
) -> Result<Json<Value>, ApiError> {
    let mut text = String::new();
    let mut tokens = Vec::new();
    while let Some(output) = outputs.recv().await {
        match output {
            Output::Text {
                text: piece,
                tokens: more,
            } => {
                text.push_str(&piece);
                tokens.extend(more);
            }
            Output::Finished {
                reason,
                completion_tokens,
            } => {
                return Ok(Json(responder.complete(
                    text,
                    &tokens,
                    reason,
                    completion_tokens,
                )));
            }
            Output::Failed(error) => return Err(error),
            Output::Started { .. } | Output::Reading { .. } | Output::Waiting { .. } => {}
        }
    }
    Err(ApiError::internal("the generation ended without finishing"))
}

fn event(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

const DONE: &str = "data: [DONE]\n\n";

/// Where a streamed request stands before its reply, as a comment line, which clients skip;
/// it also keeps a waiting connection busy.
fn progress_comment(output: &Output) -> Option<Bytes> {
    let line = match output {
        Output::Waiting { ahead: 1 } => ": waiting: 1 request ahead".to_string(),
        Output::Waiting { ahead } => format!(": waiting: {ahead} requests ahead"),
        Output::Reading { done, total } => format!(": reading the prompt: {done} / {total} tokens"),
        _ => return None,
    };
    Some(Bytes::from(format!("{line}\n\n")))
}

/// Server-sent events: comment lines while the request waits or a long prompt is read, one
/// chunk per piece of text, the finish reason, the usage if asked, then `[DONE]`. An error
/// after the stream began goes out as an `error` event before `[DONE]`.
/// When the client hangs up, hyper drops this stream and with it `outputs`: the relay's
/// next send fails and the generation stops.
///
/// `standing` is the comment line for the output that began the stream.
fn stream(
    responder: Responder,
    job: Job,
    standing: Option<Bytes>,
    outputs: UnboundedReceiver<Output>,
) -> Response {
    let opening = [
        standing,
        responder.opening_chunk().map(|chunk| event(&chunk)),
    ]
    .into_iter()
    .flatten()
    .reduce(|first, then| Bytes::from([first, then].concat()));
    struct Streaming {
        responder: Responder,
        outputs: UnboundedReceiver<Output>,
        include_usage: bool,
        pending: Option<Bytes>,
        done: bool,
    }
    let state = Streaming {
        responder,
        outputs,
        include_usage: job.include_usage,
        pending: opening,
        done: false,
    };
    let chunks = futures_util::stream::unfold(state, |mut state| async move {
        if let Some(bytes) = state.pending.take() {
            return Some((Ok::<_, Infallible>(bytes), state));
        }
        if state.done {
            return None;
        }
        let bytes = match state.outputs.recv().await {
            Some(Output::Text { text, tokens }) => {
                event(&state.responder.text_chunk(text, &tokens))
            }
            Some(Output::Finished {
                reason,
                completion_tokens,
            }) => {
                state.done = true;
                let mut last = event(&state.responder.final_chunk(reason)).to_vec();
                if state.include_usage {
                    last.extend(event(&state.responder.usage_chunk(completion_tokens)));
                }
                last.extend(DONE.as_bytes());
                Bytes::from(last)
            }
            Some(Output::Started { prompt_tokens }) => {
                state.responder.prompt_tokens = prompt_tokens;
                Bytes::new()
            }
            Some(output @ (Output::Waiting { .. } | Output::Reading { .. })) => {
                if let Output::Reading { total, .. } = output {
                    state.responder.prompt_tokens = total;
                }
                progress_comment(&output).unwrap_or_default()
            }
            Some(Output::Failed(error)) => {
                state.done = true;
                Bytes::from(format!(
                    "{}{DONE}",
                    String::from_utf8_lossy(&event(&error.body()))
                ))
            }
            None => {
                state.done = true;
                let error = ApiError::internal("the generation ended without finishing");
                Bytes::from(format!(
                    "{}{DONE}",
                    String::from_utf8_lossy(&event(&error.body()))
                ))
            }
        };
        Some((Ok(bytes), state))
    });
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    (headers, Body::from_stream(chunks)).into_response()
}

#[cfg(test)]
mod tests {
    use super::ServerConfig;

    fn config(host: &str, api_key: Option<&str>) -> ServerConfig {
        ServerConfig {
            host: host.parse().expect("an address"),
            port: 0,
            api_key: api_key.map(str::to_owned),
            cors: Vec::new(),
            allowed_hosts: Vec::new(),
            model_names: vec!["m".into()],
            limits: super::ServerLimits::default(),
        }
    }

    /// `serve --host 0.0.0.0 --api-key ""` served everyone: an empty key is no key.
    #[test]
    fn an_empty_or_blank_api_key_is_refused_at_start() {
        for blank in ["", "  ", "\t\n"] {
            let err = config("0.0.0.0", Some(blank)).check().expect_err("refused");
            assert!(err.contains("API key is empty"), "{err}");
            assert!(config("127.0.0.1", Some(blank)).check().is_err());
        }
        assert!(config("0.0.0.0", None).check().is_err());
        assert!(config("0.0.0.0", Some("s3cret")).check().is_ok());
        assert!(config("127.0.0.1", None).check().is_ok());
    }
}
