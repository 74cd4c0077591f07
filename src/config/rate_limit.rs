//! Validation of `[rate_limit]`: the backend (in-process or Redis), the
//! named policies and the per-IP budget of failed authentications.
use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::time::Duration;

use super::problems::Problems;
use super::raw::{RawBackend, RawPolicy, RawRateLimit};
use super::redact::redact_url;
use super::{PolicySettings, QuotaSettings, RateLimitSettings, RedisSettings};

fn quota(p: &mut Problems, path: &str, requests: u32, per: Duration) -> Option<QuotaSettings> {
    let Some(requests) = NonZeroU32::new(requests) else {
        p.add(format!("{path}.requests"), "must be at least 1");
        return None;
    };
    if per.is_zero() {
        p.add(format!("{path}.per"), "must be longer than zero");
        return None;
    }
    Some(QuotaSettings { requests, per })
}

pub(super) fn rate_limit_settings(p: &mut Problems, raw: RawRateLimit) -> RateLimitSettings {
    let redis = match raw.backend {
        RawBackend::Local => None,
        RawBackend::Redis => match raw.redis_url {
            // The redis client is built without TLS: a `rediss://` url would
            // pass here and then stop every start.
            Some(url) if url.starts_with("rediss://") => {
                p.add(
                    "rate_limit.redis_url",
                    "rediss:// (TLS) is not supported by this build; use redis://",
                );
                None
            }
            Some(url) if url.starts_with("redis://") => {
                p.positive("rate_limit.redis_timeout", raw.redis_timeout);
                Some(RedisSettings {
                    url,
                    prefix: raw.redis_prefix,
                    timeout: raw.redis_timeout,
                })
            }
            Some(url) => {
                p.add(
                    "rate_limit.redis_url",
                    format!("expected a redis:// url, got {:?}", redact_url(&url)),
                );
                None
            }
            None => {
                p.add("rate_limit.redis_url", "required when backend = \"redis\"");
                None
            }
        },
    };
    let mut policies = Vec::new();
    let raw_policies = raw.policies.unwrap_or_else(|| {
        let mut m = BTreeMap::new();
        m.insert(
            "default".to_string(),
            toml::Value::Table(toml::toml! { requests = 100
            per = "1m" }),
        );
        m
    });
    for (name, value) in raw_policies {
        let path = format!("rate_limit.policies.{name}");
        if name == "none" {
            p.add(
                &path,
                "\"none\" is reserved (a route with rate_limit = \"none\" is not limited)",
            );
            continue;
        }
        if let Some(rp) = p.de::<RawPolicy>(&path, value) {
            if let Some(q) = quota(p, &path, rp.requests, rp.per) {
                policies.push(PolicySettings {
                    name,
                    quota: q,
                    key: rp.key,
                    mode: rp.mode,
                });
            }
        }
    }
    let af = &raw.auth_failures;
    let auth_failures =
        quota(p, "rate_limit.auth_failures", af.requests, af.per).unwrap_or(QuotaSettings {
            requests: NonZeroU32::MIN,
            per: Duration::from_secs(60),
        });
    RateLimitSettings {
        redis,
        on_backend_error: raw.on_backend_error,
        ietf_headers: raw.ietf_headers,
        policies,
        auth_failures,
    }
}
