//! The window's "Serve on localhost" switch: the OpenAI-compatible server of `smolchat serve`,
//! serving the model the window has loaded. It is one more client of the window's inference
//! thread, so API requests queue with the window's chat (first come, first served) and never
//! share a generation or a KV cache state with it.

use std::net::{IpAddr, SocketAddr};

use crate::engine::EngineHandle;
use crate::server::{RunningServer, Server, ServerConfig, ServerLimits};
use crate::store::ServerSettings;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerStatus {
    Off,
    /// Switched on; serving starts when a model is ready.
    WaitingForModel,
    Serving(SocketAddr),
    /// Switched on but not serving; the message says why and what to change.
    Failed(String),
}

impl ServerStatus {
    /// One line for the settings panel and the status bar.
    pub fn describe(&self) -> String {
        match self {
            ServerStatus::Off => "Off".into(),
            ServerStatus::WaitingForModel => "Starts when a model is loaded".into(),
            ServerStatus::Serving(address) => format!("Serving at http://{address}/v1"),
            ServerStatus::Failed(reason) => format!("Not serving: {reason}"),
        }
    }
}

/// What the running server was started with: a change of any of it restarts the server.
#[derive(Debug, PartialEq, Eq)]
struct Started {
    settings: ServerSettings,
    model: String,
}

/// The server the switch controls; dropping it stops the server.
pub struct LocalServer {
    running: Option<(RunningServer, Started)>,
    status: ServerStatus,
}

impl LocalServer {
    pub fn new() -> Self {
        Self {
            running: None,
            status: ServerStatus::Off,
        }
    }

    pub fn status(&self) -> &ServerStatus {
        &self.status
    }

    /// Brings the server in line with the settings and the loaded model (`None` while none
    /// is ready): starts, stops or restarts it, and keeps it running while a model reloads.
    pub fn sync(&mut self, settings: &ServerSettings, model: Option<&str>, engine: &EngineHandle) {
        if !settings.enabled {
            self.running = None;
            self.status = ServerStatus::Off;
            return;
        }
        let Some(model) = model else {
            if self.running.is_none() {
                self.status = ServerStatus::WaitingForModel;
            }
            return;
        };
        let wanted = Started {
            settings: settings.clone(),
            model: model.to_string(),
        };
        if self
            .running
            .as_ref()
            .is_some_and(|(_, started)| *started == wanted)
        {
            return;
        }
        // The old server lets go of its port before the new one binds it.
        self.running = None;
        match start(&wanted, engine) {
            Ok(server) => {
                self.status = ServerStatus::Serving(server.address());
                self.running = Some((server, wanted));
            }
            Err(reason) => self.status = ServerStatus::Failed(reason),
        }
    }
}

fn start(wanted: &Started, engine: &EngineHandle) -> Result<RunningServer, String> {
    let settings = &wanted.settings;
    let host = settings.host.trim();
    let host: IpAddr = host.parse().map_err(|_| {
        format!("\u{201c}{host}\u{201d} is not an IP address; 127.0.0.1 serves this machine only")
    })?;
    let api_key = Some(settings.api_key.trim())
        .filter(|key| !key.is_empty())
        .map(str::to_string);
    let config = ServerConfig {
        host,
        port: settings.port,
        api_key,
        cors: Vec::new(),
        allowed_hosts: Vec::new(),
        model_names: vec![wanted.model.clone()],
        limits: ServerLimits::default(),
    };
    Server::bind(config, engine.clone_client())?
        .spawn()
        .map_err(|err| format!("cannot start the server thread: {err}"))
}
