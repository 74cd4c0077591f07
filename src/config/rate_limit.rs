//! Validation of `[rate_limit]`: the backend (in-process or Redis, with its
//! TLS trust), the named policies and the per-IP budget of failed
//! authentications.
use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::path::PathBuf;
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

/// The url schemes the limiter connects with: one server or a cluster, plain or TLS.
const REDIS_SCHEMES: [&str; 4] = [
    "redis://",
    "rediss://",
    "redis+cluster://",
    "rediss+cluster://",
];

fn redis_settings(p: &mut Problems, raw: &RawRateLimit) -> Option<RedisSettings> {
    let Some(url) = raw.redis_url.clone() else {
        p.add("rate_limit.redis_url", "required when backend = \"redis\"");
        return None;
    };
    if !REDIS_SCHEMES.iter().any(|s| url.starts_with(s)) {
        p.add(
            "rate_limit.redis_url",
            format!(
                "expected a redis://, rediss://, redis+cluster:// or rediss+cluster:// url, got {:?}",
                redact_url(&url)
            ),
        );
        return None;
    }
    let tls = url.starts_with("rediss");
    // The redis crate reads `#insecure` as "do not check the certificate",
    // which this build does not offer: a private CA goes in redis_ca_file.
    if url.contains('#') {
        p.add(
            "rate_limit.redis_url",
            "no #fragment (#insecure is not supported: give a private CA in rate_limit.redis_ca_file)",
        );
    }
    let ca_file = raw.redis_ca_file.as_ref().map(PathBuf::from);
    if let Some(ca) = &ca_file {
        if !tls {
            p.add(
                "rate_limit.redis_ca_file",
                "applies only to rediss:// and rediss+cluster:// urls",
            );
        } else if let Err(e) = crate::tls::pem::load_roots(ca) {
            p.add("rate_limit.redis_ca_file", e);
        }
    }
    p.positive("rate_limit.redis_timeout", raw.redis_timeout);
    Some(RedisSettings {
        url,
        prefix: raw.redis_prefix.clone(),
        timeout: raw.redis_timeout,
        ca_file,
    })
}

pub(super) fn rate_limit_settings(p: &mut Problems, raw: RawRateLimit) -> RateLimitSettings {
    let redis = match raw.backend {
        RawBackend::Local => None,
        RawBackend::Redis => redis_settings(p, &raw),
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
            match quota(p, &path, rp.requests, rp.per) {
                Some(q) => policies.push(PolicySettings {
                    name,
                    quota: q,
                    key: rp.key,
                    mode: rp.mode,
                }),
                None => p.refuse(path),
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
