//! Stage 1: the checks every request passes before anything reads its
//! path (target form, a credential in the URL, header and body limits), then
//! the route lookup and the route's path parameter, percent-decoded.
use http::request;

use super::table::Pipeline;
use crate::error::GatewayError;
use crate::routes::{
    check_head, check_request_target, decode_segment, find_secret_param, path_holds_secret,
    RouteMatch,
};

impl Pipeline {
    /// Stage 1: target checks, header and body limits, route lookup.
    /// `declared` is the body's length as the server framed it (its
    /// `Content-Length`, parsed), not the field's text.
    pub(super) fn route(
        &self,
        head: &request::Parts,
        declared: Option<u64>,
    ) -> Result<(usize, Option<String>), GatewayError> {
        check_request_target(&head.uri, head.version)
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
}
