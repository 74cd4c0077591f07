//! The built-in API key service (`builtin = "api-keys"`).
//!
//! It runs after the pipeline: the caller is authenticated (session), the
//! organization validated and the route's scope checked. What is left here
//! is the endpoint's own validation, the role check on requested scopes, the
//! store call, and in-process cache invalidation (so a revoke is seen at once).
use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Map, Value};
use std::sync::Arc;

mod input;
pub mod render;

pub use input::MAX_GRACE_SECONDS;
use input::{create_controls, key_update, only_fields, parse_future_time, rate_limit};
pub(crate) use input::{grace_period, json_object, paging};

use crate::auth::Principal;
use crate::clock::unix_now;
use crate::config::Operation;
use crate::config::Settings;
use crate::error::GatewayError;
use crate::http_core::body::{self, Body};
use crate::secret::looks_like_secret;
use crate::store::cache::CachedKeyStore;
use crate::store::sql::{CreditsUpdate, KeyUpdate, SqlStore};
use crate::store::{Actor, ApiKeyRecord, Change, StoreError};
use crate::store::{KeyControls, LimitSpec, NewApiKey};

/// The fields a create body may hold.
const CREATE_FIELDS: [&str; 8] = [
    "name",
    "scopes",
    "expires_at",
    "rate_limit",
    "enabled",
    "ip_allow",
    "meta",
    "credits",
];

/// Who is calling, as established by the pipeline.
pub struct Caller<'a> {
    /// The authenticated session (or key).
    pub principal: &'a Principal,
    /// The organization the request is for (already authorized).
    pub organization: &'a str,
    /// The caller's current role there.
    pub role: &'a str,
    /// The request's id (`X-Request-Id`), for the audit trail.
    pub request_id: &'a str,
    /// The client's IP address, for the audit trail.
    pub client: &'a str,
}

impl Caller<'_> {
    /// The audit trail's actor: the calling user, this request, this client.
    fn actor(&self) -> Actor {
        Actor {
            user_id: Some(self.principal.user_id().to_owned()),
            request_id: Some(self.request_id.to_owned()),
            client: Some(self.client.to_owned()),
        }
    }
}

/// The key service: the store, the cache to invalidate, and the settings.
pub struct KeysService {
    store: SqlStore,
    cache: CachedKeyStore,
    settings: Arc<Settings>,
}

impl KeysService {
    /// A service over `store`, invalidating `cache` on every change.
    pub fn new(store: SqlStore, cache: CachedKeyStore, settings: Arc<Settings>) -> Self {
        KeysService {
            store,
            cache,
            settings,
        }
    }

    /// Serves one endpoint. `key` is the record stage 4 already loaded for
    /// `{id}` routes (its organization was checked against the caller's);
    /// the `{id}` endpoints act on that record only, never on a bare id.
    pub async fn handle(
        &self,
        op: Operation,
        caller: Caller<'_>,
        key: Option<ApiKeyRecord>,
        req: Request<Body>,
    ) -> Result<Response<Body>, GatewayError> {
        let now = unix_now();
        match op {
            Operation::Create => self.create(caller, req, now).await,
            Operation::List => self.list(caller, req.uri().query(), now).await,
            Operation::AuditList => self.audit_list(caller, req.uri().query()).await,
            Operation::Get => {
                let key = own_key(&caller, key)?;
                Ok(json_response(StatusCode::OK, &render::api_key(&key, now)))
            }
            Operation::Revoke => {
                let actor = caller.actor();
                let id = own_key(&caller, key)?.id;
                let record = self
                    .store
                    .revoke_api_key_by(&id, now, &actor)
                    .await
                    .map_err(store_error)?;
                let record = record.ok_or(GatewayError::NotFound)?;
                self.cache.invalidate(&Change::ApiKey { id });
                Ok(json_response(
                    StatusCode::OK,
                    &render::api_key(&record, now),
                ))
            }
            Operation::Rotate => {
                let key = own_key(&caller, key)?;
                self.rotate(caller, key, req, now).await
            }
            Operation::Update => {
                let key = own_key(&caller, key)?;
                self.update(caller, key, req, now).await
            }
            Operation::Delete => {
                let actor = caller.actor();
                let id = own_key(&caller, key)?.id;
                let deleted = self.store.delete_api_key_by(&id, &actor).await;
                if !deleted.map_err(store_error)? {
                    return Err(GatewayError::NotFound);
                }
                self.cache.invalidate(&Change::ApiKey { id });
                let mut res = Response::new(body::empty());
                *res.status_mut() = StatusCode::NO_CONTENT;
                Ok(res)
            }
        }
    }

    async fn create(
        &self,
        caller: Caller<'_>,
        req: Request<Body>,
        now: i64,
    ) -> Result<Response<Body>, GatewayError> {
        let limit = self.settings.server.limits.max_body_bytes;
        let bytes = read_body(req.into_body(), limit).await?;
        let input = json_object(&bytes)?;
        let fields = key_fields(&self.settings, &input, now)?;
        // A key can never carry more than its creator's role grants.
        let roles = &self.settings.roles;
        if let Some(missing) = (fields.scopes.iter()).find(|s| !roles.allows(caller.role, s)) {
            return Err(GatewayError::Forbidden {
                required_scope: missing.clone(),
            });
        }
        let new = fields.owned_by(caller.organization, caller.principal.user_id());
        let created = self.store.create_api_key_by(new, &caller.actor()).await;
        let (secret, record) = created.map_err(store_error)?;
        Ok(json_response(
            StatusCode::CREATED,
            &render::api_key_with_secret(&record, secret, now),
        ))
    }

    /// `POST …/{id}/rotate`: a new key like `key`; `key` stops working after
    /// `grace_period_seconds` (default 0: at once).
    async fn rotate(
        &self,
        caller: Caller<'_>,
        key: ApiKeyRecord,
        req: Request<Body>,
        now: i64,
    ) -> Result<Response<Body>, GatewayError> {
        let limit = self.settings.server.limits.max_body_bytes;
        let bytes = read_body(req.into_body(), limit).await?;
        let grace = grace_period(&bytes)?;
        // A rotation hands over a secret that acts as the key's user, so only
        // that user may ask for one; revoke and delete stay with the scope.
        if key.user_id != caller.principal.user_id() {
            return Err(GatewayError::ForbiddenRequest {
                reason: "not_key_owner",
                message: "only the key's own user may rotate it",
            });
        }
        // The new secret carries the old key's scopes: the caller must be
        // able to create such a key.
        let roles = &self.settings.roles;
        if let Some(missing) = key.scopes.iter().find(|s| !roles.allows(caller.role, s)) {
            return Err(GatewayError::Forbidden {
                required_scope: missing.clone(),
            });
        }
        let rotation = self
            .store
            .rotate_api_key_by(&key.id, grace, now, &caller.actor())
            .await
            .map_err(store_error)?
            .ok_or(GatewayError::NotFound)?;
        self.cache.invalidate(&Change::ApiKey { id: key.id });
        Ok(json_response(
            StatusCode::CREATED,
            &render::api_key_with_secret(&rotation.new, rotation.secret, now),
        ))
    }

    /// `PATCH …/{id}`: changes any of the key's name, enabled flag, allowed
    /// networks, metadata, own limit and credits; 200 with the record.
    async fn update(
        &self,
        caller: Caller<'_>,
        key: ApiKeyRecord,
        req: Request<Body>,
        now: i64,
    ) -> Result<Response<Body>, GatewayError> {
        let limit = self.settings.server.limits.max_body_bytes;
        let bytes = read_body(req.into_body(), limit).await?;
        let update = checked_update(&key, &bytes, now)?;
        let record = self
            .store
            .update_api_key_by(&key.id, &update, now, &caller.actor())
            .await
            .map_err(store_error)?
            .ok_or(GatewayError::NotFound)?;
        self.cache.invalidate(&Change::ApiKey { id: key.id });
        Ok(json_response(
            StatusCode::OK,
            &render::api_key(&record, now),
        ))
    }

    async fn list(
        &self,
        caller: Caller<'_>,
        query: Option<&str>,
        now: i64,
    ) -> Result<Response<Body>, GatewayError> {
        key_page(&self.store, caller.organization, query, now).await
    }

    /// `GET …/audit-events`: the organization's key lifecycle events, newest
    /// first, paged as the key list is.
    async fn audit_list(
        &self,
        caller: Caller<'_>,
        query: Option<&str>,
    ) -> Result<Response<Body>, GatewayError> {
        audit_page(&self.store, caller.organization, query).await
    }
}

/// One page of `organization`'s keys as `query` asks (`limit`, `cursor`), for
/// this API and the admin API alike.
pub(crate) async fn key_page(
    store: &SqlStore,
    organization: &str,
    query: Option<&str>,
    now: i64,
) -> Result<Response<Body>, GatewayError> {
    let (limit, cursor) = paging(query)?;
    let listed = store
        .list_api_keys(organization, limit, cursor.as_deref())
        .await;
    let (records, next) = listed.map_err(page_error)?;
    let data: Vec<Value> = records.iter().map(|r| render::api_key(r, now)).collect();
    Ok(page_response(data, next))
}

/// One page of `organization`'s audit events, newest first, as [`key_page`].
pub(crate) async fn audit_page(
    store: &SqlStore,
    organization: &str,
    query: Option<&str>,
) -> Result<Response<Body>, GatewayError> {
    let (limit, cursor) = paging(query)?;
    let listed = store
        .list_audit_events(organization, limit, cursor.as_deref())
        .await;
    let (events, next) = listed.map_err(page_error)?;
    let data: Vec<Value> = events.iter().map(render::audit_event).collect();
    Ok(page_response(data, next))
}

/// A list's answer: `data`, and the cursor of the page after it (null on the last).
pub(crate) fn page_response(data: Vec<Value>, next: Option<String>) -> Response<Body> {
    json_response(
        StatusCode::OK,
        &json!({ "data": data, "next_cursor": next }),
    )
}

/// A new key's fields from a create body, checked: all but its owner.
pub(crate) struct KeyFields {
    name: String,
    scopes: Vec<String>,
    expires_at: Option<i64>,
    rate_limit: Option<LimitSpec>,
    controls: KeyControls,
}

impl KeyFields {
    /// The key to create for `user` in `organization`.
    pub(crate) fn owned_by(self, organization: &str, user: &str) -> NewApiKey {
        NewApiKey {
            organization_id: organization.to_owned(),
            user_id: user.to_owned(),
            name: self.name,
            scopes: self.scopes,
            expires_at: self.expires_at,
            rate_limit: self.rate_limit,
            controls: self.controls,
        }
    }
}

/// The fields of a create body `input` at `now`, each checked, as is that
/// it holds no other (400 naming the field).
pub(crate) fn key_fields(
    settings: &Settings,
    input: &Map<String, Value>,
    now: i64,
) -> Result<KeyFields, GatewayError> {
    only_fields(input, "body", &CREATE_FIELDS)?;
    let name = input::name(input.get("name"))?;
    let scopes = scopes(settings, input.get("scopes"))?;
    let expires_at = match input.get("expires_at") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(parse_future_time(s, now)?),
        Some(_) => {
            return Err(GatewayError::bad_field(
                "expires_at",
                "must be an RFC 3339 timestamp string",
            ))
        }
    };
    Ok(KeyFields {
        name,
        scopes,
        expires_at,
        rate_limit: rate_limit(input.get("rate_limit"))?,
        controls: create_controls(input)?,
    })
}

/// A PATCH body for `key` at `now`, checked: 400 naming the field, or the
/// `id` of a revoked key, which cannot change.
pub(crate) fn checked_update(
    key: &ApiKeyRecord,
    bytes: &[u8],
    now: i64,
) -> Result<KeyUpdate, GatewayError> {
    let update = key_update(bytes)?;
    if key.status(now) == crate::store::KeyStatus::Revoked {
        return Err(GatewayError::bad_field(
            "id",
            "names a revoked key, and a revoked key cannot change",
        ));
    }
    // A key with unlimited credits has no count to keep: as on create,
    // it needs `remaining` or a refill, never silently none left.
    let keeps_count = matches!(
        update.credits,
        Some(CreditsUpdate::Set {
            remaining: None,
            refill: None | Some(None),
        })
    );
    if keeps_count && key.controls.credits.is_none() {
        return Err(GatewayError::bad_field(
            "credits.remaining",
            "is required for a key with unlimited credits, unless a refill is given",
        ));
    }
    Ok(update)
}

/// A create body's `scopes`: a non-empty list of known scope names, each once.
fn scopes(settings: &Settings, value: Option<&Value>) -> Result<Vec<String>, GatewayError> {
    let list = match value {
        Some(Value::Array(list)) => list,
        Some(_) => {
            return Err(GatewayError::bad_field(
                "scopes",
                "must be an array of scope names",
            ))
        }
        None => return Err(GatewayError::bad_field("scopes", "is required")),
    };
    if list.is_empty() {
        return Err(GatewayError::bad_field("scopes", "must not be empty"));
    }
    let mut scopes: Vec<String> = Vec::with_capacity(list.len());
    for item in list {
        let Value::String(s) = item else {
            return Err(GatewayError::bad_field(
                "scopes",
                "must be an array of strings",
            ));
        };
        if !settings.known_scopes.contains(s) {
            // Never echo a credential pasted in the wrong place.
            let what = if looks_like_secret(s.bytes()) {
                "holds an unknown scope".to_string()
            } else {
                format!("unknown scope {s:?}")
            };
            return Err(GatewayError::bad_field("scopes", &what));
        }
        if !scopes.contains(s) {
            scopes.push(s.clone());
        }
    }
    Ok(scopes)
}

/// A store error of a list: a cursor it did not issue is the caller's 400.
pub(crate) fn page_error(e: StoreError) -> GatewayError {
    match e {
        StoreError::Invalid(_) => {
            GatewayError::bad_field("cursor", "is not a cursor this service issued")
        }
        other => store_error(other),
    }
}

/// The key `{id}` names, when it belongs to the caller's organization: a key
/// of another organization, or one stage 4 did not load, is not found.
fn own_key(caller: &Caller<'_>, key: Option<ApiKeyRecord>) -> Result<ApiKeyRecord, GatewayError> {
    key.filter(|k| k.organization_id == caller.organization)
        .ok_or(GatewayError::NotFound)
}

/// The whole of `body`, at most `limit` bytes: over it, 413; a client that
/// breaks off, 400.
pub(crate) async fn read_body(body: Body, limit: u64) -> Result<Bytes, GatewayError> {
    match body.collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if is_length_limit(e.as_ref()) => Err(GatewayError::PayloadTooLarge { limit }),
        Err(e) => Err(GatewayError::BadRequest {
            message: format!("cannot read the body: {e}").into(),
            field: Some("body".into()),
        }),
    }
}

fn is_length_limit(mut e: &(dyn std::error::Error + 'static)) -> bool {
    loop {
        if e.is::<crate::http_core::body::TooLarge>() {
            return true;
        }
        match e.source() {
            Some(next) => e = next,
            None => return false,
        }
    }
}

/// A store error as the key service's answer: as `From<StoreError> for
/// GatewayError` maps it, except that refused input is quoted as the store
/// put it, without the "invalid" in front.
pub(crate) fn store_error(e: StoreError) -> GatewayError {
    match e {
        StoreError::Invalid(what) => GatewayError::BadRequest {
            message: what.into(),
            field: None,
        },
        other => other.into(),
    }
}

fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    let mut res = Response::new(body::full(serde_json::to_vec(value).unwrap_or_default()));
    *res.status_mut() = status;
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grace_period_is_optional_whole_and_at_most_a_week() {
        assert_eq!(grace_period(b"").ok(), Some(0));
        assert_eq!(grace_period(b"{}").ok(), Some(0));
        assert_eq!(
            grace_period(br#"{"grace_period_seconds": 60}"#).ok(),
            Some(60)
        );
        assert_eq!(
            grace_period(br#"{"grace_period_seconds": 604800}"#).ok(),
            Some(604_800)
        );
        for bad in [
            r#"{"grace_period_seconds": 604801}"#,
            r#"{"grace_period_seconds": -1}"#,
            r#"{"grace_period_seconds": 1.5}"#,
            r#"{"grace_period_seconds": "60"}"#,
            r#"{"grace": 60}"#,
            "[1]",
            "{",
        ] {
            assert!(grace_period(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn rate_limit_is_optional_and_names_the_bad_field() {
        let parse = |text: &str| rate_limit(Some(&serde_json::from_str(text).unwrap()));
        assert_eq!(rate_limit(None).ok(), Some(None));
        assert_eq!(parse("null").ok(), Some(None));
        let ok = parse(r#"{"requests": 10, "per": "1m"}"#).unwrap().unwrap();
        assert_eq!(render::limit(&ok), json!({"requests": 10, "per": "1m"}));
        for (bad, field) in [
            ("5", "rate_limit"),
            (r#"{"per": "1m"}"#, "rate_limit.requests"),
            (r#"{"requests": 0, "per": "1m"}"#, "rate_limit.requests"),
            (r#"{"requests": -1, "per": "1m"}"#, "rate_limit.requests"),
            (r#"{"requests": 1.5, "per": "1m"}"#, "rate_limit.requests"),
            (r#"{"requests": "10", "per": "1m"}"#, "rate_limit.requests"),
            (
                r#"{"requests": 2000000000, "per": "1m"}"#,
                "rate_limit.requests",
            ),
            (r#"{"requests": 10}"#, "rate_limit.per"),
            (r#"{"requests": 10, "per": 60}"#, "rate_limit.per"),
            (r#"{"requests": 10, "per": "1 minute"}"#, "rate_limit.per"),
            (r#"{"requests": 10, "per": "0s"}"#, "rate_limit.per"),
            (r#"{"requests": 10, "per": "31d"}"#, "rate_limit.per"),
            (
                r#"{"requests": 10, "per": "1m", "burst": 3}"#,
                "rate_limit.burst",
            ),
        ] {
            match parse(bad) {
                Err(GatewayError::BadRequest { field: Some(f), .. }) => {
                    assert_eq!(f, field, "{bad}")
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn expiry_must_be_rfc3339_and_future() {
        assert!(parse_future_time("2999-01-01T00:00:00Z", 0).is_ok());
        assert!(parse_future_time("2000-01-01T00:00:00Z", 2_000_000_000).is_err());
        assert!(parse_future_time("tomorrow", 0).is_err());
        assert_eq!(
            parse_future_time("1970-01-01T00:01:40+00:00", 0).unwrap(),
            100
        );
    }

    #[tokio::test]
    async fn id_endpoints_never_act_on_a_key_of_another_organization() {
        use crate::store::testing::TestDb;
        use crate::store::{CacheConfig, KeyStore, SessionAuth, SessionRecord};
        use std::time::Duration;
        let db = TestDb::sqlite();
        let store = db.store().await;
        for (org, user) in [("acme", "alice"), ("other", "bob")] {
            assert!(store.create_organization(org, None).await.is_ok());
            assert!(store.create_user(user, None).await.is_ok());
            assert!(store.set_member(org, user, "owner").await.is_ok());
        }
        let new = NewApiKey {
            organization_id: "other".into(),
            user_id: "bob".into(),
            name: "theirs".into(),
            scopes: vec!["clusters:read".into()],
            expires_at: None,
            rate_limit: None,
            controls: Default::default(),
        };
        let Ok((_, theirs)) = store.create_api_key(new).await else {
            panic!("create failed")
        };
        let settings = Settings::parse(
            "[server]\ninsecure_http = true\n[upstreams.c]\ntargets = [\"http://127.0.0.1:9\"]\n\
             [[routes]]\nmethod = \"GET\"\npath = \"/a\"\nauth = \"none\"\nupstream = \"c\"\n",
        );
        let Ok(settings) = settings else {
            panic!("{settings:?}")
        };
        let cfg = CacheConfig {
            ttl: Duration::from_secs(30),
            negative_ttl: Duration::from_secs(5),
            capacity: 100,
            negative_capacity: 100,
            stale_if_error: Duration::from_secs(0),
        };
        let cache = CachedKeyStore::new(Arc::new(store.clone()) as Arc<dyn KeyStore>, cfg);
        let service = KeysService::new(store.clone(), cache, Arc::new(settings));
        let principal = Principal::Session(Arc::new(SessionAuth {
            session: SessionRecord {
                id: "ses_1".into(),
                user_id: "alice".into(),
                created_at: 0,
                expires_at: i64::MAX,
            },
            memberships: vec![("acme".into(), "owner".into())],
            org_limits: vec![],
            token: None,
        }));
        // A route whose organization is not the key's own hands over the bare
        // id (no record), or a record of another organization.
        for op in [
            Operation::Get,
            Operation::Revoke,
            Operation::Rotate,
            Operation::Delete,
        ] {
            for key in [None, Some(theirs.clone())] {
                let caller = Caller {
                    principal: &principal,
                    organization: "acme",
                    role: "owner",
                    request_id: "r",
                    client: "127.0.0.1",
                };
                let req = Request::new(body::empty());
                let res = service.handle(op, caller, key, req).await;
                assert!(matches!(res, Err(GatewayError::NotFound)), "{op:?}");
            }
        }
        let after = store.get_api_key(&theirs.id).await.ok().flatten();
        assert_eq!(after.map(|k| k.revoked_at), Some(None), "touched");
    }
}
