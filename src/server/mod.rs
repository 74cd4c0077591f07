//! Listeners: the accept loop, the connection cap and the graceful drain on
//! shutdown. Each connection goes through its PROXY header if the listener
//! takes one ([`proxy_protocol`]), its TLS handshake ([`handshake`]), then
//! HTTP/1.1 ([`crate::h1`], see [`connection`]) or
//! HTTP/2 (hyper, see [`h2`]), which close it when idle.
mod connection;
mod h2;
mod handshake;
mod limits;
pub(crate) mod proxy_protocol;

use hyper::server::conn::http2;
use hyper_util::rt::TokioExecutor;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use crate::http_core::service::{ConnInfo, Handler};
use crate::metrics::names;
use connection::{serve_connection, Accepted};
use h2::h2_builder;
use handshake::serve_tls;
pub use limits::ListenerLimits;
pub use proxy_protocol::Proxies;

/// Decrements the open-connections gauge when the connection task ends.
struct OpenConnection(&'static str);

// === impl OpenConnection ===

impl Drop for OpenConnection {
    fn drop(&mut self) {
        metrics::gauge!(names::CONNECTIONS, "listener" => self.0).decrement(1.0);
    }
}

/// Whom an accepted connection speaks for.
enum Source {
    /// Its peer.
    Peer(Arc<ConnInfo>),
    /// The client its PROXY header will name.
    ProxyHeader(Arc<Proxies>),
}

// === impl Source ===

impl Source {
    /// Behind the PROXY protocol, the connection speaks for the client
    /// its header names, which is known once the header is read.
    #[inline]
    fn new(proxies: &Arc<Proxies>, peer: SocketAddr, tls: bool, peer_trusted: bool) -> Self {
        match proxies.proxy_protocol {
            false => Source::Peer(Arc::new(ConnInfo::from_source(
                peer,
                tls,
                peer.ip(),
                peer_trusted,
            ))),
            true => Source::ProxyHeader(proxies.clone()),
        }
    }
}

/// Serves `listener` until `shutdown` resolves, then drains for the grace
/// period. Every peer speaks for itself.
pub async fn serve<H: Handler>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    limits: ListenerLimits,
    handler: Arc<H>,
    shutdown: impl Future<Output = ()>,
) {
    serve_behind(listener, tls, limits, Proxies::default(), handler, shutdown).await
}

/// [`serve`], behind proxies: `proxies` says which peers may name the
/// client, and whether each connection begins with a PROXY header.
pub async fn serve_behind<H: Handler>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    limits: ListenerLimits,
    proxies: Proxies,
    handler: Arc<H>,
    shutdown: impl Future<Output = ()>,
) {
    let h2 = Arc::new(h2_builder(&limits));
    let proxies = Arc::new(proxies);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            // A connection's task is freed only once reaped, so it is reaped
            // here as soon as it ends: reaped only when the next connection
            // comes, a burst of closed connections would keep their tasks'
            // memory.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok(x) => x,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Some((permit, peer_trusted)) = admit(&slots, &proxies, peer) else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        // The PROXY header, the TLS handshake and the first request's head
        // share one allowance, counted from here (Envoy's: from the accept).
        let first_request_by = crate::clock::now() + limits.header_read_timeout;
        metrics::gauge!(names::CONNECTIONS, "listener" => limits.name).increment(1.0);
        let open = OpenConnection(limits.name);
        let source = Source::new(&proxies, peer, tls.is_some(), peer_trusted);
        connections.spawn(connection_task(Arrival {
            stream,
            peer,
            source,
            first_request_by,
            permit,
            open,
            handler: handler.clone(),
            h2: h2.clone(),
            tls: tls.clone(),
            limits: limits.clone(),
            stop: stop_rx.clone(),
        }));
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drain(&limits, &slots, &mut connections).await;
}

/// A connection just accepted, with everything its task owns.
struct Arrival<H> {
    stream: TcpStream,
    peer: SocketAddr,
    source: Source,
    /// When its PROXY header, TLS handshake and first request's head must
    /// have come.
    first_request_by: Instant,
    /// Its slot of `max_connections`.
    permit: OwnedSemaphorePermit,
    open: OpenConnection,
    handler: Arc<H>,
    h2: Arc<http2::Builder<TokioExecutor>>,
    tls: Option<TlsAcceptor>,
    limits: ListenerLimits,
    stop: watch::Receiver<bool>,
}

/// A connection's task: its PROXY header (if the listener takes one), then
/// TLS (if any) and HTTP. A plain fn returning an `async move` block, its
/// fields taken apart before it, so the task captures each as the accept
/// loop's own block did (no struct held beside them).
fn connection_task<H: Handler>(arrival: Arrival<H>) -> impl Future<Output = ()> + Send + 'static {
    let Arrival {
        stream,
        peer,
        source,
        first_request_by,
        permit,
        open,
        handler,
        h2,
        tls,
        limits,
        stop,
    } = arrival;
    // Each branch boxes its whole future, so that the task of a plain
    // connection reserves no room for a TLS one's state (a rustls
    // connection is large): every idle keep-alive connection pays for
    // the size of its task.
    crate::clock::reading_once_per_poll(async move {
        let _permit = permit;
        let _open = open;
        let mut stream = stream;
        let conn = match source {
            Source::Peer(conn) => conn,
            Source::ProxyHeader(proxies) => {
                let read = proxy_protocol::read_client(&mut stream, first_request_by, stop.clone());
                let named = Box::pin(read).await;
                match named_client(named, &proxies, peer, tls.is_some()) {
                    Some(conn) => conn,
                    None => return,
                }
            }
        };
        let accepted = Accepted {
            h2: &h2,
            conn,
            handler,
            limits: &limits,
            first_request_by,
            stop,
        };
        match tls {
            Some(acceptor) => Box::pin(serve_tls(acceptor, stream, accepted)).await,
            None => Box::pin(serve_connection(stream, accepted)).await,
        }
    })
}

/// Takes a slot for a new connection from `peer`, and says whether the peer
/// is a trusted proxy; `None` (the connection is closed) when every slot is
/// taken, or when a PROXY header is required of an untrusted peer.
#[inline]
fn admit(
    slots: &Arc<Semaphore>,
    proxies: &Proxies,
    peer: SocketAddr,
) -> Option<(OwnedSemaphorePermit, bool)> {
    let Ok(permit) = slots.clone().try_acquire_owned() else {
        tracing::debug!(%peer, "max_connections reached; closing new connection");
        return None;
    };
    // Trusted or not, once per connection: an empty list (no proxy in
    // front, the default) is settled without a look at the address.
    let peer_trusted = proxies.trusted.contains(peer.ip());
    if proxies.proxy_protocol && !peer_trusted {
        proxy_protocol::refused(peer, &"not in server.client_ip.trusted_proxies");
        return None;
    }
    Some((permit, peer_trusted))
}

/// The connection behind a PROXY header, from what the header named; `None`
/// (the connection is closed) when it was refused or the listener drains.
fn named_client(
    named: Result<Option<IpAddr>, proxy_protocol::HeaderError>,
    proxies: &Proxies,
    peer: SocketAddr,
    tls: bool,
) -> Option<Arc<ConnInfo>> {
    match named {
        Ok(Some(client)) => Some(Arc::new(ConnInfo::from_source(
            peer,
            tls,
            client,
            proxies.trusted.contains(client),
        ))),
        // A header that names no client (a balancer's own
        // connection): the peer speaks for itself, and its
        // `X-Forwarded-For` is not trusted.
        Ok(None) => Some(Arc::new(ConnInfo::from_source(peer, tls, peer.ip(), false))),
        Err(proxy_protocol::HeaderError::Draining) => None,
        Err(e) => {
            proxy_protocol::refused(peer, &e);
            None
        }
    }
}

/// After the accept loop: waits for every connection to end, for at most
/// the grace period, then aborts those still open.
async fn drain(limits: &ListenerLimits, slots: &Arc<Semaphore>, connections: &mut JoinSet<()>) {
    // Every connection holds a slot: all slots back means all drained.
    let all = limits.max_connections.min(u32::MAX as usize) as u32;
    match tokio::time::timeout(limits.shutdown_grace, slots.clone().acquire_many_owned(all)).await {
        Ok(_) => tracing::info!(listener = limits.name, "all connections drained"),
        Err(_) => {
            tracing::warn!(
                listener = limits.name,
                open = connections.len(),
                "shutdown grace period over; closing remaining connections"
            );
            connections.abort_all();
        }
    }
}
