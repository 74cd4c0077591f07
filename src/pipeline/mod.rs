//! The request's life, DESIGN.md §3, stage by stage and in that order:
//! route → authenticate → rate limit → validate → authorize → forward.
//! Each stage returns `Result<_, GatewayError>`; the first refusal answers.
//! [`Pipeline::handle`] wraps them: it turns errors into responses, writes
//! the access-log line, and stamps the rate-limit headers and `X-Request-Id`
//! on the reply (written as the head is: [`crate::http::service::Stamp`]).
mod record;
mod table;

pub use table::{Pipeline, TableError};

use record::{method_label, request_id, status_label};

use crate::http::body::RequestBody;
use http::header::{HeaderValue, CONTENT_LENGTH, HOST};
use http::{request, Method, Request, Response, StatusCode};
use http_body::Body as _;
use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;

use crate::auth::credential::{parse_authorization, Credential, CredentialError};
use crate::auth::Principal;
use crate::config::{AuthMode, OrgSource, PolicyKey};
use crate::error::{AuthReason, GatewayError};
use crate::http::body::Body;
use crate::http::rate_limit::Decision;
use crate::http::service::{ConnInfo, Reply, RequestId, Stamp};
use crate::proxy::headers::{sanitize_request, Added, ForwardedFor, Identity};
use crate::proxy::upstream::UpstreamError;
use crate::routes::{
    check_head, check_target, decode_segment, find_secret_param, named_host, path_holds_secret,
    Query, QueryError, RouteMatch,
};
use crate::secret::hash_secret;
use crate::store::{ApiKeyRecord, KeyStatus};
use table::{Destination, RouteEntry};

/// What the wrapper needs to know about a request after the stages ran.
struct Outcome {
    route: Option<usize>,
    decision: Option<Decision>,
    principal: Option<Principal>,
    /// The organization the request names (the log falls back to the
    /// principal's own).
    organization: Option<String>,
}

/// The caller's grant for this request, from stage 5: borrowed from the
/// principal and the request, so granting allocates nothing.
struct Grant<'a> {
    principal: &'a Principal,
    organization: &'a str,
    role: &'a str,
}

/// What stage 4 found: the organization asked for, and the key named by the
/// path when the route takes one (the key service uses it, saving a query;
/// boxed, so the proxying path's future keeps no room for it).
struct Validated {
    organization: Option<String>,
    key: Option<Box<ApiKeyRecord>>,
}

impl Pipeline {
    /// Answers one request on this gateway, which the future keeps alive
    /// (the configuration it started on serves it to the end). An owned
    /// `Arc`, so that [`Live`](crate::app::Live) returns this future
    /// itself rather than wrapping it in one that holds the request too.
    pub fn handle(
        self: Arc<Self>,
        req: Request<RequestBody>,
        conn: Arc<ConnInfo>,
    ) -> impl Future<Output = Reply> + Send + 'static {
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
            let mut out = Outcome {
                route: None,
                decision: None,
                principal: None,
                organization: None,
            };
            let bytes_in = body.size_hint().exact();
            let stages = this.stages(&mut head, body, &conn, &request_id, &mut out);
            let mut res = match stages.await {
                Ok(res) => res,
                Err(err) => this.rescue(err, &request_id),
            };
            if head_request {
                res = without_body(res);
            }
            let route = out
                .route
                .map(|i| this.routes[i].route.path.as_str())
                .unwrap_or("-");
            let status = res.status().as_u16();
            let request_metrics = match out.route {
                Some(i) => &this.routes[i].metrics,
                None => &this.unrouted,
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
                key_id = out.principal.as_ref().and_then(|p| p.key_id()).unwrap_or("-"),
                user_id = out.principal.as_ref().map(|p| p.user_id()).unwrap_or("-"),
                organization = out
                    .organization
                    .as_deref()
                    .or_else(|| out.principal.as_ref().and_then(|p| p.home_organization()))
                    .unwrap_or("-"),
                upstream = out.route.map(|i| this.routes[i].route.upstream.as_str()).unwrap_or("-"),
                bytes_in,
                bytes_out = res.body().size_hint().exact(),
                "request"
            );
            // The request id moved into the stamp, not cloned: a clone of a
            // client's id allocates.
            let stamp = Stamp {
                request_id: Some(request_id),
                decision: out.decision,
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
    /// request twice (272 bytes more to move and to box per request); the
    /// block uses the captured one.
    #[allow(clippy::manual_async_fn)]
    fn stages<'a>(
        &'a self,
        head: &'a mut request::Parts,
        body: RequestBody,
        conn: &'a ConnInfo,
        request_id: &'a RequestId,
        out: &'a mut Outcome,
    ) -> impl Future<Output = Result<Response<Body>, GatewayError>> + 'a {
        async move {
            // 1. Before anything reads the path: refuse ambiguity, then route.
            let (index, path_param) = self.route(head, body.size_hint().exact())?;
            out.route = Some(index);
            let entry = &self.routes[index];
            // 2. Identity first: every later decision depends on who is asking.
            out.principal = self.authenticate(entry, head, conn).await?;
            let principal = out.principal.as_ref();
            // 3. Limit before validation, so malformed requests still spend tokens.
            self.rate_limit(
                entry,
                principal,
                head,
                path_param.as_deref(),
                conn,
                &mut out.decision,
            )
            .await?;
            // 4. Validate the organization the request is for (and the key it names).
            let mut validated = self.validate(entry, head, path_param).await?;
            out.organization = validated.organization.take();
            // 5. Authorize: the right organization, then the route's scope.
            let grant = match principal {
                Some(p) => Some(self.authorize(entry, p, out.organization.as_deref())?),
                None => None,
            };
            // 6. Forward to the upstream (or the built-in key service).
            self.forward(entry, head, body, grant, validated, conn, request_id)
                .await
        }
    }

    /// Stage 1: target checks, header and body limits, route lookup.
    /// `declared` is the body's length as the server framed it (its
    /// `Content-Length`, parsed), not the field's text.
    fn route(
        &self,
        head: &request::Parts,
        declared: Option<u64>,
    ) -> Result<(usize, Option<String>), GatewayError> {
        check_target(&head.uri, head.version)
            .and_then(|()| check_head(&head.uri, head.version, &head.headers))
            .map_err(|e| GatewayError::BadRequest {
                message: format!("invalid request: {e}").into(),
                field: None,
            })?;
        // A credential in the URL is refused before anything could log or forward it.
        let secret_at = if path_holds_secret(head.uri.path()) {
            Some("path".to_string())
        } else {
            head.uri.query().and_then(find_secret_param)
        };
        if let Some(field) = secret_at {
            return Err(GatewayError::bad_field(
                field,
                "looks like a credential; send it in the Authorization header, never in the URL",
            ));
        }
        let limits = &self.settings.server.limits;
        let header_bytes: usize = head
            .headers
            .iter()
            .map(|(n, v)| n.as_str().len() + v.len() + 4)
            .sum();
        if header_bytes > limits.max_header_bytes {
            return Err(GatewayError::HeaderFieldsTooLarge {
                limit: limits.max_header_bytes,
            });
        }
        if declared.is_some_and(|n| n > limits.max_body_bytes) {
            return Err(GatewayError::PayloadTooLarge {
                limit: limits.max_body_bytes,
            });
        }
        match self.router.at(&head.method, head.uri.path()) {
            RouteMatch::Found { value, params } => {
                let entry = &self.routes[*value];
                // Matched as received, but the value is the one the upstream
                // reads: percent-decoded, as the query's are (stage 1 refused
                // every escape that could decode to `/`, `.` or a control byte).
                let malformed = || GatewayError::BadRequest {
                    message: "invalid request: the target has a malformed percent escape".into(),
                    field: None,
                };
                let param = match entry.path_param.as_deref().and_then(|n| params.get(n)) {
                    Some(raw) => Some(decode_segment(raw).ok_or_else(malformed)?.into_owned()),
                    None => None,
                };
                Ok((*value, param))
            }
            RouteMatch::MethodNotAllowed { allow } => Err(GatewayError::MethodNotAllowed {
                allow: allow.clone(),
            }),
            RouteMatch::NotFound => Err(GatewayError::NotFound),
        }
    }

    /// Stage 2: the credential, checked against the cached key store.
    async fn authenticate(
        &self,
        entry: &RouteEntry,
        head: &request::Parts,
        conn: &ConnInfo,
    ) -> Result<Option<Principal>, GatewayError> {
        if entry.route.auth == AuthMode::None {
            return Ok(None);
        }
        let ip = conn.peer_ip();
        // Brute-force guard: an IP that piled up 401s gets 429 before any lookup.
        if let Some(d) = self.limiter.auth_failures_exceeded(ip).await {
            return Err(GatewayError::TooManyRequests {
                retry_after: d.retry_after_secs.unwrap_or(1),
            });
        }
        let result = self.check_credential(entry, head).await;
        match &result {
            Ok(p) => self.auth_outcomes.increment(("ok", p.auth_kind())),
            Err(GatewayError::Unauthorized(reason)) => {
                self.auth_outcomes.increment(("refused", reason.as_str()));
                tracing::debug!(peer = %ip, reason = reason.as_str(), "authentication failed");
                self.limiter.record_auth_failure(ip).await;
            }
            Err(_) => self.auth_outcomes.increment(("error", "store_unavailable")),
        }
        result.map(Some)
    }

    async fn check_credential(
        &self,
        entry: &RouteEntry,
        head: &request::Parts,
    ) -> Result<Principal, GatewayError> {
        let credential = parse_authorization(&head.headers).map_err(|e| {
            GatewayError::Unauthorized(match e {
                CredentialError::Missing => AuthReason::Missing,
                CredentialError::Malformed => AuthReason::Malformed,
            })
        })?;
        let now = crate::clock::unix_now();
        match (credential, entry.route.auth) {
            (Credential::ApiKey(secret), AuthMode::ApiKey) => {
                let found = self
                    .keys
                    .api_key(&hash_secret(secret))
                    .await
                    .map_err(crate::store::unavailable)?;
                let auth = found.ok_or(GatewayError::Unauthorized(AuthReason::Invalid))?;
                match auth.key.status(now) {
                    KeyStatus::Active => {}
                    KeyStatus::Revoked => {
                        return Err(GatewayError::Unauthorized(AuthReason::Revoked))
                    }
                    KeyStatus::Expired => {
                        return Err(GatewayError::Unauthorized(AuthReason::Expired))
                    }
                }
                self.usage.touch(&auth.key.id, now);
                Ok(Principal::ApiKey(auth))
            }
            (Credential::Session(token), AuthMode::Session) => {
                let found = self
                    .keys
                    .session(&hash_secret(token))
                    .await
                    .map_err(crate::store::unavailable)?;
                let auth = found.ok_or(GatewayError::Unauthorized(AuthReason::Invalid))?;
                if auth.session.expires_at <= now {
                    return Err(GatewayError::Unauthorized(AuthReason::Expired));
                }
                Ok(Principal::Session(auth))
            }
            _ => Err(GatewayError::Unauthorized(AuthReason::WrongCredentialType)),
        }
    }

    /// Stage 3: the route's policy, keyed as the policy says.
    async fn rate_limit(
        &self,
        entry: &RouteEntry,
        principal: Option<&Principal>,
        head: &request::Parts,
        path_param: Option<&str>,
        conn: &ConnInfo,
        decided: &mut Option<Decision>,
    ) -> Result<(), GatewayError> {
        let Some((policy, key_kind)) = entry.policy else {
            return Ok(());
        };
        let user_key;
        let key: &str = match (key_kind, principal) {
            (PolicyKey::Credential, Some(Principal::ApiKey(k))) => &k.key.id,
            (PolicyKey::Credential, Some(Principal::Session(s))) => {
                user_key = format!("user:{}", s.session.user_id);
                &user_key
            }
            // One bucket per organization (its bare id), whichever
            // credential spends it. A session has no organization of its
            // own: it spends the one the request names directly when the
            // user is a member of it (stage 5 has not run yet: a stranger
            // naming it must not drain its bucket), else one of its user,
            // as `user <id>` (ids hold no space, so no organization's).
            (PolicyKey::Organization, Some(p)) => {
                let named = || {
                    requested_org_hint(entry, head, path_param)
                        .filter(|org| p.role_in(org).is_some())
                };
                match p.home_organization().map(Cow::Borrowed).or_else(named) {
                    Some(Cow::Borrowed(org)) => org,
                    Some(Cow::Owned(org)) => {
                        user_key = org;
                        &user_key
                    }
                    None => {
                        user_key = format!("user {}", p.user_id());
                        &user_key
                    }
                }
            }
            _ => conn.peer_ip(),
        };
        let decision = self.limiter.check(policy, key).await;
        let allowed = decision.allowed;
        if let Some((ok, limited)) = &entry.limit_counters {
            if allowed {
                ok.increment(1)
            } else {
                limited.increment(1)
            }
        }
        let retry_after = decision.retry_after_secs.unwrap_or(1);
        *decided = Some(decision);
        if allowed {
            Ok(())
        } else {
            Err(GatewayError::TooManyRequests { retry_after })
        }
    }

    /// Stage 4: the organization parameter, present once and non-empty; no
    /// repeated query parameter anywhere.
    async fn validate(
        &self,
        entry: &RouteEntry,
        head: &request::Parts,
        path_param: Option<String>,
    ) -> Result<Validated, GatewayError> {
        let query = Query::parse(head.uri.query()).map_err(query_error)?;
        let mut v = Validated {
            organization: None,
            key: None,
        };
        match &entry.route.organization {
            OrgSource::None => {}
            OrgSource::Query(name) => {
                v.organization = Some(query.require(name).map_err(query_error)?.to_string())
            }
            OrgSource::Path(_) => v.organization = path_param,
            OrgSource::Key(_) => {
                let id = path_param.unwrap_or_default();
                let key = self
                    .store
                    .get_api_key(&id)
                    .await
                    .map_err(crate::store::unavailable)?;
                let key = key.ok_or(GatewayError::NotFound)?;
                v.organization = Some(key.organization_id.clone());
                v.key = Some(Box::new(key));
            }
        }
        Ok(v)
    }

    /// Stage 5: same organization, then scopes ∩ the user's current role.
    fn authorize<'a>(
        &self,
        entry: &RouteEntry,
        principal: &'a Principal,
        requested: Option<&'a str>,
    ) -> Result<Grant<'a>, GatewayError> {
        let organization = match (requested, principal.home_organization()) {
            (Some(org), _) => org,
            (None, Some(home)) => home,
            // Config validation guarantees a session route with a scope names an organization.
            (None, None) => "",
        };
        // Another organization's resource, or not a member: the caller cannot see it.
        let role = match principal.role_in(organization) {
            Some(role) => role,
            None if principal.home_organization() == Some(organization) => "",
            None if entry.route.scope.is_none() && organization.is_empty() => "",
            None => return Err(GatewayError::NotFound),
        };
        if let Some(scope) = &entry.route.scope {
            if !principal.allows(&self.settings.roles, role, scope) {
                return Err(GatewayError::Forbidden {
                    required_scope: scope.clone(),
                });
            }
        }
        Ok(Grant {
            principal,
            organization,
            role,
        })
    }

    /// Stage 6: to the route's upstream, with identity headers and hygiene.
    /// (An `async move` block, as [`Gateway::stages`] is, for the same reason.)
    #[allow(clippy::manual_async_fn, clippy::too_many_arguments)]
    fn forward<'a>(
        &'a self,
        entry: &'a RouteEntry,
        head: &'a mut request::Parts,
        body: RequestBody,
        grant: Option<Grant<'a>>,
        validated: Validated,
        conn: &'a ConnInfo,
        request_id: &'a RequestId,
    ) -> impl Future<Output = Result<Response<Body>, GatewayError>> + 'a {
        async move {
            let max_body = self.settings.server.limits.max_body_bytes;
            let body = Body::new(crate::http::body::Limited::new(body, max_body));
            let upstream = match &entry.destination {
                Destination::Builtin(op) => {
                    let grant = grant.ok_or(GatewayError::Unauthorized(AuthReason::Missing))?;
                    let ctx = crate::keys_service::Caller {
                        principal: grant.principal,
                        organization: grant.organization,
                        role: grant.role,
                    };
                    // The key service takes the head: nothing reads it after.
                    let head = std::mem::replace(head, Request::new(()).into_parts().0);
                    let req = Request::from_parts(head, body);
                    // Boxed, so the proxying path's future is not sized for this one.
                    return Box::pin(self.keys_service.handle(
                        *op,
                        ctx,
                        validated.key.map(|k| *k),
                        req,
                    ))
                    .await;
                }
                Destination::Http(upstream) => upstream,
            };
            // Taken out of the map (no copy): the upstream gets the target's
            // own. Stage 1 checked it (and `:authority`) for X-Forwarded-Host.
            // `:authority` (HTTP/2 only) is cloned, not copied: it shares the
            // bytes received.
            let host_field = head.headers.remove(HOST);
            let authority = head.uri.authority().cloned();
            let host = named_host(authority.as_ref(), host_field.as_ref());
            sanitize_request(&mut head.headers);
            let identity = match &grant {
                Some(g) => {
                    let scopes = g.principal.effective_scopes(&self.settings.roles, g.role);
                    Some(Identity {
                        organization_id: g.organization,
                        user_id: g.principal.user_id(),
                        role: g.role,
                        auth: g.principal.auth_kind(),
                        key_id: g.principal.key_id(),
                        scopes,
                    })
                }
                None => None,
            };
            let added = Added {
                identity,
                forwarded: ForwardedFor {
                    client_ip: conn.peer_ip(),
                    proto: if conn.tls { "https" } else { "http" },
                    host,
                },
                request_id: request_id.as_bytes(),
            };
            // Whatever form and version the client used, the transports send
            // the URI's path and query (origin form) over their own version.
            let handed_over = entry
                .upstream_latency
                .as_ref()
                .map(|h| (h, crate::clock::now()));
            let result = upstream.forward(head, body, Some(&added)).await;
            let outcome = match &result {
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
            result.map_err(|e| match e {
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
            })
        }
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

/// For session routes keyed by organization: the organization the request
/// names directly (query or path), without validating it yet (stage 4 does).
fn requested_org_hint<'a>(
    entry: &RouteEntry,
    head: &'a request::Parts,
    path_param: Option<&'a str>,
) -> Option<Cow<'a, str>> {
    match &entry.route.organization {
        OrgSource::Query(name) => Query::parse(head.uri.query())
            .ok()?
            .get(name)
            .map(|v| Cow::Owned(v.to_string())),
        OrgSource::Path(_) => path_param.map(Cow::Borrowed),
        OrgSource::Key(_) | OrgSource::None => None,
    }
}

fn query_error(e: QueryError) -> GatewayError {
    match e {
        QueryError::Repeated(name) => {
            GatewayError::bad_field(name, "repeated parameter (give it once)")
        }
        QueryError::Missing(name) => {
            GatewayError::bad_field(name, "required query parameter is missing")
        }
        QueryError::Empty(name) => GatewayError::bad_field(name, "must not be empty"),
        QueryError::BadEncoding(name) => {
            GatewayError::bad_field(name, "malformed percent-encoding (not UTF-8)")
        }
        QueryError::TooMany => GatewayError::bad_field("query", "too many parameters"),
    }
}
