//! The request's life, stage by stage and in that order:
//! route → authenticate → rate limit → validate → authorize → forward.
//! Each stage is a method of [`Pipeline`] in the file of its name, and
//! returns `Result<_, GatewayError>`; the first refusal answers.
//! [`Pipeline::handle`] wraps them: it turns errors into responses, writes
//! the access-log line, and stamps the rate-limit headers and `X-Request-Id`
//! on the reply ([`ReplyStamp`], written as the head is).
mod authenticate;
mod authorize;
mod forward;
mod rate_limit;
mod record;
mod route;
mod stamp;
mod table;
mod validate;

pub use stamp::{ReplyStamp, RequestId};
pub use table::{Pipeline, TableError};

use record::{method_label, request_id, status_label};

use crate::http_core::body::RequestBody;
use http::header::{HeaderValue, CONTENT_LENGTH};
use http::{request, Method, Request, Response, StatusCode};
use http_body::Body as _;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use crate::auth::Principal;
use crate::error::GatewayError;
use crate::http_core::body::Body;
use crate::http_core::service::{ConnInfo, Reply};
use crate::ip::Client;
use crate::ratelimit::{CreditSpend, Decision, Spent};
use crate::trace::{Hex, RequestTrace, ServerSpan, Tracer};

/// What the wrapper needs to know about a request after the stages ran.
struct Outcome {
    route: Option<usize>,
    decision: Option<Decision>,
    principal: Option<Principal>,
    /// The organization the request names (the log falls back to the
    /// principal's own).
    organization: Option<String>,
    /// A shadow policy would have refused it (stage 3).
    shadow_limited: bool,
    /// The credits its key has left, for a key that has credits.
    credits: Option<u64>,
    /// The stage running, or the one that refused (for the trace).
    stage: &'static str,
    /// The refusal's or failure's name and reason, if the stages failed.
    failed: Option<(&'static str, Option<&'static str>)>,
}

// === impl Outcome ===

impl Outcome {
    /// Nothing known yet: no stage has run.
    #[inline]
    fn new() -> Self {
        Outcome {
            route: None,
            decision: None,
            principal: None,
            organization: None,
            shadow_limited: false,
            credits: None,
            stage: "route",
            failed: None,
        }
    }
}

/// A request once answered, as its metrics and access-log line see it.
struct Answered<'a> {
    started: Instant,
    /// The method's bounded label.
    method: &'static str,
    bytes_in: Option<u64>,
    conn: &'a ConnInfo,
    client: &'a Client<'a>,
    request_id: &'a RequestId,
    trace: Option<&'a RequestTrace>,
    out: &'a Outcome,
    res: &'a Response<Body>,
}

// === impl Pipeline ===

impl Pipeline {
    /// Answers one request on this gateway, which the future keeps alive
    /// (the configuration it started on serves it to the end). An owned
    /// `Arc`, so that [`Live`](crate::app::Live) returns this future
    /// itself rather than wrapping it in one that holds the request too.
    pub fn handle(
        self: Arc<Self>,
        req: Request<RequestBody>,
        conn: Arc<ConnInfo>,
    ) -> impl Future<Output = Reply<ReplyStamp>> + Send + 'static {
        // Split here, so the block captures the head and the body, and the
        // stages borrow the head: the request's future holds it once.
        let (mut head, body) = req.into_parts();
        async move {
            let this = &*self;
            let started = crate::clock::now();
            let request_id = request_id(&head.headers);
            // The bounded label, never the method as sent: an extension
            // method is unbounded text, and may be a misplaced secret.
            let method = method_label(&head.method);
            let head_request = head.method == Method::HEAD;
            let mut out = Outcome::new();
            let bytes_in = body.size_hint().exact();
            // Who the client is, once: the connection's source, unless a
            // trusted proxy's header names another.
            let client_ip = &this.settings.server.client_ip;
            let client = Client::of(
                conn.source(),
                conn.trusted(),
                &head.headers,
                &client_ip.header,
                &client_ip.trusted_proxies,
            );
            // The caller's trace continued, or one started: only when
            // `[tracing]` exports.
            let trace = this.tracer.as_ref().map(|t| t.start(&mut head.headers));
            let recording = trace.as_ref().and_then(|t| t.recording.clone());
            // Made in the branch that awaits it: a future made before the
            // branch is copied into it (every byte of it, per request).
            let stages = || {
                let origin = (&*conn, &client, &request_id, trace.as_ref());
                this.stages(&mut head, body, origin, &mut out)
            };
            // A sampled request's stages run with its recording current.
            let result = match recording {
                Some(recording) => recording.scope(stages()).await,
                None => stages().await,
            };
            let mut res = match result {
                Ok(res) => res,
                Err(err) => {
                    out.failed = Some((err.name(), err.reason()));
                    // Refused before it spent (or given back): the count as
                    // this instance knows it.
                    if out.credits.is_none() {
                        out.credits = this.peek_credits(&out);
                    }
                    this.rescue(err, &request_id)
                }
            };
            if head_request {
                res = without_body(res);
            }
            this.record(&Answered {
                started,
                method,
                bytes_in,
                conn: &conn,
                client: &client,
                request_id: &request_id,
                trace: trace.as_ref(),
                out: &out,
                res: &res,
            });
            if let Some((tracer, trace)) = this.tracer.as_ref().zip(trace) {
                this.finish_trace(tracer, trace, &head, method, &out, &res);
            }
            // The request id moved into the stamp, not cloned: a clone of a
            // client's id allocates.
            let stamp = ReplyStamp {
                request_id: Some(request_id),
                decision: out.decision,
                credits: out.credits,
                ietf: this.settings.rate_limit.ietf_headers,
            };
            Reply { res, stamp }
        }
    }
}

impl Pipeline {
    /// The stages in order. Comments say why each stands where it does.
    ///
    /// A plain `fn` returning an `async move` block rather than an `async fn`:
    /// an async fn moves its arguments into its body, so its future holds the
    /// request twice (more to move and to box per request); the block uses
    /// the captured one.
    #[allow(clippy::manual_async_fn)]
    fn stages<'a>(
        &'a self,
        head: &'a mut request::Parts,
        body: RequestBody,
        (conn, client, request_id, trace): (
            &'a ConnInfo,
            &'a Client<'a>,
            &'a RequestId,
            Option<&'a RequestTrace>,
        ),
        out: &'a mut Outcome,
    ) -> impl Future<Output = Result<Response<Body>, GatewayError>> + 'a {
        async move {
            // 1. Before anything reads the path: refuse ambiguity, then route.
            let (index, path_param) = self.route(head, body.size_hint().exact())?;
            out.route = Some(index);
            let entry = &self.routes[index];
            out.stage = "authenticate";
            // 2. Identity first: every later decision depends on who is asking.
            let (principal, taken) = self
                .authenticate(
                    entry,
                    head,
                    path_param.as_deref(),
                    client,
                    &mut out.decision,
                )
                .await?;
            out.principal = principal;
            let principal = out.principal.as_ref();
            out.stage = "rate_limit";
            // 3. Limit before validation, so malformed requests still spend tokens
            //    (the decision may have come with the guard's, in stage 2). A key
            //    with credits spends them with its token.
            let spent;
            (out.shadow_limited, spent) = match taken {
                Some((decision, spent)) => (
                    self.settle_limit(entry, decision, &mut out.decision)?,
                    spent,
                ),
                None => {
                    self.rate_limit(
                        entry,
                        principal,
                        head,
                        path_param.as_deref(),
                        client,
                        &mut out.decision,
                    )
                    .await?
                }
            };
            if let Some(spent) = spent {
                out.credits = Some(settle_credits(spent)?);
            }
            out.stage = "validate";
            // 4. Validate the organization the request is for (and the key it names).
            //    Credits spent in stage 3 are given back if this or stage 5 refuses.
            let refund = spent.is_some().then_some(principal).flatten();
            let mut validated = match self.validate(entry, head, path_param).await {
                Ok(validated) => validated,
                Err(e) => {
                    out.credits = None;
                    return Err(Box::pin(self.refunded(e, refund, entry)).await);
                }
            };
            out.organization = validated.organization.take();
            out.stage = "authorize";
            // 5. Authorize: the right organization, then the route's scope.
            let grant = match principal {
                Some(p) => match self.authorize(entry, p, out.organization.as_deref()) {
                    Ok(grant) => Some(grant),
                    Err(e) => {
                        out.credits = None;
                        return Err(Box::pin(self.refunded(e, refund, entry)).await);
                    }
                },
                None => None,
            };
            // A key with credits whose stage 3 spent none (a route without a
            // policy, a shadow refusal) spends them once authorized.
            if spent.is_none() {
                if let Some(spend) = principal.and_then(|p| credit_spend(p, entry)) {
                    out.stage = "credits";
                    let now = crate::clock::unix_now();
                    out.credits = Some(settle_credits(
                        self.limiter.spend_credits(&spend, now).await,
                    )?);
                }
            }
            out.stage = "forward";
            // 6. Forward to the upstream (or the built-in key service).
            let origin = forward::Origin {
                conn,
                client,
                request_id,
                trace,
            };
            self.forward(entry, head, body, grant, validated, origin)
                .await
        }
    }

    /// Records an answered request: its route's (or the unrouted) request
    /// count and latency, and its one access-log line.
    #[inline]
    fn record(&self, a: &Answered<'_>) {
        let Answered {
            started,
            method,
            bytes_in,
            conn,
            client,
            request_id,
            trace,
            out,
            res,
        } = *a;

        let route = out.route.map(|i| self.routes[i].route.path.as_str());
        let status = res.status().as_u16();
        let request_metrics = match out.route {
            Some(i) => &self.routes[i].metrics,
            None => &self.unrouted,
        };
        request_metrics
            .requests
            .increment((method, status_label(status)));
        request_metrics.latency.record(
            crate::clock::now()
                .saturating_duration_since(started)
                .as_secs_f64(),
        );
        tracing::info!(
            target: "access",
            request_id = request_id.as_str(),
            method,
            route,
            status,
            latency_us = started.elapsed().as_micros() as u64,
            peer = %conn.peer.ip(),
            tls_version = conn.tls_info.map(|t| t.version),
            tls_group = conn.tls_info.map(|t| t.group),
            // What the request has not got is absent: `null` in JSON, `-` in text.
            client = client.addr().as_str(),
            key_id = out.principal.as_ref().and_then(|p| p.key_id()),
            user_id = out.principal.as_ref().map(|p| p.user_id()),
            organization = out
                .organization
                .as_deref()
                .or_else(|| out.principal.as_ref().and_then(|p| p.home_organization())),
            upstream = out.route.map(|i| self.routes[i].route.upstream.as_str()),
            bytes_in,
            bytes_out = res.body().size_hint().exact(),
            // Only on the requests a shadow policy would have refused.
            shadow_limited = out.shadow_limited.then_some(true),
            // In hex, written only if the line is.
            trace_id = trace.map(|t| tracing::field::display(Hex(&t.trace_id))),
            span_id = trace.map(|t| tracing::field::display(Hex(&t.span_id))),
            "request"
        );
    }

    /// Ends a request's trace: a sampled one's spans go to the exporter.
    fn finish_trace(
        &self,
        tracer: &Tracer,
        trace: RequestTrace,
        head: &request::Parts,
        method: &'static str,
        out: &Outcome,
        res: &Response<Body>,
    ) {
        if !trace.sampled() {
            return;
        }
        let error = out.failed.map(|(name, reason)| match reason {
            Some(r) => format!("{name}: {r}"),
            None => name.to_owned(),
        });
        let server = ServerSpan {
            method,
            path: traced_path(head.uri.path()),
            route: out.route.map(|i| self.routes[i].traced_route.clone()),
            status: res.status().as_u16(),
            organization_id: out
                .organization
                .as_deref()
                .or_else(|| out.principal.as_ref().and_then(|p| p.home_organization())),
            key_id: out.principal.as_ref().and_then(|p| p.key_id()),
            refused_by: out.failed.map(|_| out.stage),
            error: error.as_deref(),
        };
        tracer.finish(trace, &server);
    }

    /// The one place a refusal becomes a response; internals go to the log.
    /// A dependency's failure (the upstream's, the store's) is logged by
    /// its incident, once and then counted ([`crate::logging::Incident`]),
    /// not here per request: this request's own line is at debug.
    fn rescue(&self, err: GatewayError, request_id: &RequestId) -> Response<Body> {
        match &err {
            GatewayError::Internal(source) => {
                tracing::warn!(request_id = request_id.as_str(), error = %source, status = err.status().as_u16(), "request failed");
            }
            GatewayError::BadGateway(source) => {
                tracing::debug!(request_id = request_id.as_str(), error = %source, status = err.status().as_u16(), "request failed");
            }
            GatewayError::ServiceUnavailable { what, .. } => {
                tracing::debug!(request_id = request_id.as_str(), %what, "dependency unavailable");
            }
            _ => {}
        }
        err.into_response()
    }
}

/// What a request of an API key with credits spends on `entry`'s route;
/// `None` for any other principal (a test of one pointer for most keys).
#[inline]
fn credit_spend<'p>(
    principal: &'p Principal,
    entry: &table::RouteEntry,
) -> Option<CreditSpend<'p>> {
    let Principal::ApiKey(key) = principal else {
        return None;
    };
    let controls = key.controls()?;
    Some(CreditSpend {
        key_id: key.id(),
        created_at: controls.created_at,
        credits: controls.credits?,
        cost: entry.route.cost,
    })
}

/// A spend's outcome as the request's: the count left, or the refusal.
fn settle_credits(spent: Spent) -> Result<u64, GatewayError> {
    match spent {
        Spent::Spent(left) => Ok(left),
        Spent::Exhausted { retry_after, .. } => Err(GatewayError::CreditsExhausted { retry_after }),
        Spent::Unavailable => Err(GatewayError::ServiceUnavailable {
            what: "the credit backend".into(),
            retry_after: 1,
        }),
    }
}

impl Pipeline {
    /// The credits a refused request's key has left, if it has credits.
    #[cold]
    fn peek_credits(&self, out: &Outcome) -> Option<u64> {
        let principal = out.principal.as_ref()?;
        let spend = credit_spend(principal, &self.routes[out.route?])?;
        Some(self.limiter.peek_credits(&spend, crate::clock::unix_now()))
    }

    /// `refusal`, once the credits `principal`'s key spent on `entry`'s
    /// route in stage 3 (if it did: `Some`) are given back.
    async fn refunded(
        &self,
        refusal: GatewayError,
        principal: Option<&Principal>,
        entry: &table::RouteEntry,
    ) -> GatewayError {
        if let Some(spend) = principal.and_then(|p| credit_spend(p, entry)) {
            let now = crate::clock::unix_now();
            self.limiter.refund_credits(&spend, now).await;
        }
        refusal
    }
}

/// The path as a span shows it: as sent, unless it holds what looks like a
/// secret (a key pasted into a URL), which never leaves the gateway.
fn traced_path(path: &str) -> &str {
    if crate::routes::path_holds_secret(path) {
        "[redacted]"
    } else {
        path
    }
}

/// The answer to a `HEAD` request: the status and fields the `GET` answer
/// has, and no body (RFC 9110 §9.3.2). A body of known size (the key
/// service's, the gateway's own errors) says it in `Content-Length`, as the
/// `GET` answer does; an upstream's `HEAD` answer has no body and keeps the
/// length it sent. Done here for both servers: hyper's HTTP/2 server would
/// send the body.
fn without_body(res: Response<Body>) -> Response<Body> {
    let (mut parts, body) = res.into_parts();
    let status = parts.status;
    let no_length = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    if !no_length && !parts.headers.contains_key(CONTENT_LENGTH) {
        if let Some(n) = body.size_hint().exact() {
            parts.headers.insert(CONTENT_LENGTH, HeaderValue::from(n));
        }
    }
    Response::from_parts(parts, body.into_bodyless())
}
