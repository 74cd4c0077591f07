//! The admin API, `/admin/v1` on the admin listener: organizations, users,
//! memberships, sessions, organizations' limits, and keys (`keys.rs`), for
//! a dashboard's backend or a provisioning job, behind `Authorization: Bearer mpga_…` (an admin token, looked up in
//! the store on every request, so a revocation holds at once). The store's
//! operations are the ones the command line calls; this is their HTTP face.
use bytes::Bytes;
use http::header::{HeaderValue, AUTHORIZATION};
use http::{Method, Request, Response, StatusCode};
use serde_json::{Map, Value};
use std::time::Duration;

mod keys;

use super::json_response;
use super::render;
use crate::config::Settings;
use crate::error::{AuthReason, GatewayError};
use crate::http_core::body::{self, Body, RequestBody};
use crate::secret::{check_admin_token_format, hash_secret};
use crate::store::sql::SqlStore;
use crate::store::{Actor, AdminToken, LimitSpec, StoreError};

/// Where the admin API lives on the admin listener.
pub(super) const PREFIX: &str = "/admin/v1/";

/// Largest request body the admin API reads.
const MAX_BODY: u64 = 64 * 1024;

/// Longest session an admin token may hand out: 30 days.
const MAX_TTL_SECONDS: u64 = 30 * 24 * 3600;

/// Serves one `/admin/v1` request with `store` and `settings`.
/// Serves one `/admin/v1` request from `client` (an IP address, for the
/// audit trail) with `store` and `settings`.
pub(crate) async fn serve(
    store: &SqlStore,
    settings: &Settings,
    req: Request<RequestBody>,
    client: &str,
) -> Response<Body> {
    match answer(store, settings, req, client).await {
        Ok(res) => res,
        Err(e) => e.into_response(),
    }
}

/// What every admin API answer needs besides its route and body.
#[derive(Clone, Copy)]
pub(super) struct Ctx<'a> {
    pub(super) store: &'a SqlStore,
    pub(super) settings: &'a Settings,
    /// The audit trail's actor: the admin token, from this client.
    pub(super) actor: &'a Actor,
    pub(super) query: Option<&'a str>,
}

async fn answer(
    store: &SqlStore,
    settings: &Settings,
    req: Request<RequestBody>,
    client: &str,
) -> Result<Response<Body>, GatewayError> {
    let token = authenticate(store, req.headers()).await?;
    // The audit trail's actor: the admin token, from this client.
    let actor = &Actor {
        user_id: Some(token.id),
        request_id: None,
        client: Some(client.to_owned()),
    };
    let (head, body) = req.into_parts();
    let path = head.uri.path().strip_prefix(PREFIX).unwrap_or("");
    // Ids in the path are percent-decoded, as a client encodes them.
    let decoded: Vec<std::borrow::Cow<'_, str>> = path
        .split('/')
        .map(|s| {
            crate::routes::decode_segment(s)
                .ok_or_else(|| GatewayError::bad_field("path", "malformed percent-encoding"))
        })
        .collect::<Result<_, _>>()?;
    let segments: Vec<&str> = decoded.iter().map(|s| s.as_ref()).collect();
    let ctx = Ctx {
        store,
        settings,
        actor,
        query: head.uri.query(),
    };
    let m = &head.method;
    match segments.as_slice() {
        ["organizations", _, "members", ..] => members(&ctx, m, &segments, body).await,
        ["organizations", _, "limits", ..] => limits(&ctx, m, &segments, body).await,
        ["organizations", _, "keys" | "audit-events"] => {
            keys::of_organization(&ctx, m, &segments, body).await
        }
        ["keys", ..] => keys::key(&ctx, m, &segments, body).await,
        ["organizations", ..] => organizations(&ctx, m, &segments, body).await,
        ["sessions", ..] | ["users", _, "sessions", ..] => sessions(&ctx, m, &segments, body).await,
        ["users", ..] => users(&ctx, m, &segments, body).await,
        _ => Err(not_allowed_or_not_found(&segments)),
    }
}

/// `/organizations` and `/organizations/{id}`: create, list, get, delete.
async fn organizations(
    ctx: &Ctx<'_>,
    m: &Method,
    segments: &[&str],
    body: RequestBody,
) -> Result<Response<Body>, GatewayError> {
    let Ctx {
        store,
        actor,
        query,
        ..
    } = *ctx;
    match (m, segments) {
        (&Method::POST, ["organizations"]) => {
            let input = object(body, &["id", "name"]).await?;
            let id = required_string(&input, "id")?;
            let name = optional_string(&input, "name")?;
            let created = store
                .create_organization_by(&id, name.as_deref(), actor)
                .await;
            Ok(json_response(
                StatusCode::CREATED,
                &render::organization(&created.map_err(id_error)?),
            ))
        }
        (&Method::GET, ["organizations"]) => {
            let (limit, cursor) = crate::keys_service::paging(query)?;
            let rows = store
                .list_organizations_after(cursor.as_deref(), limit + 1)
                .await;
            let rows = rows.map_err(store_error)?;
            Ok(read_page(
                rows.iter().map(render::organization).collect(),
                limit,
                "id",
            ))
        }
        (&Method::GET, ["organizations", id]) => {
            let found = store.get_organization(id).await.map_err(store_error)?;
            Ok(json_response(
                StatusCode::OK,
                &render::organization(&found.ok_or(GatewayError::NotFound)?),
            ))
        }
        (&Method::DELETE, ["organizations", id]) => {
            let removed = store
                .delete_organization_by(id, actor)
                .await
                .map_err(store_error)?;
            removed.map(|_| no_content()).ok_or(GatewayError::NotFound)
        }
        (_, segments) => Err(not_allowed_or_not_found(segments)),
    }
}

/// `/users` and `/users/{id}`: create, list, get, delete.
async fn users(
    ctx: &Ctx<'_>,
    m: &Method,
    segments: &[&str],
    body: RequestBody,
) -> Result<Response<Body>, GatewayError> {
    let Ctx {
        store,
        actor,
        query,
        ..
    } = *ctx;
    match (m, segments) {
        (&Method::POST, ["users"]) => {
            let input = object(body, &["id", "email"]).await?;
            let id = required_string(&input, "id")?;
            let email = optional_string(&input, "email")?;
            let created = store.create_user(&id, email.as_deref()).await;
            Ok(json_response(
                StatusCode::CREATED,
                &render::user(&created.map_err(id_error)?),
            ))
        }
        (&Method::GET, ["users"]) => {
            let (limit, cursor) = crate::keys_service::paging(query)?;
            let rows = store.list_users_after(cursor.as_deref(), limit + 1).await;
            let rows = rows.map_err(store_error)?;
            Ok(read_page(
                rows.iter().map(render::user).collect(),
                limit,
                "id",
            ))
        }
        (&Method::GET, ["users", id]) => {
            let found = store.get_user(id).await.map_err(store_error)?;
            Ok(json_response(
                StatusCode::OK,
                &render::user(&found.ok_or(GatewayError::NotFound)?),
            ))
        }
        (&Method::DELETE, ["users", id]) => {
            let removed = store.delete_user_by(id, actor).await.map_err(store_error)?;
            removed.map(|_| no_content()).ok_or(GatewayError::NotFound)
        }
        (_, segments) => Err(not_allowed_or_not_found(segments)),
    }
}

/// `/organizations/{org}/members[/{user}]`: set a role, list, remove.
async fn members(
    ctx: &Ctx<'_>,
    m: &Method,
    segments: &[&str],
    body: RequestBody,
) -> Result<Response<Body>, GatewayError> {
    let Ctx {
        store,
        settings,
        actor,
        query,
    } = *ctx;
    match (m, segments) {
        (&Method::PUT, ["organizations", org, "members", user]) => {
            let input = object(body, &["role"]).await?;
            let role = required_string(&input, "role")?;
            if !settings.roles.contains(&role) {
                let names = settings.roles.names().join(", ");
                return Err(GatewayError::bad_field(
                    "role",
                    &format!("unknown role; the roles of [roles]: {names}"),
                ));
            }
            let set = store
                .set_member_by(org, user, &role, actor)
                .await
                .map_err(store_error)?;
            Ok(json_response(StatusCode::OK, &render::membership(&set)))
        }
        (&Method::GET, ["organizations", org, "members"]) => {
            let found = store.get_organization(org).await.map_err(store_error)?;
            found.ok_or(GatewayError::NotFound)?;
            let members = store.list_members(org).await.map_err(store_error)?;
            let all = members.iter().map(render::membership).collect();
            page(all, query, "user_id")
        }
        (&Method::DELETE, ["organizations", org, "members", user]) => {
            let removed = store
                .remove_member_by(org, user, actor)
                .await
                .map_err(store_error)?;
            removed.map(|_| no_content()).ok_or(GatewayError::NotFound)
        }
        (_, segments) => Err(not_allowed_or_not_found(segments)),
    }
}

/// `/sessions[/{id}]` and `/users/{user}/sessions`: create, list, revoke.
async fn sessions(
    ctx: &Ctx<'_>,
    m: &Method,
    segments: &[&str],
    body: RequestBody,
) -> Result<Response<Body>, GatewayError> {
    let Ctx {
        store,
        actor,
        query,
        ..
    } = *ctx;
    match (m, segments) {
        (&Method::POST, ["sessions"]) => {
            let input = object(body, &["user_id", "ttl_seconds"]).await?;
            let user = required_string(&input, "user_id")?;
            let ttl = match input.get("ttl_seconds") {
                Some(Value::Number(n)) => n
                    .as_u64()
                    .filter(|s| (1..=MAX_TTL_SECONDS).contains(s))
                    .ok_or_else(|| {
                        GatewayError::bad_field(
                            "ttl_seconds",
                            "must be a whole number of seconds from 1 to 2592000 (30 days)",
                        )
                    })?,
                None => 12 * 3600,
                Some(_) => return Err(GatewayError::bad_field("ttl_seconds", "must be a number")),
            };
            let created = store
                .create_session_by(&user, Duration::from_secs(ttl), actor)
                .await;
            let (token, session) = created.map_err(store_error)?;
            let mut out = render::session(&session);
            out["token"] = Value::String(token);
            Ok(json_response(StatusCode::CREATED, &out))
        }
        (&Method::GET, ["users", user, "sessions"]) => {
            let found = store.get_user(user).await.map_err(store_error)?;
            found.ok_or(GatewayError::NotFound)?;
            let sessions = store.list_sessions(user).await.map_err(store_error)?;
            page(sessions.iter().map(render::session).collect(), query, "id")
        }
        (&Method::DELETE, ["sessions", id]) => {
            let revoked = store
                .revoke_session_by(id, actor)
                .await
                .map_err(store_error)?;
            revoked.map(|_| no_content()).ok_or(GatewayError::NotFound)
        }
        (_, segments) => Err(not_allowed_or_not_found(segments)),
    }
}

/// `/organizations/{org}/limits[/{policy}]`: set, list, unset.
async fn limits(
    ctx: &Ctx<'_>,
    m: &Method,
    segments: &[&str],
    body: RequestBody,
) -> Result<Response<Body>, GatewayError> {
    let Ctx {
        store,
        settings,
        actor,
        query,
    } = *ctx;
    match (m, segments) {
        (&Method::PUT, ["organizations", org, "limits", policy]) => {
            known_policy(settings, policy)?;
            let input = object(body, &["requests", "per"]).await?;
            let requests = match input.get("requests") {
                Some(Value::Number(n)) => n.as_u64().unwrap_or(0),
                None => return Err(GatewayError::bad_field("requests", "is required")),
                Some(_) => return Err(GatewayError::bad_field("requests", "must be a number")),
            };
            let per = required_string(&input, "per")?;
            let limit = LimitSpec::parse(requests, &per)
                .map_err(|p| GatewayError::bad_field(p.field, &p.reason))?;
            let set = store.set_org_limit_by(org, policy, limit, actor).await;
            Ok(json_response(
                StatusCode::OK,
                &render::org_limit(&set.map_err(store_error)?),
            ))
        }
        (&Method::GET, ["organizations", org, "limits"]) => {
            let found = store.get_organization(org).await.map_err(store_error)?;
            found.ok_or(GatewayError::NotFound)?;
            let limits = store.list_org_limits(org).await.map_err(store_error)?;
            let all = limits.iter().map(render::org_limit).collect();
            page(all, query, "policy")
        }
        (&Method::DELETE, ["organizations", org, "limits", policy]) => {
            known_policy(settings, policy)?;
            let removed = store
                .unset_org_limit_by(org, policy, actor)
                .await
                .map_err(store_error)?;
            removed.map(|_| no_content()).ok_or(GatewayError::NotFound)
        }
        (_, segments) => Err(not_allowed_or_not_found(segments)),
    }
}

/// The caller must bear a live admin token: 401 (`malformed`, `invalid`)
/// otherwise, or 503 when the store cannot say.
pub(super) async fn authenticate(
    store: &SqlStore,
    headers: &http::HeaderMap,
) -> Result<AdminToken, GatewayError> {
    let mut values = headers.get_all(AUTHORIZATION).iter();
    let value = values
        .next()
        .ok_or(GatewayError::Unauthorized(AuthReason::Missing))?;
    if values.next().is_some() {
        return Err(GatewayError::Unauthorized(AuthReason::Malformed));
    }
    let token = value
        .to_str()
        .ok()
        .and_then(|v| {
            v.get(..7)
                .filter(|s| s.eq_ignore_ascii_case("bearer "))
                .map(|_| &v[7..])
        })
        .filter(|t| check_admin_token_format(t).is_ok())
        .ok_or(GatewayError::Unauthorized(AuthReason::Malformed))?;
    match store.admin_token_by_hash(&hash_secret(token)).await {
        Ok(Some(token)) => Ok(token),
        Ok(None) => Err(GatewayError::Unauthorized(AuthReason::Invalid)),
        Err(e) => Err(e.into()),
    }
}

/// 405 with `Allow` for a path the API serves with other methods; else 404.
pub(super) fn not_allowed_or_not_found(segments: &[&str]) -> GatewayError {
    let allow = match segments {
        ["organizations"] | ["users"] | ["organizations", _, "keys"] => "GET, POST",
        ["organizations", _, "audit-events"] => "GET",
        ["keys", _] => "GET, PATCH, DELETE",
        ["keys", _, "revoke" | "rotate"] => "POST",
        ["organizations", _] | ["users", _] => "GET, DELETE",
        ["organizations", _, "members"] | ["users", _, "sessions"] => "GET",
        ["organizations", _, "members", _] | ["organizations", _, "limits", _] => "PUT, DELETE",
        ["organizations", _, "limits"] => "GET",
        ["sessions"] => "POST",
        ["sessions", _] => "DELETE",
        _ => return GatewayError::NotFound,
    };
    GatewayError::MethodNotAllowed {
        allow: HeaderValue::from_static(allow),
    }
}

/// 400 naming `policy` unless it is a configured policy.
fn known_policy(settings: &Settings, policy: &str) -> Result<(), GatewayError> {
    if settings.policy_index(policy).is_some() {
        return Ok(());
    }
    let names: Vec<&str> = (settings.rate_limit.policies.iter())
        .map(|p| p.name.as_str())
        .collect();
    Err(GatewayError::bad_field(
        "policy",
        &format!(
            "unknown policy; the policies of [rate_limit.policies]: {}",
            names.join(", ")
        ),
    ))
}

/// The request body, up to [`MAX_BODY`] bytes (413 past it).
pub(super) async fn read_bytes(body: RequestBody) -> Result<Bytes, GatewayError> {
    let body = Body::new(crate::http_core::body::Limited::new(body, MAX_BODY));
    crate::keys_service::read_body(body, MAX_BODY).await
}

/// The request body as a JSON object holding only `fields`.
async fn object(body: RequestBody, fields: &[&str]) -> Result<Map<String, Value>, GatewayError> {
    let map = crate::keys_service::json_object(&read_bytes(body).await?)?;
    if let Some(unknown) = map.keys().find(|k| !fields.contains(&k.as_str())) {
        if crate::secret::looks_like_secret(unknown.bytes()) {
            return Err(GatewayError::bad_field("body", "holds an unknown field"));
        }
        return Err(GatewayError::bad_field(unknown.as_str(), "unknown field"));
    }
    Ok(map)
}

pub(super) fn required_string(
    input: &Map<String, Value>,
    field: &str,
) -> Result<String, GatewayError> {
    match input.get(field) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(Value::String(_)) => Err(GatewayError::bad_field(field, "must not be empty")),
        Some(_) => Err(GatewayError::bad_field(field, "must be a string")),
        None => Err(GatewayError::bad_field(field, "is required")),
    }
}

fn optional_string(
    input: &Map<String, Value>,
    field: &str,
) -> Result<Option<String>, GatewayError> {
    match input.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(GatewayError::bad_field(field, "must be a string")),
    }
}

/// One page of `all`, ordered by its `key` field: `limit` (1-100, default
/// 20) items after `cursor` (the last key of the page before).
fn page(
    mut all: Vec<Value>,
    query: Option<&str>,
    key: &str,
) -> Result<Response<Body>, GatewayError> {
    let (limit, cursor) = crate::keys_service::paging(query)?;
    let key_of = |v: &Value| v[key].as_str().unwrap_or_default().to_owned();
    all.sort_by_key(key_of);
    let start = match &cursor {
        Some(c) => all.partition_point(|v| key_of(v).as_str() <= c.as_str()),
        None => 0,
    };
    let rest: Vec<Value> = all.into_iter().skip(start).collect();
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let next = (rest.len() > limit).then(|| key_of(&rest[limit - 1]));
    let data: Vec<Value> = rest.into_iter().take(limit).collect();
    Ok(crate::keys_service::page_response(data, next))
}

/// The answer for `rows`, read from the store as up to `limit + 1` rows in
/// `key` order: the first `limit`, and the cursor after them if there are more.
fn read_page(mut rows: Vec<Value>, limit: u32, key: &str) -> Response<Body> {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let next = (rows.len() > limit).then(|| {
        rows.truncate(limit);
        rows[limit - 1][key].as_str().unwrap_or_default().to_owned()
    });
    crate::keys_service::page_response(rows, next)
}

/// A store error as the API's answer (404, 409, 400 naming what is wrong,
/// or 503: `From<StoreError> for GatewayError`), what was not found logged.
fn store_error(e: StoreError) -> GatewayError {
    if let StoreError::NotFound(what) = &e {
        tracing::debug!(%what, "admin API: not found");
    }
    e.into()
}

/// [`store_error`] for a creation, whose only invalid input is its `id`.
fn id_error(e: StoreError) -> GatewayError {
    match e {
        StoreError::Invalid(what) => GatewayError::bad_field("id", &format!("invalid {what}")),
        other => store_error(other),
    }
}

pub(super) fn no_content() -> Response<Body> {
    let mut res = Response::new(body::empty());
    *res.status_mut() = StatusCode::NO_CONTENT;
    res
}
