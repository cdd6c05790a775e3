//! The accept loop. Each connection is served by hyper's HTTP/1 connection with a deadline
//! for every request head, and holds one of at most `max_connections` places: a client that
//! opens connections and never finishes a request cannot exhaust the file descriptors or the
//! memory, nor lock anyone else out.
//!
//! When every place is taken, the connection idle the longest (waiting for a request head,
//! or kept alive between requests) is closed to make room, as nginx reuses its idle
//! keep-alive connections: a flood of half-sent requests only ever pushes out its own
//! oldest, and a real request gets in at once. Only when every place is running a request
//! is a newcomer turned away, with a 503.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use futures_util::StreamExt;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::{Service, service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::AbortHandle;

/// What one client may take of the server: places, time and bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ServerLimits {
    /// Open connections at once, idle ones included.
    pub max_connections: usize,
    /// For a request's head, from the connection's opening or its previous response; then
    /// again for its body.
    pub read_timeout: Duration,
    /// Request bodies above this are refused with 413.
    pub max_body_bytes: usize,
}

impl Default for ServerLimits {
    /// Generous for any client on this machine or a LAN: a chat request is a few kilobytes
    /// sent at once, and OpenAI's clients keep a handful of connections.
    fn default() -> Self {
        Self {
            max_connections: 256,
            read_timeout: Duration::from_secs(10),
            max_body_bytes: super::DEFAULT_MAX_BODY_BYTES,
        }
    }
}

/// Requests a connection is running now; zero while it waits for the next request head.
type Activity = Arc<AtomicUsize>;

/// One running request of a connection, counted in its [`Activity`] until its response
/// body has been sent or dropped.
struct Running(Activity);

impl Running {
    fn start(activity: &Activity) -> Self {
        activity.fetch_add(1, Ordering::SeqCst);
        Self(Arc::clone(activity))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

struct Connection {
    activity: Activity,
    task: AbortHandle,
}

/// The open connections, oldest first.
#[derive(Default)]
struct Table {
    next_id: u64,
    open: BTreeMap<u64, Connection>,
    /// The most open at once since the memory was last handed back.
    peak: usize,
}

/// Open connections at once above which, when the last one closes, the memory they took is
/// handed back: after a flood, not after every client.
const FLOOD: usize = 32;

type Shared = Arc<Mutex<Table>>;

fn lock(table: &Shared) -> std::sync::MutexGuard<'_, Table> {
    table.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Takes a connection off the table when its task ends, however it ends.
struct Listed {
    table: Shared,
    id: u64,
}

impl Drop for Listed {
    fn drop(&mut self) {
        let mut table = lock(&self.table);
        table.open.remove(&self.id);
        if table.open.is_empty() && table.peak >= FLOOD {
            table.peak = 0;
            drop(table);
            crate::stats::memory::release_freed_heap();
        }
    }
}

/// Makes room for one more connection: closes the oldest idle one if every place is taken.
/// False when every place is running a request.
fn make_room(table: &Shared, max_connections: usize) -> bool {
    let mut table = lock(table);
    if table.open.len() < max_connections {
        return true;
    }
    let idle = table
        .open
        .iter()
        .find(|(_, connection)| connection.activity.load(Ordering::SeqCst) == 0)
        .map(|(id, _)| *id);
    let Some(id) = idle else { return false };
    if let Some(connection) = table.open.remove(&id) {
        connection.task.abort();
    }
    true
}

/// What a connection turned away reads, if it reads at all: written without waiting, so a
/// client that does not read cannot hold the loop.
fn full_response() -> String {
    let body = r#"{"error":{"message":"every connection of this server is running a request; try again shortly","type":"server_error","param":null,"code":"busy"}}"#;
    format!(
        "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Serves `router` on `listener` until `stopping` turns true, then gives open requests
/// `grace` to finish and cuts the rest.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ServerLimits,
    mut stopping: watch::Receiver<bool>,
    grace: Duration,
) {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.read_timeout);
    let table = Shared::default();
    let graceful = GracefulShutdown::new();
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of file descriptors (or a connection reset before it was taken):
                // closing connections will free some soon.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            _ = stopping.wait_for(|stop| *stop) => break,
        };
        if !make_room(&table, limits.max_connections.max(1)) {
            let _ = stream.try_write(full_response().as_bytes());
            continue;
        }
        let activity = Activity::default();
        let connection = http.serve_connection(
            TokioIo::new(stream),
            tracked(router.clone(), Arc::clone(&activity)),
        );
        let watched = graceful.watch(connection);
        let mut table_now = lock(&table);
        let id = table_now.next_id;
        table_now.next_id += 1;
        let listed = Listed {
            table: Arc::clone(&table),
            id,
        };
        let task = tokio::spawn(async move {
            let _listed = listed;
            let _ = watched.await;
        });
        table_now.open.insert(
            id,
            Connection {
                activity,
                task: task.abort_handle(),
            },
        );
        table_now.peak = table_now.peak.max(table_now.open.len());
    }
    drop(listener);
    let _ = tokio::time::timeout(grace, graceful.shutdown()).await;
}

/// The router for one connection, counting its running requests in `activity`: a request
/// runs from its head until its response body is sent or dropped.
fn tracked(
    router: Router,
    activity: Activity,
) -> impl Service<
    Request<Incoming>,
    Response = axum::response::Response,
    Error = Infallible,
    Future = impl Future<Output = Result<axum::response::Response, Infallible>> + Send,
> + Clone {
    let inner = TowerToHyperService::new(router);
    service_fn(move |request: Request<Incoming>| {
        let running = Running::start(&activity);
        let response = inner.call(request);
        async move {
            let response = response.await?;
            Ok(response.map(|body| {
                Body::from_stream(body.into_data_stream().map(move |chunk| {
                    let _running = &running;
                    chunk
                }))
            }))
        }
    })
}
