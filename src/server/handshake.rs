//! The TLS handshake of an accepted connection, bounded by the first
//! request's deadline, and failed handshakes in the log.
use tokio_rustls::TlsAcceptor;

use super::connection::{serve_connection, Accepted};
use crate::http_core::service::{Handler, TlsInfo};
use crate::metrics::names;

/// The TLS handshake (by `first_request_by`, the first request's deadline
/// too), then the connection. A drain abandons a handshake at once: no
/// request can be in flight on it.
pub(super) async fn serve_tls<H: Handler>(
    acceptor: TlsAcceptor,
    stream: tokio::net::TcpStream,
    accepted: Accepted<'_, H>,
) {
    let peer = accepted.conn.peer;
    let by = accepted.first_request_by;
    let handshake = tokio::time::timeout_at(by.into(), acceptor.accept(stream));
    let handshaken = tokio::select! {
        biased;
        handshaken = handshake => handshaken,
        () = crate::http_core::service::stopped(accepted.stop.clone()) => {
            tracing::debug!(%peer, "TLS handshake abandoned: shutting down");
            return;
        }
    };
    match handshaken {
        Ok(Ok(stream)) => {
            let info = settled(stream.get_ref().1);
            metrics::counter!(names::TLS_HANDSHAKES, "result" => "ok", "version" => info.version, "group" => info.group).increment(1);
            let accepted = Accepted {
                conn: std::sync::Arc::new(accepted.conn.with_tls(info)),
                ..accepted
            };
            serve_connection(stream, accepted).await
        }
        Ok(Err(e)) => {
            metrics::counter!(names::TLS_HANDSHAKES, "result" => "error").increment(1);
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            handshake_failed(&crate::logging::Chain(&e));
        }
        Err(_) => {
            metrics::counter!(names::TLS_HANDSHAKES, "result" => "timeout").increment(1);
            tracing::debug!(%peer, "TLS handshake timed out");
            handshake_failed(&"timed out (header_read_timeout)");
        }
    }
}

/// The version and key exchange group `session`'s handshake settled.
fn settled(session: &rustls::ServerConnection) -> TlsInfo {
    let version = match session.protocol_version() {
        Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3",
        Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2",
        _ => "other",
    };
    let group = (session.negotiated_key_exchange_group())
        .map_or("none", |g| crate::tls::group_name(g.name()));
    TlsInfo { version, group }
}

/// Failed TLS handshakes, in the log: at INFO, as nginx logs the ones
/// clients cause (scanners, old clients, dropped connections), which is
/// nearly all of them. A success is not watched (it would cost every
/// handshake an atomic load for a recovery line): a failure after a quiet
/// interval begins a new incident.
static TLS_HANDSHAKES_FAILING: crate::logging::Incident = crate::logging::Incident::new();

fn handshake_failed(cause: &dyn std::fmt::Display) {
    if let Some(line) = TLS_HANDSHAKES_FAILING.failed(crate::logging::now_ms()) {
        line.log(tracing::Level::INFO, &"TLS handshakes", "failed", cause);
    }
}
