//! What the admin subcommands do: each opens the store named by `--config`,
//! checks its arguments against the settings, and answers with JSON.
use serde_json::{json, Value};
use std::time::Duration;

use super::{
    AdminTokensCmd, AuditCmd, Command, Failure, KeysCmd, MembersCmd, OrgsCmd, SessionsCmd, UsersCmd,
};
use crate::admin::render;
use crate::app::open_store;
use crate::clock::unix_now;
use crate::config::{parse_duration, Settings};
use crate::keys_service::render::{api_key, api_key_with_secret, audit_event};
use crate::store::sql::SqlStore;
use crate::store::{LimitSpec, NewApiKey, SessionRecord};

mod key_update;
mod limits;

/// Runs an admin command (everything but run, check-config and demo).
pub async fn admin(settings: &Settings, cmd: Command) -> Result<Value, Failure> {
    let store = open_store(settings, false)
        .await
        .map_err(|e| Failure::runtime(crate::logging::Chain(&e).to_string()))?;
    let now = unix_now();
    match cmd {
        Command::Migrate => Ok(json!({ "migrated": true, "store": settings.store.display })),
        Command::Orgs(OrgsCmd::Create { id, name }) => {
            non_empty("--id", &id)?;
            let org = store.create_organization(&id, name.as_deref()).await?;
            Ok(render::organization(&org))
        }
        Command::Orgs(OrgsCmd::List) => {
            let orgs = store.list_organizations().await?;
            let data: Vec<Value> = orgs.iter().map(render::organization).collect();
            Ok(json!({ "data": data }))
        }
        Command::Orgs(OrgsCmd::Delete { id }) => match store.delete_organization(&id).await? {
            Some(removed) => Ok(json!({
                "deleted": id,
                "api_keys_deleted": removed.api_keys,
                "memberships_removed": removed.memberships.into_iter().map(|(_, user)| user).collect::<Vec<_>>(),
            })),
            None => Err(Failure::input(format!("no organization with id {id:?}"))),
        },
        Command::Orgs(OrgsCmd::SetLimit {
            org,
            policy,
            requests,
            per,
        }) => limits::set(settings, &store, &org, &policy, requests, &per).await,
        Command::Orgs(OrgsCmd::UnsetLimit { org, policy }) => {
            limits::unset(settings, &store, &org, &policy).await
        }
        Command::Orgs(OrgsCmd::Limits { org }) => limits::list(&store, &org).await,
        Command::Users(UsersCmd::Create { id, email }) => {
            non_empty("--id", &id)?;
            Ok(render::user(
                &store.create_user(&id, email.as_deref()).await?,
            ))
        }
        Command::Users(UsersCmd::List) => {
            let users = store.list_users().await?;
            let data: Vec<Value> = users.iter().map(render::user).collect();
            Ok(json!({ "data": data }))
        }
        Command::Users(UsersCmd::Delete { id }) => match store.delete_user(&id).await? {
            Some(removed) => Ok(json!({
                "deleted": id,
                "sessions_ended": removed.sessions,
                "api_keys_deleted": removed.api_keys,
                "memberships_removed": removed.memberships.into_iter().map(|(org, _)| org).collect::<Vec<_>>(),
            })),
            None => Err(Failure::input(format!("no user with id {id:?}"))),
        },
        Command::Members(cmd) => members(settings, &store, cmd).await,
        Command::Sessions(cmd) => sessions(&store, cmd, now).await,
        Command::Keys(cmd) => keys(settings, &store, cmd, now).await,
        Command::Audit(AuditCmd::List { org, limit }) => audit_list(&store, &org, limit).await,
        Command::AdminTokens(cmd) => admin_tokens(&store, cmd).await,
        Command::Run | Command::CheckConfig | Command::Demo(_) => {
            Err(Failure::input("not an admin command"))
        }
    }
}

/// `audit list`: the newest `limit` events (all if none), newest first.
async fn audit_list(store: &SqlStore, org: &str, limit: Option<u32>) -> Result<Value, Failure> {
    // An organization's trail outlives it, so a missing one is only refused
    // when it has no trail either.
    let exists = store.get_organization(org).await?.is_some();
    if !exists && store.list_audit_events(org, 1, None).await?.0.is_empty() {
        return Err(Failure::input(format!("no organization with id {org:?}")));
    }
    let mut left = limit.map_or(usize::MAX, |n| n as usize);
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    while left > 0 {
        let page_size = u32::try_from(left.min(100)).unwrap_or(100);
        let (page, next) = store
            .list_audit_events(org, page_size, cursor.as_deref())
            .await?;
        left -= page.len();
        all.extend(page.iter().map(audit_event));
        match next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    Ok(json!({ "data": all }))
}

async fn members(settings: &Settings, store: &SqlStore, cmd: MembersCmd) -> Result<Value, Failure> {
    match cmd {
        MembersCmd::Add { org, user, role } => {
            if !settings.roles.contains(&role) {
                return Err(Failure::input(format!(
                    "--role: unknown role {role:?}; roles in [roles]: {}",
                    settings.roles.names().join(", ")
                )));
            }
            Ok(render::membership(
                &store.set_member(&org, &user, &role).await?,
            ))
        }
        MembersCmd::List { org } => {
            let members = store.list_members(&org).await?;
            let data: Vec<Value> = members.iter().map(render::membership).collect();
            Ok(json!({ "data": data }))
        }
        MembersCmd::Remove { org, user } => match store.remove_member(&org, &user).await? {
            Some(role) => Ok(json!({
                "organization_id": org,
                "user_id": user,
                "role": role,
                "removed": true,
            })),
            None => Err(Failure::input(format!(
                "user {user:?} is not a member of organization {org:?}"
            ))),
        },
    }
}

async fn sessions(store: &SqlStore, cmd: SessionsCmd, now: i64) -> Result<Value, Failure> {
    match cmd {
        SessionsCmd::Create { user, ttl } => {
            let ttl = duration_arg("--ttl", &ttl)?;
            expiry_arg("--ttl", ttl, now)?;
            let (token, session) = store.create_session(&user, ttl).await?;
            Ok(
                json!({ "token": token, "user_id": session.user_id, "expires_at": rfc3339(session.expires_at) }),
            )
        }
        SessionsCmd::List { user } => {
            let data: Vec<Value> = store
                .list_sessions(&user)
                .await?
                .iter()
                .map(|s| {
                    session_json(
                        s,
                        if s.is_expired(now) {
                            "expired"
                        } else {
                            "active"
                        },
                    )
                })
                .collect();
            Ok(json!({ "data": data }))
        }
        SessionsCmd::Revoke { id } => match store.revoke_session(&id).await? {
            Some(s) => Ok(session_json(&s, "revoked")),
            None => Err(Failure::input(format!("no session with id {id:?}"))),
        },
    }
}

/// `admin-tokens …`: the token itself is printed once, by `create`.
async fn admin_tokens(store: &SqlStore, cmd: AdminTokensCmd) -> Result<Value, Failure> {
    match cmd {
        AdminTokensCmd::Create { name } => {
            let (token, record) = store.create_admin_token(&name).await?;
            let mut out = render::admin_token(&record);
            if let Some(o) = out.as_object_mut() {
                o.remove("revoked_at");
            }
            out["token"] = Value::String(token);
            Ok(out)
        }
        AdminTokensCmd::List => {
            let data: Vec<Value> = store
                .list_admin_tokens()
                .await?
                .iter()
                .map(render::admin_token)
                .collect();
            Ok(json!({ "data": data }))
        }
        AdminTokensCmd::Revoke { id } => match store.revoke_admin_token(&id).await? {
            Some(t) => Ok(render::admin_token(&t)),
            None => Err(Failure::input(format!("no admin token with id {id:?}"))),
        },
    }
}

/// A session as the admin commands print it: never its token.
fn session_json(s: &SessionRecord, status: &str) -> Value {
    let mut v = render::session(s);
    v["status"] = json!(status);
    v
}

async fn keys(
    settings: &Settings,
    store: &SqlStore,
    cmd: KeysCmd,
    now: i64,
) -> Result<Value, Failure> {
    match cmd {
        KeysCmd::Create {
            org,
            user,
            name,
            scopes,
            expires_in,
            rate_limit,
        } => {
            key_name(&name)?;
            let scopes = key_scopes(settings, scopes)?;
            if store.member_role(&org, &user).await?.is_none() {
                return Err(Failure::input(format!(
                    "user {user:?} is not a member of organization {org:?} (add them with: members add --org {org} --user {user} --role ROLE)"
                )));
            }
            let expires_at = key_expiry(expires_in, now)?;
            let rate_limit = key_rate_limit(rate_limit)?;
            let new = NewApiKey {
                organization_id: org,
                user_id: user,
                name,
                scopes,
                expires_at,
                rate_limit,
                controls: Default::default(),
            };
            let (secret, record) = store.create_api_key(new).await?;
            Ok(api_key_with_secret(&record, secret, now))
        }
        KeysCmd::List { org } => list_keys(store, &org, now).await,
        KeysCmd::Get { id } => match store.get_api_key(&id).await? {
            Some(r) => Ok(api_key(&r, now)),
            None => Err(Failure::input(format!("no API key with id {id:?}"))),
        },
        KeysCmd::Revoke { id } => match store.revoke_api_key(&id, now).await? {
            Some(r) => Ok(api_key(&r, now)),
            None => Err(Failure::input(format!("no API key with id {id:?}"))),
        },
        KeysCmd::Rotate { id, grace } => {
            let grace = grace.as_deref().map(grace_arg).transpose()?.unwrap_or(0);
            match store.rotate_api_key(&id, grace, now).await? {
                Some(r) => Ok(api_key_with_secret(&r.new, r.secret, now)),
                None => Err(Failure::input(format!("no API key with id {id:?}"))),
            }
        }
        KeysCmd::Update(args) => key_update::update(store, args, now).await,
        KeysCmd::Delete { id } => {
            if store.delete_api_key(&id).await? {
                Ok(json!({ "deleted": id }))
            } else {
                Err(Failure::input(format!("no API key with id {id:?}")))
            }
        }
    }
}

/// `keys list`: every key of `org`, read a page at a time.
async fn list_keys(store: &SqlStore, org: &str, now: i64) -> Result<Value, Failure> {
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let (page, next) = store.list_api_keys(org, 100, cursor.as_deref()).await?;
        all.extend(page.iter().map(|r| api_key(r, now)));
        match next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    Ok(json!({ "data": all }))
}

/// `keys create --name` and `keys update --name`: not blank, at most 100
/// characters.
fn key_name(name: &str) -> Result<(), Failure> {
    non_empty("--name", name)?;
    if name.chars().count() > 100 {
        return Err(Failure::input("--name: at most 100 characters"));
    }
    Ok(())
}

/// `keys create --scopes`: at least one, each known to the settings.
fn key_scopes(settings: &Settings, scopes: Vec<String>) -> Result<Vec<String>, Failure> {
    let scopes: Vec<String> = scopes
        .into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    if scopes.is_empty() {
        return Err(Failure::input(
            "--scopes: give at least one scope, e.g. --scopes clusters:read",
        ));
    }
    if let Some(bad) = scopes.iter().find(|s| !settings.known_scopes.contains(*s)) {
        let known: Vec<&str> = settings.known_scopes.iter().map(String::as_str).collect();
        return Err(Failure::input(format!(
            "--scopes: unknown scope {bad:?}; known: {}",
            known.join(", ")
        )));
    }
    Ok(scopes)
}

/// `keys create --expires-in`: when the key expires, as unix seconds.
fn key_expiry(expires_in: Option<String>, now: i64) -> Result<Option<i64>, Failure> {
    match expires_in {
        Some(text) => Ok(Some(expiry_arg(
            "--expires-in",
            duration_arg("--expires-in", &text)?,
            now,
        )?)),
        None => Ok(None),
    }
}

/// `keys create --rate-limit` and `keys update --rate-limit`: the key's own
/// limit, as REQUESTS/PERIOD.
fn key_rate_limit(rate_limit: Option<String>) -> Result<Option<LimitSpec>, Failure> {
    match rate_limit {
        Some(text) => Ok(Some(LimitSpec::parse_slash(&text).map_err(|p| {
            Failure::input(format!("--rate-limit: {} {}", p.field, p.reason))
        })?)),
        None => Ok(None),
    }
}

fn non_empty(flag: &str, v: &str) -> Result<(), Failure> {
    if v.trim().is_empty() {
        Err(Failure::input(format!("{flag}: must not be empty")))
    } else {
        Ok(())
    }
}

fn duration_arg(flag: &str, text: &str) -> Result<Duration, Failure> {
    match parse_duration(text) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err(Failure::input(format!("{flag}: must be longer than zero"))),
        Err(e) => Err(Failure::input(format!("{flag}: {e}"))),
    }
}

/// `--grace`: a duration from 0 to 7 days, in whole seconds.
fn grace_arg(text: &str) -> Result<i64, Failure> {
    let max = crate::keys_service::MAX_GRACE_SECONDS;
    match parse_duration(text) {
        Ok(d) => i64::try_from(d.as_secs())
            .ok()
            .filter(|s| *s <= max)
            .ok_or_else(|| Failure::input("--grace: must be at most 7d".to_string())),
        Err(e) => Err(Failure::input(format!("--grace: {e}"))),
    }
}

/// The last second RFC 3339 can write (9999-12-31T23:59:59Z).
const LAST_RFC3339_SECOND: i64 = 253_402_300_799;

/// `now + lifetime` as unix seconds, if RFC 3339 can still write it: the
/// record's `expires_at` would otherwise print as null (no expiry) or "".
fn expiry_arg(flag: &str, lifetime: Duration, now: i64) -> Result<i64, Failure> {
    i64::try_from(lifetime.as_secs())
        .ok()
        .and_then(|secs| now.checked_add(secs))
        .filter(|at| *at <= LAST_RFC3339_SECOND)
        .ok_or_else(|| Failure::input(format!("{flag}: must end before the year 10000")))
}

/// Unix seconds as RFC 3339 UTC.
pub fn rfc3339(t: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(t)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}
