//! The key service's request inputs that need nothing of the service: the
//! paging query of its lists, the rotate body's grace period, a key's
//! expiry time and its own rate limit.
use serde_json::Value;

use crate::error::GatewayError;
use crate::secret::looks_like_secret;
use crate::store::LimitSpec;

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

/// Longest grace period a rotation accepts: 7 days, in seconds.
pub const MAX_GRACE_SECONDS: i64 = 7 * 24 * 3600;

/// The rotate body: empty, or a JSON object with an optional
/// `grace_period_seconds`, a whole number from 0 to [`MAX_GRACE_SECONDS`].
pub(super) fn grace_period(bytes: &[u8]) -> Result<i64, GatewayError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(0);
    }
    let input: Value = serde_json::from_slice(bytes)
        .map_err(|e| GatewayError::bad_field("body", &format!("is not valid JSON ({e})")))?;
    let input = input
        .as_object()
        .ok_or_else(|| GatewayError::bad_field("body", "must be a JSON object"))?;
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
