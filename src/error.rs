//! Every refusal the gateway makes, and the one place it becomes a response
//! (docs/api.md, "Errors"): status, `error` name, `message`, `details`, and the
//! headers that go with it; and what a key store error is as a refusal
//! (`From<StoreError>`). Internals (source chains) go to the log only.
use bytes::Bytes;
use http::header::{HeaderValue, ALLOW, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use http::{Response, StatusCode};
use serde_json::{json, Value};
use std::borrow::Cow;
use std::sync::OnceLock;

use crate::http_core::body::{self, Body};
use crate::http_core::service::Refusal;
use crate::logging::{Chain, Incident};
use crate::metrics::names;
use crate::store::StoreError;

/// Why a credential was refused (`details.reason` of a 401).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthReason {
    /// No Authorization header.
    Missing,
    /// Not `Bearer <token>`, or a token of the wrong shape.
    Malformed,
    /// Well-formed but unknown.
    Invalid,
    /// Past its `expires_at`.
    Expired,
    /// Revoked.
    Revoked,
    /// An API key on a session route, or a session token on an API-key route.
    WrongCredentialType,
    /// A JWT before its `nbf` or `iat` (less the leeway).
    NotYetValid,
    /// A valid JWT of a user the store does not know.
    UnknownUser,
    /// An API key switched off (`enabled = false`).
    Disabled,
}

// === impl AuthReason ===

impl AuthReason {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            AuthReason::Missing => "missing",
            AuthReason::Malformed => "malformed",
            AuthReason::Invalid => "invalid",
            AuthReason::Expired => "expired",
            AuthReason::Revoked => "revoked",
            AuthReason::WrongCredentialType => "wrong_credential_type",
            AuthReason::NotYetValid => "not_yet_valid",
            AuthReason::UnknownUser => "unknown_user",
            AuthReason::Disabled => "disabled",
        }
    }
}

/// A refusal, mapped to a response by [`GatewayError::into_response`].
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// 400; `field` names what failed.
    #[error("bad request: {message}")]
    BadRequest {
        /// Human text naming the field.
        message: Cow<'static, str>,
        /// `details.field`.
        field: Option<String>,
    },
    /// 401 with `WWW-Authenticate: Bearer`.
    #[error("unauthorized: {}", .0.as_str())]
    Unauthorized(AuthReason),
    /// 403; the permission the route needs.
    #[error("forbidden: requires {required_scope}")]
    Forbidden {
        /// `details.required_scope`.
        required_scope: String,
    },
    /// 403 with a reason rather than a missing scope: what the request is
    /// (the admin listener's refusal of what a browser page could send), or
    /// an act only another user may do (`not_key_owner`).
    #[error("forbidden: {reason}")]
    ForbiddenRequest {
        /// `details.reason`, e.g. `cross_site`.
        reason: &'static str,
        /// Human text saying what to do instead.
        message: &'static str,
    },
    /// 404: no such route or resource, or the caller may not see it.
    #[error("not found")]
    NotFound,
    /// 405 with `Allow`.
    #[error("method not allowed")]
    MethodNotAllowed {
        /// Methods the path accepts.
        allow: HeaderValue,
    },
    /// 421: the Host names a server this listener does not answer for.
    #[error("misdirected request")]
    MisdirectedRequest,
    /// 413.
    #[error("request body over {limit} bytes")]
    PayloadTooLarge {
        /// `server.limits.max_body_bytes`.
        limit: u64,
    },
    /// 431.
    #[error("request headers over {limit} bytes")]
    HeaderFieldsTooLarge {
        /// `server.limits.max_header_bytes`.
        limit: usize,
    },
    /// 409.
    #[error("conflict: {0}")]
    Conflict(String),
    /// 429 with `Retry-After` (rate-limit headers are added by the pipeline).
    #[error("too many requests")]
    TooManyRequests {
        /// Whole seconds, at least 1.
        retry_after: u64,
    },
    /// 429: the key's credits are used up (`details.reason =
    /// "credits_exhausted"`); `Retry-After` until the next refill, if any.
    #[error("credits exhausted")]
    CreditsExhausted {
        /// Whole seconds to the next refill; `None` without a refill.
        retry_after: Option<u64>,
    },
    /// 500. The source is logged, never sent.
    #[error("internal error: {0}")]
    Internal(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// 502.
    #[error("bad gateway: {0}")]
    BadGateway(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// 503 with `Retry-After`.
    #[error("service unavailable: {what}")]
    ServiceUnavailable {
        /// What is unavailable, for the message ("key store", "upstream clusters").
        what: Cow<'static, str>,
        /// Whole seconds, at least 1.
        retry_after: u64,
    },
    /// 504.
    #[error("gateway timeout")]
    GatewayTimeout,
}

/// `message`, or `instead` when it holds what looks like a secret: the
/// texts of a 400 and a 409 often quote the client's value, and a body never
/// carries a credential back.
fn unquoted_secret(message: &str, instead: impl FnOnce() -> String) -> Cow<'static, str> {
    if crate::secret::looks_like_secret(message.bytes()) {
        format!(
            "{} (the value is not repeated: it holds what looks like a credential)",
            instead()
        )
        .into()
    } else {
        message.to_owned().into()
    }
}

// === impl From<Refusal> ===

/// A head the HTTP/1.1 server refused, as the gateway's JSON error.
impl From<Refusal> for GatewayError {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::BadRequest(what) => GatewayError::BadRequest {
                message: format!("invalid request: {what}").into(),
                field: None,
            },
            Refusal::HeaderFieldsTooLarge { limit } => GatewayError::HeaderFieldsTooLarge { limit },
        }
    }
}

// === impl GatewayError ===

impl GatewayError {
    /// 400 naming `field` in `message` and `details.field`.
    pub fn bad_field(field: impl Into<String>, what: &str) -> Self {
        let field = field.into();
        GatewayError::BadRequest {
            message: format!("{field}: {what}").into(),
            field: Some(field),
        }
    }

    /// The status this error answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            GatewayError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            GatewayError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            GatewayError::Forbidden { .. } | GatewayError::ForbiddenRequest { .. } => {
                StatusCode::FORBIDDEN
            }
            GatewayError::NotFound => StatusCode::NOT_FOUND,
            GatewayError::MisdirectedRequest => StatusCode::MISDIRECTED_REQUEST,
            GatewayError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            GatewayError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            GatewayError::HeaderFieldsTooLarge { .. } => {
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
            }
            GatewayError::Conflict(_) => StatusCode::CONFLICT,
            GatewayError::TooManyRequests { .. } | GatewayError::CreditsExhausted { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
            GatewayError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            GatewayError::BadGateway(_) => StatusCode::BAD_GATEWAY,
            GatewayError::ServiceUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            GatewayError::GatewayTimeout => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// The `error` name in the JSON body (`Unauthorized`, `NotFound`, …).
    pub fn name(&self) -> &'static str {
        match self {
            GatewayError::BadRequest { .. } => "BadRequest",
            GatewayError::Unauthorized(_) => "Unauthorized",
            GatewayError::Forbidden { .. } | GatewayError::ForbiddenRequest { .. } => "Forbidden",
            GatewayError::NotFound => "NotFound",
            GatewayError::MisdirectedRequest => "MisdirectedRequest",
            GatewayError::MethodNotAllowed { .. } => "MethodNotAllowed",
            GatewayError::PayloadTooLarge { .. } => "PayloadTooLarge",
            GatewayError::HeaderFieldsTooLarge { .. } => "RequestHeaderFieldsTooLarge",
            GatewayError::Conflict(_) => "Conflict",
            GatewayError::TooManyRequests { .. } | GatewayError::CreditsExhausted { .. } => {
                "TooManyRequests"
            }
            GatewayError::Internal(_) => "InternalError",
            GatewayError::BadGateway(_) => "BadGateway",
            GatewayError::ServiceUnavailable { .. } => "ServiceUnavailable",
            GatewayError::GatewayTimeout => "GatewayTimeout",
        }
    }

    /// `details.reason` of a 401 or of a 403 refusing the request itself:
    /// what a trace records of the refusal, beside [`Self::name`].
    pub fn reason(&self) -> Option<&'static str> {
        match self {
            GatewayError::Unauthorized(reason) => Some(reason.as_str()),
            GatewayError::ForbiddenRequest { reason, .. } => Some(reason),
            GatewayError::CreditsExhausted { .. } => Some("credits_exhausted"),
            _ => None,
        }
    }

    /// `message` and `details` for the client. Never includes a source chain.
    fn message_and_details(&self) -> (Cow<'static, str>, Option<Value>) {
        match self {
            GatewayError::BadRequest { message, field } => (
                unquoted_secret(message, || {
                    format!("{}: invalid", field.as_deref().unwrap_or("request"))
                }),
                field.as_ref().map(|f| json!({ "field": f })),
            ),
            GatewayError::Unauthorized(reason) => {
                let message = match reason {
                    AuthReason::Missing => "an Authorization: Bearer header is required",
                    AuthReason::Malformed => "the Authorization header or its token is malformed",
                    AuthReason::Invalid => "the credential is not valid",
                    AuthReason::Expired => "the credential has expired",
                    AuthReason::Revoked => "the credential has been revoked",
                    AuthReason::WrongCredentialType => {
                        "this endpoint does not accept this type of credential"
                    }
                    AuthReason::NotYetValid => "the credential is not valid yet",
                    AuthReason::UnknownUser => {
                        "the credential names a user this service does not know"
                    }
                    AuthReason::Disabled => "the API key is disabled",
                };
                (message.into(), Some(json!({ "reason": reason.as_str() })))
            }
            GatewayError::Forbidden { required_scope } => (
                format!("the credential lacks the permission {required_scope}").into(),
                Some(json!({ "required_scope": required_scope })),
            ),
            GatewayError::ForbiddenRequest { reason, message } => {
                ((*message).into(), Some(json!({ "reason": reason })))
            }
            GatewayError::NotFound => (
                "the resource does not exist or is not accessible".into(),
                None,
            ),
            GatewayError::MisdirectedRequest => (
                "this listener does not answer for the host the request names".into(),
                None,
            ),
            GatewayError::MethodNotAllowed { allow } => (
                "method not allowed for this path".into(),
                Some(json!({ "allow": allow.to_str().unwrap_or_default() })),
            ),
            GatewayError::PayloadTooLarge { limit } => (
                format!("request body exceeds {limit} bytes").into(),
                Some(json!({ "limit": limit })),
            ),
            GatewayError::HeaderFieldsTooLarge { limit } => (
                format!("request headers exceed {limit} bytes").into(),
                Some(json!({ "limit": limit })),
            ),
            GatewayError::Conflict(message) => (
                unquoted_secret(message, || {
                    "the change conflicts with what is stored".into()
                }),
                None,
            ),
            GatewayError::TooManyRequests { retry_after } => (
                "rate limit exceeded".into(),
                Some(json!({ "retry_after": retry_after })),
            ),
            GatewayError::CreditsExhausted { retry_after } => {
                let mut details = json!({ "reason": "credits_exhausted" });
                if let Some(secs) = retry_after {
                    details["retry_after"] = json!(secs);
                }
                ("the API key has no credits left".into(), Some(details))
            }
            GatewayError::Internal(_) => ("internal error".into(), None),
            GatewayError::BadGateway(_) => {
                ("the upstream service could not be reached".into(), None)
            }
            GatewayError::ServiceUnavailable { what, .. } => {
                (format!("{what} is unavailable; retry later").into(), None)
            }
            GatewayError::GatewayTimeout => {
                ("the upstream service did not answer in time".into(), None)
            }
        }
    }

    /// The JSON body: `error`, `message` and, when there are any, `details`.
    pub fn body_bytes(&self) -> Bytes {
        // The bodies a flood gets (bad keys, rate-limited clients) skip the
        // JSON tree: each 401 body is fixed per reason and rendered once, the
        // 429 body differs only in one number. Tests pin both to `render`.
        match self {
            GatewayError::Unauthorized(reason) => {
                static BODIES: [OnceLock<Bytes>; 9] = [const { OnceLock::new() }; 9];
                BODIES[*reason as usize]
                    .get_or_init(|| self.render())
                    .clone()
            }
            GatewayError::TooManyRequests { retry_after } => Bytes::from(format!(
                r#"{{"details":{{"retry_after":{retry_after}}},"error":"TooManyRequests","message":"rate limit exceeded"}}"#
            )),
            _ => self.render(),
        }
    }

    /// The body through the general path: a JSON tree, serialized.
    fn render(&self) -> Bytes {
        let (message, details) = self.message_and_details();
        let mut v = json!({ "error": self.name(), "message": message });
        if let Some(d) = details {
            v["details"] = d;
        }
        Bytes::from(serde_json::to_vec(&v).unwrap_or_default())
    }

    /// The response: status, JSON body and the headers this error carries.
    pub fn into_response(self) -> Response<Body> {
        let mut res = Response::new(body::full(self.body_bytes()));
        *res.status_mut() = self.status();
        let h = res.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        match &self {
            GatewayError::Unauthorized(_) => {
                h.insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            GatewayError::MethodNotAllowed { allow } => {
                h.insert(ALLOW, allow.clone());
            }
            GatewayError::TooManyRequests { retry_after }
            | GatewayError::ServiceUnavailable { retry_after, .. } => {
                h.insert(RETRY_AFTER, HeaderValue::from((*retry_after).max(1)));
            }
            GatewayError::CreditsExhausted {
                retry_after: Some(secs),
            } => {
                h.insert(RETRY_AFTER, HeaderValue::from((*secs).max(1)));
            }
            _ => {}
        }
        res
    }
}

// === impl From<StoreError> for GatewayError ===

/// The key store's failures, as requests refused for them.
static STORE_INCIDENT: Incident = Incident::new();

impl From<StoreError> for GatewayError {
    /// What the store says as the client's answer: a missing thing is a 404,
    /// a conflict a 409 with the store's text, refused input a 400 with it.
    /// A store that cannot answer is a 503, never a 401 (the client's key
    /// may be fine), counted in `names::STORE_ERRORS` and logged as one
    /// incident: a line when it begins, then a count per summary interval.
    /// No recovery line: watching the store's answers would cost every
    /// lookup, cached ones included; a failure after a quiet interval begins
    /// a new incident.
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(_) => GatewayError::NotFound,
            StoreError::Conflict(what) => GatewayError::Conflict(what),
            StoreError::Invalid(_) => GatewayError::BadRequest {
                message: e.to_string().into(),
                field: None,
            },
            StoreError::Unreachable(_) | StoreError::Unavailable(_) | StoreError::Timeout => {
                metrics::counter!(names::STORE_ERRORS).increment(1);
                if let Some(line) = STORE_INCIDENT.failed(crate::logging::now_ms()) {
                    let cause = Chain(&e);
                    line.log(
                        tracing::Level::WARN,
                        &"key store",
                        "requests refused",
                        &cause,
                    );
                }
                GatewayError::ServiceUnavailable {
                    what: "the key store".into(),
                    retry_after: 1,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn parts(e: GatewayError) -> (StatusCode, http::HeaderMap, Value) {
        let res = e.into_response();
        let (p, b) = res.into_parts();
        let bytes = b.collect().await.unwrap().to_bytes();
        (p.status, p.headers, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn unauthorized_names_the_reason_and_asks_for_bearer() {
        let (status, h, v) = parts(GatewayError::Unauthorized(AuthReason::Expired)).await;
        assert_eq!(status, 401);
        assert_eq!(h[WWW_AUTHENTICATE], "Bearer");
        assert_eq!(h[CONTENT_TYPE], "application/json");
        assert_eq!(v["error"], "Unauthorized");
        assert_eq!(v["details"]["reason"], "expired");
    }

    #[tokio::test]
    async fn a_bad_value_that_holds_a_secret_is_not_repeated() {
        let secret = crate::secret::generate_session_token();
        let quoted = format!("invalid duration \"3{secret}\"");
        let (status, _, v) = parts(GatewayError::bad_field("per", &quoted)).await;
        assert_eq!(status, 400);
        assert_eq!(v["details"]["field"], "per");
        let text = v.to_string();
        assert!(
            !text.contains(&secret[4..]) && text.contains("per: invalid"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn no_400_or_409_quotes_a_secret_however_it_was_made() {
        let secret = crate::secret::generate_api_key().0;
        for e in [
            GatewayError::BadRequest {
                message: format!("invalid request: {secret}").into(),
                field: None,
            },
            GatewayError::Conflict(format!("organization x{secret} already exists")),
        ] {
            let (_, _, v) = parts(e).await;
            assert!(!v.to_string().contains(&secret[4..]), "{v}");
        }
    }

    #[tokio::test]
    async fn bad_request_names_the_field() {
        let (status, _, v) = parts(GatewayError::bad_field("organization_id", "is required")).await;
        assert_eq!(status, 400);
        assert_eq!(v["error"], "BadRequest");
        assert!(v["message"].as_str().unwrap().contains("organization_id"));
        assert_eq!(v["details"]["field"], "organization_id");
    }

    #[tokio::test]
    async fn internals_never_reach_the_client() {
        let e = GatewayError::Internal("db password=hunter2 mpg_secret".into());
        let (status, _, v) = parts(e).await;
        assert_eq!(status, 500);
        assert_eq!(v["error"], "InternalError");
        assert!(!v.to_string().contains("hunter2"));
        let (status, h, v) = parts(GatewayError::ServiceUnavailable {
            what: "key store".into(),
            retry_after: 0,
        })
        .await;
        assert_eq!(status, 503);
        assert_eq!(h[RETRY_AFTER], "1");
        assert_eq!(v["error"], "ServiceUnavailable");
    }

    #[tokio::test]
    async fn method_not_allowed_carries_allow() {
        let (status, h, v) = parts(GatewayError::MethodNotAllowed {
            allow: HeaderValue::from_static("GET, POST"),
        })
        .await;
        assert_eq!(status, 405);
        assert_eq!(h[ALLOW], "GET, POST");
        assert_eq!(v["error"], "MethodNotAllowed");
    }

    #[tokio::test]
    async fn store_errors_answer_as_the_store_said() {
        let (status, _, v) = parts(StoreError::NotFound("organization acme".into()).into()).await;
        assert_eq!(
            (status.as_u16(), v["error"].as_str()),
            (404, Some("NotFound"))
        );
        let conflict = StoreError::Conflict("organization acme already exists".into());
        let (status, _, v) = parts(conflict.into()).await;
        assert_eq!(status, 409);
        assert_eq!(v["message"], "organization acme already exists");
        let (status, _, v) = parts(StoreError::Invalid("role".into()).into()).await;
        assert_eq!(status, 400);
        assert_eq!(v["message"], "invalid role");
        assert_eq!(v.get("details"), None);
        for down in [
            StoreError::Timeout,
            StoreError::Unreachable(std::sync::Arc::new(std::io::Error::other("db password=x"))),
        ] {
            let (status, h, v) = parts(down.into()).await;
            assert_eq!(
                (status.as_u16(), h[RETRY_AFTER].to_str().ok()),
                (503, Some("1"))
            );
            assert_eq!(v["message"], "the key store is unavailable; retry later");
            assert!(!v.to_string().contains("password"), "{v}");
        }
    }

    #[test]
    fn fast_bodies_match_the_general_rendering() {
        use AuthReason::*;
        for reason in [
            Missing,
            Malformed,
            Invalid,
            Expired,
            Revoked,
            WrongCredentialType,
            NotYetValid,
            UnknownUser,
        ] {
            let e = GatewayError::Unauthorized(reason);
            assert_eq!(e.body_bytes(), e.render(), "{reason:?}");
            assert_eq!(e.body_bytes(), e.render(), "{reason:?} (cached)");
        }
        for retry_after in [0, 1, 59, 3600, u64::MAX] {
            let e = GatewayError::TooManyRequests { retry_after };
            assert_eq!(e.body_bytes(), e.render(), "retry_after {retry_after}");
        }
    }
}
