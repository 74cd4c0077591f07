//! `[upstreams.NAME]` → [`UpstreamSettings`]: targets, balancing, timeouts,
//! retries, health and the TLS client files, each problem at its TOML path.
use http::Uri;
use std::path::PathBuf;
use std::time::Duration;

use super::problems::Problems;
use super::raw::RawUpstream;
use super::signing::{signing_keys, Env};
use super::{BuiltinService, HttpUpstreamSettings, UpstreamSettings};

/// Defaults a user would expect (nginx- and Envoy-like).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const RETRIES: u32 = 1;
const MAX_CONNECTIONS_PER_TARGET: usize = 512;
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
const MAX_FAILS: u32 = 3;
/// The longest back-off between probes of an ejected target (the first is
/// 250 ms): a target back after a long outage is used again within it.
const FAIL_TIMEOUT: Duration = Duration::from_secs(2);
const HEALTH_INTERVAL: Duration = Duration::from_secs(5);

pub(super) fn upstream_settings(
    p: &mut Problems,
    path: &str,
    raw: RawUpstream,
    env: Env<'_>,
) -> Option<UpstreamSettings> {
    match (&raw.targets, &raw.builtin) {
        (Some(_), Some(_)) => {
            p.add(path, "set either targets or builtin, not both");
            None
        }
        (None, None) => {
            p.add(
                path,
                "needs targets = [\"http://HOST:PORT\", …] or builtin = \"api-keys\"",
            );
            None
        }
        (None, Some(b)) => {
            let keys = raw.forwarding_keys();
            if !keys.is_empty() {
                p.add(
                    path,
                    format!(
                        "{} apply to targets, not to a builtin service",
                        keys.join(", ")
                    ),
                );
            }
            if b == "api-keys" {
                Some(UpstreamSettings::Builtin(BuiltinService::ApiKeys))
            } else {
                p.add(
                    format!("{path}.builtin"),
                    format!("unknown builtin service {b:?}; known: \"api-keys\""),
                );
                None
            }
        }
        (Some(_), None) => {
            http_settings(p, path, raw, env).map(|h| UpstreamSettings::Http(Box::new(h)))
        }
    }
}

/// Checks an upstream of `targets`, one group of keys at a time.
fn http_settings(
    p: &mut Problems,
    path: &str,
    raw: RawUpstream,
    env: Env<'_>,
) -> Option<HttpUpstreamSettings> {
    let targets = targets(p, path, raw.targets.as_deref().unwrap_or_default());
    let connections = connections(p, path, &raw);
    let health = health(p, path, &raw);
    let https = targets.iter().any(|u| u.scheme_str() == Some("https"));
    let tls = tls_files(p, path, &raw, https);
    if raw.sign_content_digest.is_some() && raw.sign_identity_key_env.is_none() {
        p.add(
            format!("{path}.sign_content_digest"),
            "needs sign_identity_key_env",
        );
    }
    let sign_identity = signing_keys(
        p,
        path,
        raw.sign_identity_key_env,
        raw.sign_identity_previous_key_env,
        env,
    );
    Some(HttpUpstreamSettings {
        targets,
        balance: raw.balance.unwrap_or_default(),
        connect_timeout: connections.connect_timeout,
        request_timeout: connections.request_timeout,
        timeout: raw.timeout,
        retries: connections.retries,
        max_connections_per_target: connections.max_connections_per_target,
        idle_timeout: connections.idle_timeout,
        max_fails: raw.max_fails.unwrap_or(MAX_FAILS),
        fail_timeout: health.fail_timeout,
        health_path: raw.health_path,
        health_interval: health.health_interval,
        ca_file: tls.ca_file,
        client_identity: tls.client_identity,
        http2: raw.http2.unwrap_or(false),
        sign_identity,
        sign_content_digest: raw.sign_content_digest.unwrap_or(true),
        forward_key_meta: raw.forward_key_meta.unwrap_or(false),
    })
}

/// `targets`: at least one, each `http://` or `https://` with an authority
/// and no path or query, none twice.
fn targets(p: &mut Problems, path: &str, targets: &[String]) -> Vec<Uri> {
    if targets.is_empty() {
        p.add(format!("{path}.targets"), "needs at least one target");
    }
    let mut uris = Vec::new();
    for (i, t) in targets.iter().enumerate() {
        let tpath = format!("{path}.targets[{i}]");
        match t.parse::<Uri>() {
            Ok(u)
                if matches!(u.scheme_str(), Some("http" | "https"))
                    && u.authority().is_some()
                    && matches!(u.path(), "" | "/")
                    && u.query().is_none() =>
            {
                if uris.contains(&u) {
                    p.add(tpath, format!("duplicate target {t:?}"));
                } else {
                    uris.push(u)
                }
            }
            _ => p.add(
                tpath,
                format!(
                "invalid target {t:?}: expected http://HOST:PORT or https://HOST:PORT with no path"
            ),
            ),
        }
    }
    uris
}

/// How requests reach the targets, defaults filled in.
struct Connections {
    connect_timeout: Duration,
    request_timeout: Duration,
    retries: u32,
    max_connections_per_target: usize,
    idle_timeout: Duration,
}

/// Checks the timeouts (the whole-request one no shorter than
/// `request_timeout`), the connection limit and the retries.
fn connections(p: &mut Problems, path: &str, raw: &RawUpstream) -> Connections {
    let key = |k: &str| format!("{path}.{k}");
    let connect_timeout = raw.connect_timeout.unwrap_or(CONNECT_TIMEOUT);
    let request_timeout = raw.request_timeout.unwrap_or(REQUEST_TIMEOUT);
    p.positive(&key("connect_timeout"), connect_timeout);
    p.positive(&key("request_timeout"), request_timeout);
    if let Some(t) = raw.timeout {
        p.positive(&key("timeout"), t);
        if t < request_timeout && !t.is_zero() {
            p.add(
                key("timeout"),
                "the whole-request timeout must not be shorter than request_timeout",
            );
        }
    }
    let max_connections_per_target = raw
        .max_connections_per_target
        .unwrap_or(MAX_CONNECTIONS_PER_TARGET);
    if max_connections_per_target == 0 {
        p.add(key("max_connections_per_target"), "must be at least 1");
    } else if max_connections_per_target > super::problems::MAX_CONNECTIONS {
        p.add(
            key("max_connections_per_target"),
            format!("at most {}", super::problems::MAX_CONNECTIONS),
        );
    }
    let retries = raw.retries.unwrap_or(RETRIES);
    if retries > 10 {
        p.add(key("retries"), "at most 10");
    }
    let idle_timeout = raw.idle_timeout.unwrap_or(IDLE_TIMEOUT);
    p.positive(&key("idle_timeout"), idle_timeout);
    Connections {
        connect_timeout,
        request_timeout,
        retries,
        max_connections_per_target,
        idle_timeout,
    }
}

/// When a failing target is ejected and probed, defaults filled in.
struct Health {
    fail_timeout: Duration,
    health_interval: Duration,
}

/// Checks the ejection back-off and the active check: an interval needs a
/// `health_path`, which must be an origin-form path.
fn health(p: &mut Problems, path: &str, raw: &RawUpstream) -> Health {
    let key = |k: &str| format!("{path}.{k}");
    let fail_timeout = raw.fail_timeout.unwrap_or(FAIL_TIMEOUT);
    p.positive(&key("fail_timeout"), fail_timeout);
    let health_interval = raw.health_interval.unwrap_or(HEALTH_INTERVAL);
    p.positive(&key("health_interval"), health_interval);
    if raw.health_interval.is_some() && raw.health_path.is_none() {
        p.add(
            key("health_interval"),
            "needs health_path (the active check is off without it)",
        );
    }
    if let Some(hp) = &raw.health_path {
        let ok = hp.starts_with('/')
            && hp
                .parse::<http::uri::PathAndQuery>()
                .is_ok_and(|pq| pq.as_str() == hp);
        if !ok {
            p.add(
                key("health_path"),
                format!("invalid path {hp:?}: expected an origin-form path such as \"/healthz\""),
            );
        }
    }
    Health {
        fail_timeout,
        health_interval,
    }
}

/// The TLS client's files.
struct TlsFiles {
    ca_file: Option<PathBuf>,
    client_identity: Option<(PathBuf, PathBuf)>,
}

/// Checks the TLS client's files: for `https://` targets only, each
/// readable, a certificate and its key given together.
fn tls_files(p: &mut Problems, path: &str, raw: &RawUpstream, https: bool) -> TlsFiles {
    let key = |k: &str| format!("{path}.{k}");
    let mut tls_file = |name: &str, value: &Option<String>| -> Option<PathBuf> {
        let f = value.as_ref()?;
        if !https {
            p.add(key(name), "applies only to https:// targets");
            return None;
        }
        Some(PathBuf::from(f))
    };
    let ca_file = tls_file("ca_file", &raw.ca_file);
    let cert = tls_file("client_cert", &raw.client_cert);
    let client_key = tls_file("client_key", &raw.client_key);
    if let Some(ca) = &ca_file {
        if let Err(e) = crate::tls::pem::load_roots(ca) {
            p.add(key("ca_file"), e);
        }
    }
    let client_identity = match (cert, client_key) {
        (Some(c), Some(k)) => {
            match crate::tls::pem::load_identity(&c, &k) {
                Ok(_) => {}
                Err((which, e)) => p.add(key(which), e),
            }
            Some((c, k))
        }
        (Some(_), None) => {
            p.add(key("client_key"), "required with client_cert");
            None
        }
        (None, Some(_)) => {
            p.add(key("client_cert"), "required with client_key");
            None
        }
        (None, None) => None,
    };
    TlsFiles {
        ca_file,
        client_identity,
    }
}
