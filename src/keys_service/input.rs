//! The key service's request inputs that need nothing of the service: the
//! paging query of its lists, the rotate body's grace period, a key's
//! name, expiry time, own rate limit and controls, and a PATCH body.
use serde_json::Value;

use ipnet::IpNet;

use crate::error::GatewayError;
use crate::secret::looks_like_secret;
use crate::store::controls::{
    credit_count, meta_text, parse_ip_allow, refill_interval, ControlProblem,
};
use crate::store::sql::{CreditsUpdate, KeyUpdate};
use crate::store::{Credits, KeyControls, LimitSpec, Refill};

/// Page size when `limit` is not given, and the largest accepted.
const DEFAULT_LIMIT: u32 = 20;
const MAX_LIMIT: u32 = 100;

/// A list's `limit` (1..=100, default 20) and `cursor` (absent if empty).
pub(crate) fn paging(query: Option<&str>) -> Result<(u32, Option<String>), GatewayError> {
    let query = crate::routes::Query::parse(query).map_err(|_| GatewayError::BadRequest {
        message: "malformed query string".into(),
        field: None,
    })?;
    let limit = match query.get("limit") {
        None => DEFAULT_LIMIT,
        Some(v) => match v.parse::<u32>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => n,
            _ => {
                return Err(GatewayError::bad_field(
                    "limit",
                    "must be a whole number from 1 to 100",
                ))
            }
        },
    };
    let cursor = query
        .get("cursor")
        .filter(|c| !c.is_empty())
        .map(|c| c.to_string());
    Ok((limit, cursor))
}

/// A request body that must be a JSON object (400 `body` otherwise).
pub(crate) fn json_object(bytes: &[u8]) -> Result<serde_json::Map<String, Value>, GatewayError> {
    let input: Value = serde_json::from_slice(bytes)
        .map_err(|e| GatewayError::bad_field("body", &format!("is not valid JSON ({e})")))?;
    match input {
        Value::Object(map) => Ok(map),
        _ => Err(GatewayError::bad_field("body", "must be a JSON object")),
    }
}

/// Longest grace period a rotation accepts: 7 days, in seconds.
pub const MAX_GRACE_SECONDS: i64 = 7 * 24 * 3600;

/// The rotate body: empty, or a JSON object with an optional
/// `grace_period_seconds`, a whole number from 0 to [`MAX_GRACE_SECONDS`].
pub(crate) fn grace_period(bytes: &[u8]) -> Result<i64, GatewayError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(0);
    }
    let input = &json_object(bytes)?;
    if let Some(field) = input.keys().find(|f| *f != "grace_period_seconds") {
        // Never echo a credential pasted in the wrong place.
        if looks_like_secret(field.bytes()) {
            return Err(GatewayError::bad_field("body", "holds an unknown field"));
        }
        return Err(GatewayError::bad_field(field.as_str(), "unknown field"));
    }
    match input.get("grace_period_seconds") {
        None | Some(Value::Null) => Ok(0),
        Some(Value::Number(n)) => n
            .as_i64()
            .filter(|s| (0..=MAX_GRACE_SECONDS).contains(s))
            .ok_or_else(|| {
                GatewayError::bad_field(
                    "grace_period_seconds",
                    "must be a whole number of seconds from 0 to 604800 (7 days)",
                )
            }),
        Some(_) => Err(GatewayError::bad_field(
            "grace_period_seconds",
            "must be a whole number of seconds from 0 to 604800 (7 days)",
        )),
    }
}

pub(super) fn parse_future_time(text: &str, now: i64) -> Result<i64, GatewayError> {
    let t = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .map_err(|_| {
            GatewayError::bad_field(
                "expires_at",
                "must be an RFC 3339 timestamp such as 2030-01-01T00:00:00Z",
            )
        })?;
    let t = t.unix_timestamp();
    if t <= now {
        return Err(GatewayError::bad_field(
            "expires_at",
            "must be in the future",
        ));
    }
    Ok(t)
}

/// The create body's `rate_limit`: absent or null (the policies' quotas), or
/// `{"requests": N, "per": "1m"}`; a problem names `rate_limit.requests` or
/// `rate_limit.per`.
pub(super) fn rate_limit(value: Option<&Value>) -> Result<Option<LimitSpec>, GatewayError> {
    let fields = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(fields)) => fields,
        Some(_) => {
            return Err(GatewayError::bad_field(
                "rate_limit",
                "must be an object such as {\"requests\": 100, \"per\": \"1m\"}, or null",
            ))
        }
    };
    if let Some(field) = fields
        .keys()
        .find(|f| !matches!(f.as_str(), "requests" | "per"))
    {
        if looks_like_secret(field.bytes()) {
            return Err(GatewayError::bad_field(
                "rate_limit",
                "holds an unknown field",
            ));
        }
        return Err(GatewayError::bad_field(
            format!("rate_limit.{field}"),
            "unknown field",
        ));
    }
    let requests = match fields.get("requests") {
        Some(Value::Number(n)) => n.as_u64().unwrap_or(0),
        Some(_) => u64::MAX,
        None => {
            return Err(GatewayError::bad_field(
                "rate_limit.requests",
                "is required",
            ))
        }
    };
    let per = match fields.get("per") {
        Some(Value::String(per)) => per.as_str(),
        Some(_) => {
            return Err(GatewayError::bad_field(
                "rate_limit.per",
                "must be a duration string such as \"1m\"",
            ))
        }
        None => return Err(GatewayError::bad_field("rate_limit.per", "is required")),
    };
    LimitSpec::parse(requests, per)
        .map(Some)
        .map_err(|p| GatewayError::bad_field(format!("rate_limit.{}", p.field), &p.reason))
}

/// A control's problem as the caller's 400, naming its field.
fn control_error(p: ControlProblem) -> GatewayError {
    GatewayError::bad_field(p.field, &p.reason)
}

/// `enabled`: a bool.
pub(super) fn enabled(value: &Value) -> Result<bool, GatewayError> {
    value
        .as_bool()
        .ok_or_else(|| GatewayError::bad_field("enabled", "must be true or false"))
}

/// `ip_allow`: null (from anywhere) or an array of networks, each a CIDR
/// with no host bits set or a bare address.
pub(super) fn ip_allow(value: &Value) -> Result<Option<Vec<IpNet>>, GatewayError> {
    let list = match value {
        Value::Null => return Ok(None),
        Value::Array(list) => list,
        _ => {
            return Err(GatewayError::bad_field(
                "ip_allow",
                "must be an array of CIDRs such as [\"203.0.113.0/24\"], or null",
            ))
        }
    };
    let entries = list
        .iter()
        .map(|v| {
            v.as_str()
                .ok_or_else(|| GatewayError::bad_field("ip_allow", "must be an array of strings"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    parse_ip_allow(entries).map(Some).map_err(control_error)
}

/// `meta`: null or a JSON object of at most 4 KiB (as compact JSON).
pub(super) fn meta(value: &Value) -> Result<Option<String>, GatewayError> {
    match value {
        Value::Null => Ok(None),
        v => meta_text(v).map(Some).map_err(control_error),
    }
}

/// `credits`: null (unlimited) or `{"remaining": N, "refill": {"amount":
/// N, "interval": "1d"} or null}`. Either part may be left out: then it
/// stays as it is (on create: `remaining` is the refill's amount).
pub(super) fn credits(value: &Value) -> Result<CreditsUpdate, GatewayError> {
    let fields = match value {
        Value::Null => return Ok(CreditsUpdate::Unlimited),
        Value::Object(fields) => fields,
        _ => {
            return Err(GatewayError::bad_field(
                "credits",
                "must be an object such as {\"remaining\": 1000, \"refill\": {\"amount\": 1000, \"interval\": \"1d\"}}, or null",
            ))
        }
    };
    only_fields(fields, "credits", &["remaining", "refill"])?;
    let count = |field: &'static str, v: &Value| match v {
        Value::Number(n) if n.is_i64() || n.is_u64() => {
            let n = n.as_i64().map_or(i128::MAX, i128::from);
            credit_count(field, n).map_err(control_error)
        }
        _ => Err(GatewayError::bad_field(field, "must be a whole number")),
    };
    let remaining = match fields.get("remaining") {
        None => None,
        Some(v) => Some(count("credits.remaining", v)?),
    };
    let refill = match fields.get("refill") {
        None => None,
        Some(Value::Null) => Some(None),
        Some(Value::Object(r)) => {
            only_fields(r, "credits.refill", &["amount", "interval"])?;
            let amount = r
                .get("amount")
                .ok_or_else(|| GatewayError::bad_field("credits.refill.amount", "is required"))?;
            let interval = match r.get("interval") {
                Some(Value::String(s)) => refill_interval(s).map_err(control_error)?,
                Some(_) => {
                    return Err(GatewayError::bad_field(
                        "credits.refill.interval",
                        "must be a duration string such as \"1d\"",
                    ))
                }
                None => {
                    return Err(GatewayError::bad_field(
                        "credits.refill.interval",
                        "is required",
                    ))
                }
            };
            Some(Some(Refill {
                amount: count("credits.refill.amount", amount)?,
                interval,
            }))
        }
        Some(_) => {
            return Err(GatewayError::bad_field(
                "credits.refill",
                "must be an object such as {\"amount\": 1000, \"interval\": \"1d\"}, or null",
            ))
        }
    };
    Ok(CreditsUpdate::Set { remaining, refill })
}

/// `Err` naming the first field of `fields` not in `known`, as `prefix.field`
/// (a field that looks like a secret is not quoted).
pub(super) fn only_fields(
    fields: &serde_json::Map<String, Value>,
    prefix: &'static str,
    known: &[&str],
) -> Result<(), GatewayError> {
    let Some(field) = fields.keys().find(|f| !known.contains(&f.as_str())) else {
        return Ok(());
    };
    if looks_like_secret(field.bytes()) {
        return Err(GatewayError::bad_field(prefix, "holds an unknown field"));
    }
    let name = match prefix {
        "body" => field.clone(),
        _ => format!("{prefix}.{field}"),
    };
    Err(GatewayError::bad_field(name, "unknown field"))
}

/// The fields of a PATCH body that may change.
const PATCHABLE: [&str; 6] = [
    "name",
    "enabled",
    "ip_allow",
    "meta",
    "rate_limit",
    "credits",
];

/// A PATCH body: a JSON object of at least one of [`PATCHABLE`]. A field
/// that exists but cannot change (the id, the organization, the secret, the
/// scopes) is refused by name, as is one that does not exist.
pub(super) fn key_update(bytes: &[u8]) -> Result<KeyUpdate, GatewayError> {
    let input = &json_object(bytes)?;
    if let Some(field) = input.keys().find(|f| FIXED.contains(&f.as_str())) {
        let why = match field.as_str() {
            "scopes" => "cannot change: widening a key means a new key",
            _ => "cannot change",
        };
        return Err(GatewayError::bad_field(field.as_str(), why));
    }
    only_fields(input, "body", &PATCHABLE)?;
    if input.is_empty() {
        return Err(GatewayError::bad_field(
            "body",
            "names no field to change (name, enabled, ip_allow, meta, rate_limit, credits)",
        ));
    }
    let mut update = KeyUpdate::default();
    for (field, value) in input {
        match field.as_str() {
            "name" => update.name = Some(name(Some(value))?),
            "enabled" => update.enabled = Some(enabled(value)?),
            "ip_allow" => update.ip_allow = Some(ip_allow(value)?),
            "meta" => update.meta = Some(meta(value)?),
            "rate_limit" => update.rate_limit = Some(rate_limit(Some(value))?),
            _ => update.credits = Some(credits(value)?),
        }
    }
    Ok(update)
}

/// The record's fields that no request can change.
const FIXED: [&str; 13] = [
    "id",
    "organization_id",
    "user_id",
    "scopes",
    "prefix",
    "status",
    "created_at",
    "expires_at",
    "revoked_at",
    "last_used_at",
    "replaced_by",
    "key",
    "secret",
];

/// Longest key name accepted.
const MAX_NAME_CHARS: usize = 100;

/// A key's `name`: a string of 1 to 100 characters, not blank.
pub(super) fn name(value: Option<&Value>) -> Result<String, GatewayError> {
    match value {
        Some(Value::String(s)) if s.trim().is_empty() => {
            Err(GatewayError::bad_field("name", "must not be empty"))
        }
        Some(Value::String(s)) if s.chars().count() > MAX_NAME_CHARS => Err(
            GatewayError::bad_field("name", "must be at most 100 characters"),
        ),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(GatewayError::bad_field("name", "must be a string")),
        None => Err(GatewayError::bad_field("name", "is required")),
    }
}

/// The controls a create body sets (absent ones are the defaults).
pub(super) fn create_controls(
    input: &serde_json::Map<String, Value>,
) -> Result<KeyControls, GatewayError> {
    let mut controls = KeyControls::default();
    if let Some(v) = input.get("enabled") {
        controls.enabled = enabled(v)?;
    }
    if let Some(v) = input.get("ip_allow") {
        controls.ip_allow = ip_allow(v)?;
    }
    if let Some(v) = input.get("meta") {
        controls.meta = meta(v)?;
    }
    if let Some(v) = input.get("credits") {
        controls.credits = match credits(v)? {
            CreditsUpdate::Unlimited => None,
            CreditsUpdate::Set { remaining, refill } => {
                let refill = refill.flatten();
                let remaining = match (remaining, refill) {
                    (Some(n), _) => n,
                    (None, Some(r)) => r.amount,
                    (None, None) => {
                        return Err(GatewayError::bad_field(
                            "credits.remaining",
                            "is required without a refill",
                        ))
                    }
                };
                // Its period and generation are the store's to set.
                Some(Credits::new(remaining, refill, 0, 0))
            }
        };
    }
    Ok(controls)
}
