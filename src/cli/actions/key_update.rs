//! `keys update`: the flags as one [`KeyUpdate`], each value checked by the
//! parsers the API uses (`store::controls`, `LimitSpec`), then one store
//! update audited as the command line's.
use serde_json::Value;

use super::{key_name, key_rate_limit};
use crate::cli::{Failure, KeyUpdateArgs};
use crate::keys_service::render::api_key;
use crate::store::controls::{
    credit_count, meta_text, parse_ip_allow, parse_refill, ControlProblem,
};
use crate::store::sql::{CreditsUpdate, KeyUpdate, SqlStore};
use crate::store::KeyStatus;

/// The value that clears a field.
const NONE: &str = "none";

/// Applies the flags to key `args.id` at `now`; prints the record.
pub(super) async fn update(
    store: &SqlStore,
    args: KeyUpdateArgs,
    now: i64,
) -> Result<Value, Failure> {
    let update = key_update(&args)?;
    if update.fields().is_empty() {
        return Err(Failure::input(
            "keys update: give at least one of --name, --enabled, --ip-allow, --meta, \
             --credits, --refill, --rate-limit",
        ));
    }
    let id = args.id;
    let no_key = || Failure::input(format!("no API key with id {id:?}"));
    let key = store.get_api_key(&id).await?.ok_or_else(no_key)?;
    // The store refuses it too; this says so in the command line's words.
    if key.status(now) == KeyStatus::Revoked {
        return Err(Failure::input(format!(
            "API key {id:?} is revoked, and a revoked key cannot change"
        )));
    }
    // Without credits there is no count to keep: the key would go from
    // unlimited to none left.
    let keeps_count = matches!(
        update.credits,
        Some(CreditsUpdate::Set {
            remaining: None,
            refill: Some(None)
        })
    );
    if keeps_count && key.controls.credits.is_none() {
        return Err(Failure::input(format!(
            "--refill none: API key {id:?} has unlimited credits and no refill; \
             give --credits N to count its requests"
        )));
    }
    match store.update_api_key(&id, &update, now).await? {
        Some(record) => Ok(api_key(&record, now)),
        None => Err(no_key()),
    }
}

/// Every flag given, checked; a bad value is exit 2 naming its flag.
fn key_update(args: &KeyUpdateArgs) -> Result<KeyUpdate, Failure> {
    if let Some(name) = &args.name {
        key_name(name)?;
    }
    let rate_limit = match args.rate_limit.as_deref() {
        None => None,
        Some(NONE) => Some(None),
        Some(text) => Some(key_rate_limit(Some(text.to_owned()))?),
    };
    Ok(KeyUpdate {
        name: args.name.clone(),
        enabled: args.enabled,
        ip_allow: args.ip_allow.as_deref().map(ip_allow).transpose()?,
        meta: args.meta.as_deref().map(meta).transpose()?,
        rate_limit,
        credits: credits(args.credits.as_deref(), args.refill.as_deref())?,
    })
}

/// `--ip-allow`: comma-separated networks, or `none` (from anywhere).
fn ip_allow(text: &str) -> Result<Option<Vec<ipnet::IpNet>>, Failure> {
    if text == NONE {
        return Ok(None);
    }
    let entries: Vec<&str> = text
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    if entries.is_empty() {
        return Err(Failure::input(
            "--ip-allow: give at least one network, such as 203.0.113.0/24, or none",
        ));
    }
    parse_ip_allow(entries)
        .map(Some)
        .map_err(|p| flag_error("--ip-allow", p))
}

/// `--meta`: a JSON object, or `null` / `none` (no metadata).
fn meta(text: &str) -> Result<Option<String>, Failure> {
    if text == NONE {
        return Ok(None);
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Null) => Ok(None),
        Ok(value) => meta_text(&value)
            .map(Some)
            .map_err(|p| flag_error("--meta", p)),
        Err(e) => Err(Failure::input(format!(
            "--meta: is not valid JSON ({e}); give an object such as '{{\"plan\":\"pro\"}}', or none"
        ))),
    }
}

/// `--credits` and `--refill` together: what is left, the refill, or
/// `--credits none` (unlimited, which has no refill).
fn credits(credits: Option<&str>, refill: Option<&str>) -> Result<Option<CreditsUpdate>, Failure> {
    let refill = match refill {
        None => None,
        Some(NONE) => Some(None),
        Some(text) => Some(Some(
            parse_refill(text).map_err(|p| flag_error("--refill", p))?,
        )),
    };
    let remaining = match credits {
        None => None,
        Some(NONE) if refill.is_some() => {
            return Err(Failure::input(
                "--refill: cannot go with --credits none (unlimited credits have no refill)",
            ))
        }
        Some(NONE) => return Ok(Some(CreditsUpdate::Unlimited)),
        Some(text) => {
            // Not a number reads as out of range: the same message either way.
            let n = text.trim().parse::<i128>().unwrap_or(i128::MIN);
            Some(credit_count("credits.remaining", n).map_err(|p| flag_error("--credits", p))?)
        }
    };
    if remaining.is_none() && refill.is_none() {
        return Ok(None);
    }
    Ok(Some(CreditsUpdate::Set { remaining, refill }))
}

/// A control's problem as exit 2 naming `flag`, and the part of the value
/// that is wrong when the flag holds two (`--refill`'s amount or interval).
fn flag_error(flag: &str, p: ControlProblem) -> Failure {
    match p.field.strip_prefix("credits.refill.") {
        Some(part) => Failure::input(format!("{flag}: {part} {}", p.reason)),
        None => Failure::input(format!("{flag}: {}", p.reason)),
    }
}
