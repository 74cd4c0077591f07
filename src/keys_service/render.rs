//! The API's JSON of what the key service shows (API-SPEC.md): an API key,
//! its own rate limit, an audit event, and the RFC 3339 times they share.
//! The admin API and the command line show the same records the same way
//! through these functions.
use serde_json::{json, Value};

use crate::config::format_duration;
use crate::store::{ApiKeyRecord, AuditEvent, Credits, LimitSpec};

/// Unix seconds as an RFC 3339 UTC string, or JSON null.
pub fn rfc3339(at: Option<i64>) -> Value {
    at.and_then(|s| time::OffsetDateTime::from_unix_timestamp(s).ok())
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .map_or(Value::Null, Value::String)
}

/// An API key at `now`: id, name, organization_id, user_id, scopes[],
/// prefix, status, created_at, expires_at, revoked_at, last_used_at (RFC
/// 3339 UTC or null), replaced_by (key id or null), rate_limit
/// (`{"requests", "per"}` or null), enabled, ip_allow (CIDRs or null), meta
/// (an object or null) and credits (or null: unlimited). Never the secret.
pub fn api_key(record: &ApiKeyRecord, now: i64) -> Value {
    let c = &record.controls;
    json!({
        "id": record.id,
        "name": record.name,
        "organization_id": record.organization_id,
        "user_id": record.user_id,
        "scopes": record.scopes,
        "prefix": record.prefix,
        "status": record.status(now).as_str(),
        "created_at": rfc3339(Some(record.created_at)),
        "expires_at": rfc3339(record.expires_at),
        "revoked_at": rfc3339(record.revoked_at),
        "last_used_at": rfc3339(record.last_used_at),
        "replaced_by": record.replaced_by,
        "rate_limit": record.rate_limit.as_ref().map(limit),
        "enabled": c.enabled,
        "ip_allow": c.ip_allow.as_ref().map(|nets| {
            nets.iter().map(ToString::to_string).collect::<Vec<_>>()
        }),
        "meta": c.meta.as_deref().and_then(|m| serde_json::from_str::<Value>(m).ok()),
        "credits": c.credits.as_ref().map(|cr| credits(cr, record.created_at, now)),
    })
}

/// [`api_key`] with its secret under `key`: the answer that creates one,
/// the only one that ever shows it.
pub fn api_key_with_secret(record: &ApiKeyRecord, secret: String, now: i64) -> Value {
    let mut v = api_key(record, now);
    v["key"] = Value::String(secret);
    v
}

/// `{"remaining": N, "refill": {"amount": N, "interval": "1d"} or null}`,
/// the count as it stands at `now` (a passed boundary refills it).
pub fn credits(c: &Credits, created_at: i64, now: i64) -> Value {
    json!({
        "remaining": c.remaining_at(created_at, now),
        "refill": c.refill.map(|r| json!({
            "amount": r.amount,
            "interval": format_duration(r.interval),
        })),
    })
}

/// `{"requests": N, "per": "1m"}` (the duration in its largest exact unit).
pub fn limit(spec: &LimitSpec) -> Value {
    json!({ "requests": spec.requests.get(), "per": format_duration(spec.per) })
}

/// An audit event; a rotation also names the key it made as `replaced_by`,
/// as the key's record does.
pub fn audit_event(event: &AuditEvent) -> Value {
    let mut out = json!({
        "id": event.id,
        "action": event.action,
        "key_id": event.key_id,
        "subject": event.subject,
        "organization_id": event.organization_id,
        "actor": event.actor,
        "request_id": event.request_id,
        "client": event.client,
        "at": rfc3339(Some(event.at)),
    });
    if event.action == "api_key.rotated" {
        out["replaced_by"] = json!(event.subject);
    }
    // An update names the fields it set (never their values).
    if event.action == "api_key.updated" {
        let fields = event.subject.as_deref().unwrap_or_default();
        out["fields"] = json!(fields
            .split(',')
            .filter(|f| !f.is_empty())
            .collect::<Vec<_>>());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::store::testing::api_key_record as record;

    #[test]
    fn json_has_every_documented_field() {
        let j = api_key(&record(), 10);
        assert_eq!(j["id"], "key_abc");
        assert_eq!(j["scopes"], json!(["clusters:read", "clusters:write"]));
        assert_eq!(j["status"], "active");
        assert_eq!(j["created_at"], "1970-01-01T00:00:00Z");
        assert_eq!(j["expires_at"], "1970-01-01T00:01:40Z");
        assert_eq!(j["revoked_at"], Value::Null);
        assert_eq!(j["last_used_at"], Value::Null);
        assert_eq!(j["prefix"], "AbCdEfGh");
        assert_eq!(j["replaced_by"], Value::Null);
        assert_eq!(j["rate_limit"], Value::Null);
        assert_eq!(j["enabled"], true);
        assert_eq!(j["ip_allow"], Value::Null);
        assert_eq!(j["meta"], Value::Null);
        assert_eq!(j["credits"], Value::Null);
        assert_eq!(j.as_object().map(|o| o.len()), Some(17));
        let mut limited = record();
        limited.rate_limit = LimitSpec::parse(10, "1m").ok();
        assert_eq!(
            api_key(&limited, 10)["rate_limit"],
            json!({"requests": 10, "per": "1m"})
        );
        assert_eq!(api_key(&record(), 100)["status"], "expired");
    }

    #[test]
    fn a_limit_is_shown_in_its_largest_exact_unit() {
        let shown = |n, per| LimitSpec::parse(n, per).ok().as_ref().map(limit);
        assert_eq!(
            shown(100, "1m"),
            Some(json!({"requests": 100, "per": "1m"}))
        );
        assert_eq!(shown(5, "90s"), Some(json!({"requests": 5, "per": "90s"})));
    }

    #[test]
    fn a_rotation_event_names_the_new_key_as_replaced_by() {
        let mut event = AuditEvent {
            id: "evt_1".into(),
            action: "api_key.rotated".into(),
            key_id: Some("key_old".into()),
            subject: Some("key_new".into()),
            organization_id: "acme".into(),
            actor: "cli".into(),
            request_id: None,
            client: None,
            at: 0,
        };
        let shown = audit_event(&event);
        assert_eq!(shown["replaced_by"], "key_new");
        assert_eq!(shown["at"], "1970-01-01T00:00:00Z");
        assert_eq!(shown.as_object().map(|o| o.len()), Some(10));
        event.action = "api_key.revoked".into();
        assert_eq!(audit_event(&event).get("replaced_by"), None);
    }
}
