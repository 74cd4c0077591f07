//! The admin API's keys: an organization's keys and audit trail, and one
//! key's read, change, revocation, rotation and deletion. The same checks
//! as the key service's (`keys_service::key_fields`, `checked_update`,
//! `grace_period`), with the admin token as the audit trail's actor; the
//! owner's role is not asked, as the command line does not ask it.
use http::{Method, Response, StatusCode};

use super::{no_content, not_allowed_or_not_found, read_bytes, required_string, Ctx};
use crate::admin::json_response;
use crate::clock::unix_now;
use crate::error::GatewayError;
use crate::http_core::body::{Body, RequestBody};
use crate::keys_service::render::{api_key, api_key_with_secret};
use crate::keys_service::{
    audit_page, checked_update, grace_period, json_object, key_fields, key_page, store_error,
};
use crate::store::StoreError;

/// `/organizations/{org}/keys` and `/organizations/{org}/audit-events`.
pub(super) async fn of_organization(
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
    let now = unix_now();
    match (m, segments) {
        (&Method::POST, ["organizations", org, "keys"]) => {
            let mut input = json_object(&read_bytes(body).await?)?;
            let user = required_string(&input, "user_id")?;
            input.remove("user_id");
            let fields = key_fields(settings, &input, now)?;
            if store.member_role(org, &user).await?.is_none() {
                return Err(GatewayError::bad_field(
                    "user_id",
                    &format!("is not a member of organization {org:?}"),
                ));
            }
            let created = store.create_api_key_by(fields.owned_by(org, &user), actor);
            let (secret, record) = created.await.map_err(store_error)?;
            Ok(json_response(
                StatusCode::CREATED,
                &api_key_with_secret(&record, secret, now),
            ))
        }
        (&Method::GET, ["organizations", org, "keys"]) => key_page(store, org, query, now).await,
        (&Method::GET, ["organizations", org, "audit-events"]) => {
            audit_page(store, org, query).await
        }
        (_, segments) => Err(not_allowed_or_not_found(segments)),
    }
}

/// `/keys/{id}`, `/keys/{id}/revoke` and `/keys/{id}/rotate`.
pub(super) async fn key(
    ctx: &Ctx<'_>,
    m: &Method,
    segments: &[&str],
    body: RequestBody,
) -> Result<Response<Body>, GatewayError> {
    let Ctx { store, actor, .. } = *ctx;
    let now = unix_now();
    let (id, action) = match segments {
        ["keys", id] => (*id, None),
        ["keys", id, action @ ("revoke" | "rotate")] => (*id, Some(*action)),
        _ => return Err(not_allowed_or_not_found(segments)),
    };
    let allowed = matches!(
        (m, action),
        (&Method::GET | &Method::PATCH | &Method::DELETE, None) | (&Method::POST, Some(_))
    );
    if !allowed {
        return Err(not_allowed_or_not_found(segments));
    }
    let key = existing(store.get_api_key(id).await)?;
    match (m, action) {
        (&Method::GET, _) => Ok(json_response(StatusCode::OK, &api_key(&key, now))),
        (&Method::PATCH, _) => {
            let update = checked_update(&key, &read_bytes(body).await?, now)?;
            let record = store.update_api_key_by(id, &update, now, actor).await;
            let record = existing(record)?;
            Ok(json_response(StatusCode::OK, &api_key(&record, now)))
        }
        (&Method::DELETE, _) => match store.delete_api_key_by(id, actor).await? {
            true => Ok(no_content()),
            false => Err(GatewayError::NotFound),
        },
        (_, Some("revoke")) => {
            let record = existing(store.revoke_api_key_by(id, now, actor).await)?;
            Ok(json_response(StatusCode::OK, &api_key(&record, now)))
        }
        _ => {
            let grace = grace_period(&read_bytes(body).await?)?;
            let rotated = store.rotate_api_key_by(id, grace, now, actor).await;
            let rotation = existing(rotated)?;
            Ok(json_response(
                StatusCode::CREATED,
                &api_key_with_secret(&rotation.new, rotation.secret, now),
            ))
        }
    }
}

/// The record a store call found, or 404.
fn existing<T>(found: Result<Option<T>, StoreError>) -> Result<T, GatewayError> {
    found?.ok_or(GatewayError::NotFound)
}
