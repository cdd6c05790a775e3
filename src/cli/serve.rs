use std::io::Write;
use std::net::IpAddr;
use std::time::Duration;

use clap::Args;

use crate::backend::BackendKind;
use crate::engine::{DEFAULT_PARALLEL, DEFAULT_QUEUE_LIMIT, EngineHandle, EngineOptions, Event};
use crate::generation::ModelOptions;
use crate::model::Precision;
use crate::model_files::model_name;
use crate::model_source::ModelSource;
use crate::server::{Server, ServerConfig, ServerLimits};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// A model folder, a .gguf file, a hub id such as HuggingFaceTB/SmolLM2-135M-Instruct, or
    /// owner/repo:Q4_K_M for one GGUF file of a hub repository.
    #[arg(long)]
    model: String,
    /// Only this machine by default; any other address needs --api-key.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// 0 picks a free port (printed on start).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on every request (except /health).
    #[arg(long)]
    api_key: Option<String>,
    /// A web origin whose pages may call the API (`http://localhost:3000`), or `*` for any;
    /// repeat it for more. Without it, requests from web pages are refused.
    #[arg(long, value_name = "ORIGIN")]
    cors: Vec<String>,
    /// A host name requests may be addressed to besides localhost, for a reverse proxy in
    /// front of a loopback server; repeat it for more.
    #[arg(long, value_name = "NAME")]
    allowed_hosts: Vec<String>,
    /// Requests that may wait for a free slot; more get 503 with Retry-After.
    #[arg(long, default_value_t = DEFAULT_QUEUE_LIMIT)]
    queue: usize,
    /// How many requests are answered at once, each with its own KV cache: their tokens
    /// are decoded together, one read of the weights serving all of them.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_PARALLEL as u16,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    parallel: u16,
    /// Token positions the requests' KV caches may hold together (default: the model's
    /// context): a request waits while running ones hold them all.
    #[arg(long, value_name = "TOKENS")]
    kv_budget: Option<usize>,
    /// Open connections at once; when all are taken, the one idle longest is closed.
    #[arg(long, default_value_t = ServerLimits::default().max_connections)]
    max_connections: usize,
    /// Seconds a client has to send a request's headers, and again its body.
    #[arg(long, value_name = "SECONDS", default_value_t = ServerLimits::default().read_timeout.as_secs())]
    read_timeout: u64,
    /// The largest request body accepted, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = ServerLimits::default().max_body_bytes)]
    max_body: usize,
    #[arg(long, value_enum, default_value_t)]
    backend: BackendKind,
    #[arg(long, value_enum, default_value_t)]
    precision: Precision,
}

/// The model's name in the API: the hub id, or the folder's or file's name; what was typed
/// is accepted too.
fn model_names(spec: &str, source: &ModelSource) -> Vec<String> {
    let primary = match source {
        ModelSource::Hub(id) => id.clone(),
        ModelSource::HubGguf { .. } => source.to_string(),
        ModelSource::Folder(path) | ModelSource::GgufFile(path) => model_name(path),
    };
    let mut names = vec![primary];
    if names[0] != spec {
        names.push(spec.to_string());
    }
    names
}

pub fn run(args: ServeArgs) -> Result<(), String> {
    let source = ModelSource::parse(&args.model);
    let config = ServerConfig {
        host: args.host,
        port: args.port,
        api_key: args.api_key,
        cors: args.cors,
        allowed_hosts: args.allowed_hosts,
        model_names: model_names(&args.model, &source),
        limits: ServerLimits {
            max_connections: args.max_connections,
            read_timeout: Duration::from_secs(args.read_timeout),
            max_body_bytes: args.max_body,
        },
    };
    config.check()?;
    let dir = super::resolve_model(source)?;
    let engine = EngineHandle::spawn_with(
        EngineOptions {
            queue_limit: args.queue,
            parallel: usize::from(args.parallel),
            kv_budget: args.kv_budget,
        },
        || {},
    )
    .map_err(|err| format!("cannot start the inference thread: {err}"))?;
    let options = ModelOptions {
        backend: args.backend,
        precision: args.precision,
    };
    engine.load_model(ModelSource::local(dir), options);
    let mut loading = super::stderr_load_progress();
    let info = loop {
        match engine.events().recv_timeout(Duration::from_secs(3600)) {
            Ok(Event::LoadProgress(progress)) => loading(progress),
            Ok(Event::ModelReady(info)) => break info,
            Ok(Event::Error { error, .. }) => return Err(error.to_string()),
            Ok(_) => {}
            Err(_) => return Err("the model did not load".into()),
        }
    };
    if let Some(reason) = &info.backend_fallback {
        eprintln!("warning: {reason}");
    }
    let name = config.model_names[0].clone();
    let server = Server::bind(config, engine.clone_client())?;
    // One line on stdout, flushed, so a script can read the address (port 0 included).
    let mut stdout = std::io::stdout().lock();
    writeln!(
        stdout,
        "smolchat: serving {name} ({}) at http://{}/v1",
        info.description,
        server.local_addr()
    )
    .and_then(|()| stdout.flush())
    .map_err(|err| err.to_string())?;
    drop(stdout);
    server
        .run(std::future::pending())
        .map_err(|err| format!("the server stopped: {err}"))
}
