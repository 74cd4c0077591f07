//! Stage 6: the request goes to its destination. An HTTP upstream gets it
//! with hop-by-hop hygiene and the identity and forwarding fields added, its
//! outcome counted and mapped to a gateway error; the built-in key service
//! gets the caller's grant.
use http::header::HOST;
use http::{request, Request, Response};
use std::future::Future;
use std::time::Instant;

use super::authorize::Grant;
use super::record::method_label;
use super::stamp::RequestId;
use super::table::{Destination, Pipeline, RouteEntry};
use super::validate::Validated;
use crate::config::Operation;
use crate::error::{AuthReason, GatewayError};
use crate::http_core::body::{Body, RequestBody};
use crate::http_core::fields::CONTENT_DIGEST;
use crate::http_core::service::ConnInfo;
use crate::ip::Client;
use crate::proxy::headers::{sanitize_request, Added, ForwardedFor, Identity};
use crate::proxy::upstream::UpstreamError;
use crate::routes::named_host;
use crate::trace::RequestTrace;
use opentelemetry::KeyValue;

/// Where a request came from, as stage 6 passes it on: the connection, the
/// client it speaks for, and the request's id.
pub(super) struct Origin<'a> {
    pub(super) conn: &'a ConnInfo,
    pub(super) client: &'a Client<'a>,
    pub(super) request_id: &'a RequestId,
    /// The request's trace, when `[tracing]` exports.
    pub(super) trace: Option<&'a RequestTrace>,
}

impl Pipeline {
    /// Stage 6: to the route's upstream, with identity headers and hygiene.
    /// (An `async move` block, as `Pipeline::stages` is, for the same reason.)
    #[allow(clippy::manual_async_fn)]
    pub(super) fn forward<'a>(
        &'a self,
        entry: &'a RouteEntry,
        head: &'a mut request::Parts,
        body: RequestBody,
        grant: Option<Grant<'a>>,
        validated: Validated,
        origin: Origin<'a>,
    ) -> impl Future<Output = Result<Response<Body>, GatewayError>> + 'a {
        async move {
            let max_body = self.settings.server.limits.max_body_bytes;
            let mut body = Body::new(crate::http_core::body::Limited::new(body, max_body));
            let upstream = match &entry.destination {
                Destination::Builtin(op) => {
                    // Its own statement: a `?` inside the awaited expression would
                    // keep the unboxed future's room in this one.
                    let call = self.to_key_service(*op, grant, validated, head, body, &origin)?;
                    // Boxed, so the proxying path's future is not sized for this one.
                    return Box::pin(call).await;
                }
                Destination::Http(upstream) => upstream,
            };
            let Origin {
                conn,
                client,
                request_id,
                trace,
            } = origin;
            // Taken out of the map (no copy): the upstream gets the target's
            // own. Stage 1 checked it (and `:authority`) for X-Forwarded-Host.
            // `:authority` (HTTP/2 only) is cloned, not copied: it shares the
            // bytes received.
            let host_field = head.headers.remove(HOST);
            let authority = head.uri.authority().cloned();
            let host = named_host(authority.as_ref(), host_field.as_ref());
            sanitize_request(&mut head.headers, &entry.route.keep_client_headers);
            // A client-address field of another name than those removed
            // above: its word was taken (or not) here, never passed on.
            if let Some(name) = &self.client_ip_field {
                head.headers.remove(name);
            }
            let signature;
            let mut added = Added {
                identity: grant.as_ref().map(|g| self.identity(g)),
                forwarded: ForwardedFor {
                    chain: client.forwarded_for(),
                    proto: if conn.tls { "https" } else { "http" },
                    host,
                },
                key_meta: match (entry.forward_key_meta, &grant) {
                    (true, Some(g)) => g.principal.key_meta(),
                    _ => None,
                },
                request_id: request_id.as_bytes(),
                traceparent: None,
                signature: None,
            };
            // The upstream call's span: its id is the parent the target sees.
            let traceparent;
            if let Some(t) = trace {
                traceparent = t.open_upstream(|| {
                    vec![
                        KeyValue::new("http.request.method", method_label(&head.method)),
                        KeyValue::new("mpg.upstream", entry.traced_upstream.clone()),
                    ]
                });
                added.traceparent = Some(&traceparent);
            }
            // Signed once, over the fields and the path as the transports
            // send them (a retry sends the same), with a nonce of the
            // gateway's and the body's digest.
            if let Some(signer) = upstream.signer() {
                let digest;
                (body, digest) = Box::pin(digest_body(signer, head, body, max_body)).await?;
                let path = head.uri.path_and_query().map_or("/", |p| p.as_str());
                let unix = u64::try_from(crate::clock::unix_now()).unwrap_or(0);
                let request = (&head.method, path);
                let nonce = crate::proxy::signature::nonce();
                signature = signer.sign(&added, request, unix, &nonce, digest.as_deref());
                added.signature = Some(signature.as_bytes());
            }
            // Whatever form and version the client used, the transports send
            // the URI's path and query (origin form) over their own version.
            let handed_over = entry
                .upstream_latency
                .as_ref()
                .map(|h| (h, crate::clock::now()));
            let result = upstream.forward(head, body, Some(&added)).await;
            let outcome = count_outcome(entry, &result, handed_over);
            if let Some(t) = trace {
                t.end_upstream(match &result {
                    Ok(res) => Ok(res.status().as_u16()),
                    Err(_) => Err(outcome),
                });
            }
            result.map_err(|e| upstream_error(entry, max_body, e))
        }
    }

    /// Stage 6 for the built-in key service: it gets the caller's grant and
    /// the head. The caller boxes the call, so the proxying path's future is
    /// not sized for this one.
    fn to_key_service<'a>(
        &'a self,
        op: Operation,
        grant: Option<Grant<'a>>,
        validated: Validated,
        head: &mut request::Parts,
        body: Body,
        origin: &Origin<'a>,
    ) -> Result<impl Future<Output = Result<Response<Body>, GatewayError>> + 'a, GatewayError> {
        let grant = grant.ok_or(GatewayError::Unauthorized(AuthReason::Missing))?;
        let ctx = crate::keys_service::Caller {
            principal: grant.principal,
            organization: grant.organization,
            role: grant.role,
            request_id: origin.request_id.as_str(),
            client: origin.client.addr().as_str(),
        };
        // The key service takes the head: nothing reads it after.
        let head = std::mem::replace(head, Request::new(()).into_parts().0);
        let req = Request::from_parts(head, body);
        Ok(self
            .keys_service
            .handle(op, ctx, validated.key.map(|k| *k), req))
    }

    /// The identity fields the upstream gets for an authorized caller.
    #[inline]
    fn identity<'a>(&'a self, g: &Grant<'a>) -> Identity<'a> {
        let scopes = g.principal.effective_scopes(&self.settings.roles, g.role);
        Identity {
            organization_id: g.organization,
            user_id: g.principal.user_id(),
            role: g.role,
            auth: g.principal.auth_kind(),
            key_id: g.principal.key_id(),
            scopes,
        }
    }
}

/// Counts the upstream's outcome on the route's counter, and records the
/// latency of an answer when the route keeps that histogram. Returns the
/// outcome's label.
#[inline]
fn count_outcome(
    entry: &RouteEntry,
    result: &Result<Response<Body>, UpstreamError>,
    handed_over: Option<(&metrics::Histogram, Instant)>,
) -> &'static str {
    let outcome = match result {
        Ok(_) => {
            if let Some((histogram, at)) = handed_over {
                histogram.record(
                    crate::clock::now()
                        .saturating_duration_since(at)
                        .as_secs_f64(),
                );
            }
            "response"
        }
        Err(UpstreamError::Timeout) => "timeout",
        Err(UpstreamError::BodyTooLarge) => "body_too_large",
        Err(UpstreamError::Connect(_)) => "connect_error",
        Err(UpstreamError::Unavailable { .. }) => "unavailable",
        Err(UpstreamError::Saturated) => "saturated",
        Err(e) if e.is_client_side() => "client_body",
        Err(UpstreamError::Reset(_) | UpstreamError::Config(_)) => "error",
    };
    entry.upstream_outcomes.increment(outcome);
    outcome
}

/// The gateway's error for an upstream's failure on `entry`.
fn upstream_error(entry: &RouteEntry, max_body: u64, e: UpstreamError) -> GatewayError {
    match e {
        UpstreamError::Timeout => GatewayError::GatewayTimeout,
        UpstreamError::BodyTooLarge => GatewayError::PayloadTooLarge { limit: max_body },
        UpstreamError::Unavailable { retry_after } => GatewayError::ServiceUnavailable {
            what: format!("upstream {}", entry.route.upstream).into(),
            retry_after,
        },
        UpstreamError::Saturated => GatewayError::ServiceUnavailable {
            what: format!("upstream {}", entry.route.upstream).into(),
            retry_after: 1,
        },
        // The client's own body was cut off, malformed or stalled:
        // its fault, not the upstream's (no 502, no warning logged).
        other => match other.client_body_error() {
            Some(body) => GatewayError::BadRequest {
                message: body.to_string().into(),
                field: None,
            },
            None => GatewayError::BadGateway(Box::new(other)),
        },
    }
}

/// For an upstream that signs: the client's own `Content-Digest` is removed
/// (the gateway's is the one signed), and a body, when the upstream signs
/// digests, is read whole (at most `max_body` bytes) to send with its
/// `Content-Digest`. The body to send, and the digest to sign.
async fn digest_body(
    signer: &crate::proxy::signature::IdentitySigner,
    head: &mut request::Parts,
    body: Body,
    max_body: u64,
) -> Result<(Body, Option<Vec<u8>>), GatewayError> {
    use http_body::Body as _;
    head.headers.remove(CONTENT_DIGEST);
    if !signer.signs_content_digest() || body.is_end_stream() {
        return Ok((body, None));
    }
    let bytes = crate::keys_service::read_body(body, max_body).await?;
    if bytes.is_empty() {
        return Ok((crate::http_core::body::full(bytes), None));
    }
    let digest = crate::proxy::signature::content_digest(&bytes);
    if let Ok(value) = http::HeaderValue::from_str(&digest) {
        head.headers.insert(CONTENT_DIGEST, value);
    }
    Ok((
        crate::http_core::body::full(bytes),
        Some(digest.into_bytes()),
    ))
}
