//! Listeners: the accept loop, the connection cap and the graceful drain on
//! shutdown. Each connection goes through its TLS handshake
//! ([`handshake`]), then HTTP/1.1 ([`crate::h1`], see [`connection`]) or
//! HTTP/2 (hyper, see [`h2`]), which close it when idle.
mod connection;
mod h2;
mod handshake;
mod limits;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use crate::http::service::{ConnInfo, Handler};
use crate::metrics::names;
use connection::serve_connection;
use h2::h2_builder;
use handshake::serve_tls;
pub use limits::ListenerLimits;

/// Decrements the open-connections gauge when the connection task ends.
struct OpenConnection(&'static str);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        metrics::gauge!(names::CONNECTIONS, "listener" => self.0).decrement(1.0);
    }
}

/// Serves `listener` until `shutdown` resolves, then drains for the grace period.
pub async fn serve<H: Handler>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    limits: ListenerLimits,
    handler: Arc<H>,
    shutdown: impl Future<Output = ()>,
) {
    let h2 = Arc::new(h2_builder(&limits));
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
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "max_connections reached; closing new connection");
            continue;
        };
        let _ = stream.set_nodelay(true);
        // The TLS handshake and the first request's head share one
        // allowance, counted from here (Envoy's: from the accept).
        let first_request_by = crate::clock::now() + limits.header_read_timeout;
        metrics::gauge!(names::CONNECTIONS, "listener" => limits.name).increment(1.0);
        let open = OpenConnection(limits.name);
        let conn = Arc::new(ConnInfo::new(peer, tls.is_some()));
        let (handler, h2, tls, limits, stop) = (
            handler.clone(),
            h2.clone(),
            tls.clone(),
            limits.clone(),
            stop_rx.clone(),
        );
        // Each branch boxes its whole future, so that the task of a plain
        // connection reserves no room for a TLS one's state (a rustls
        // connection is large): every idle keep-alive connection pays for
        // the size of its task.
        connections.spawn(crate::clock::reading_once_per_poll(async move {
            let _permit = permit;
            let _open = open;
            match tls {
                Some(acceptor) => {
                    Box::pin(serve_tls(
                        acceptor,
                        stream,
                        &h2,
                        conn,
                        handler,
                        &limits,
                        first_request_by,
                        stop,
                    ))
                    .await
                }
                None => {
                    Box::pin(serve_connection(
                        stream,
                        &h2,
                        conn,
                        handler,
                        &limits,
                        first_request_by,
                        stop,
                    ))
                    .await
                }
            }
        }));
    }
    drop(listener);
    let _ = stop_tx.send(true);
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
