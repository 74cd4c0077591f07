//! Stage 4: the organization a request is for, read where the route says
//! (a query parameter, the path, or the key the path names) and checked; and
//! the same organization unchecked, for stage 3's key. Query errors map to
//! 400 answers naming the parameter.
use http::request;
use std::borrow::Cow;

use super::table::{Pipeline, RouteEntry};
use crate::config::OrgSource;
use crate::error::GatewayError;
use crate::routes::{Query, QueryError};
use crate::store::ApiKeyRecord;

/// What stage 4 found: the organization asked for, and the key named by the
/// path when the route takes one (the key service uses it, saving a query;
/// boxed, so the proxying path's future keeps no room for it).
pub(super) struct Validated {
    pub(super) organization: Option<String>,
    pub(super) key: Option<Box<ApiKeyRecord>>,
}

impl Pipeline {
    /// Stage 4: the organization parameter, present once and non-empty; no
    /// repeated query parameter anywhere.
    pub(super) async fn validate(
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
                if let Some(lookalike) = query.lookalike(name) {
                    return Err(query_error(QueryError::Lookalike(lookalike, name.clone())));
                }
                v.organization = Some(query.require(name).map_err(query_error)?.to_string())
            }
            OrgSource::Path(_) => v.organization = path_param,
            OrgSource::Key(_) => {
                let id = path_param.unwrap_or_default();
                // Boxed: a store query's future is about 4 KiB, and inline it would
                // be room in every request's future, which is boxed per request.
                let key = Box::pin(self.store.get_api_key(&id))
                    .await
                    .map_err(GatewayError::from)?;
                let key = key.ok_or(GatewayError::NotFound)?;
                v.organization = Some(key.organization_id.clone());
                v.key = Some(Box::new(key));
            }
        }
        Ok(v)
    }
}

/// For session routes keyed by organization: the organization the request
/// names directly (query or path), without validating it yet (stage 4 does).
pub(super) fn requested_org_hint<'a>(
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
        QueryError::Lookalike(name, param) => GatewayError::bad_field(
            name,
            &format!(
                "reads as {param} to some upstream frameworks (send {param} once, as it is spelt)"
            ),
        ),
    }
}
