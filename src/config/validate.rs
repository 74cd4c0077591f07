//! Raw TOML → [`Settings`], collecting every problem with its TOML path.
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use super::raw::*;
use super::redact::redact_url;
use super::routes::route_settings;
use super::*;

const SECTIONS: [&str; 8] = [
    "server",
    "admin",
    "log",
    "store",
    "rate_limit",
    "roles",
    "upstreams",
    "routes",
];

/// The most connections a listener or an upstream target may be given: each
/// is a semaphore permit (tokio panics past `usize::MAX >> 3`), and draining
/// at shutdown acquires them all as one `u32`.
pub(super) const MAX_CONNECTIONS: usize = u32::MAX as usize;
/// The most header bytes a request may have: twice this bounds the head a
/// connection buffers, and must fit HTTP/2's `u32` header-list limit.
const MAX_HEADER_BYTES: usize = 1 << 30;

/// Collects problems while walking the file.
#[derive(Default)]
pub(super) struct Problems {
    /// Each problem, and whether it is a parse (structural) one.
    list: Vec<(Problem, bool)>,
    /// TOML paths whose value failed to parse; defaults stood in for them.
    failed: Vec<String>,
}

impl Problems {
    pub(super) fn add(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.list.push((
            Problem {
                path: path.into(),
                message: message.into(),
            },
            false,
        ));
    }

    pub(super) fn len(&self) -> usize {
        self.list.len()
    }

    /// Every parse problem, and every other problem not under a path that failed
    /// to parse (those would only be echoes of the defaults standing in for it).
    fn finish(self) -> Vec<Problem> {
        let failed = self.failed;
        let under = |path: &str| {
            failed
                .iter()
                .any(|f| path == f || path.starts_with(&format!("{f}.")))
        };
        self.list
            .into_iter()
            .filter(|(p, parse)| *parse || !under(&p.path))
            .map(|(p, _)| p)
            .collect()
    }

    /// Deserializes one value, recording a failure at `base` + the inner path.
    fn de<T: DeserializeOwned>(&mut self, base: &str, value: toml::Value) -> Option<T> {
        match serde_path_to_error::deserialize::<_, T>(value) {
            Ok(v) => Some(v),
            Err(err) => {
                let inner = err.path().to_string();
                let path = match inner.as_str() {
                    "." | "?" | "" => base.to_string(),
                    _ if base.is_empty() => inner,
                    _ => format!("{base}.{inner}"),
                };
                let message = err.into_inner().to_string().trim().replace('\n', " ");
                self.failed.push(base.to_string());
                self.list.push((Problem { path, message }, true));
                None
            }
        }
    }

    /// A section that may be absent (then its default).
    fn section<T: DeserializeOwned + Default>(&mut self, table: &mut toml::Table, name: &str) -> T {
        match table.remove(name) {
            Some(v) => self.de(name, v).unwrap_or_default(),
            None => T::default(),
        }
    }

    pub(super) fn positive(&mut self, path: &str, d: Duration) {
        if d.is_zero() {
            self.add(path, "must be longer than zero");
        }
    }
}

pub(super) fn validate(text: &str) -> Result<Settings, Vec<Problem>> {
    let mut table: toml::Table = match text.parse() {
        Ok(t) => t,
        Err(e) => {
            let message = e.to_string().trim().replace('\n', " ");
            return Err(vec![Problem {
                path: String::new(),
                message,
            }]);
        }
    };
    let mut p = Problems::default();
    for key in table.keys() {
        if !SECTIONS.contains(&key.as_str()) {
            p.add(
                key.clone(),
                format!("unknown section; expected one of {}", SECTIONS.join(", ")),
            );
        }
    }
    let server: RawServer = p.section(&mut table, "server");
    let admin: RawAdmin = p.section(&mut table, "admin");
    let log: RawLog = p.section(&mut table, "log");
    let store: RawStore = p.section(&mut table, "store");
    let rate_limit: RawRateLimit = p.section(&mut table, "rate_limit");
    let raw_roles: Option<BTreeMap<String, Vec<String>>> =
        table.remove("roles").and_then(|v| p.de("roles", v));
    let raw_upstreams: BTreeMap<String, toml::Value> = table
        .remove("upstreams")
        .and_then(|v| p.de("upstreams", v))
        .unwrap_or_default();
    let raw_routes: Vec<toml::Value> = table
        .remove("routes")
        .and_then(|v| p.de("routes", v))
        .unwrap_or_default();

    let server = server_settings(&mut p, server);
    let admin = AdminSettings {
        listen: admin
            .enabled
            .then(|| socket_addr(&mut p, "admin.listen", &admin.listen))
            .flatten(),
    };
    if let Err(e) = tracing_subscriber::EnvFilter::try_new(&log.level) {
        p.add(
            "log.level",
            format!("invalid level or filter {:?}: {e}", log.level),
        );
    }
    p.positive("log.summary_interval", log.summary_interval);
    let log = LogSettings {
        level: log.level,
        format: log.format,
        summary_interval: log.summary_interval,
    };
    let store = store_settings(&mut p, store);
    let rate_limit = rate_limit_settings(&mut p, rate_limit);

    // Routes first: their scopes are part of what roles may name.
    let mut upstreams = BTreeMap::new();
    if raw_upstreams.is_empty() {
        p.add("upstreams", "at least one [upstreams.NAME] is required");
    }
    for (name, value) in raw_upstreams {
        let path = format!("upstreams.{name}");
        if let Some(raw) = p.de::<RawUpstream>(&path, value) {
            if let Some(u) = super::upstream::upstream_settings(&mut p, &path, raw) {
                upstreams.insert(name, u);
            }
        }
    }
    let raw_routes: Vec<(String, RawRoute)> = raw_routes
        .into_iter()
        .enumerate()
        .filter_map(|(i, v)| {
            let path = format!("routes[{i}]");
            p.de::<RawRoute>(&path, v).map(|r| (path, r))
        })
        .collect();
    if raw_routes.is_empty() && !p.failed.iter().any(|f| f.starts_with("routes")) {
        p.add("routes", "at least one [[routes]] entry is required");
    }

    let raw_roles = raw_roles.unwrap_or_else(default_roles);
    let mut known_scopes: BTreeSet<String> = BUILTIN_SCOPES.iter().map(|s| s.to_string()).collect();
    known_scopes.extend(raw_routes.iter().filter_map(|(_, r)| r.scope.clone()));
    let granted: HashSet<&str> = raw_roles.values().flatten().map(String::as_str).collect();
    let roles = roles_settings(&mut p, &raw_roles, &known_scopes);

    let mut routes = Vec::with_capacity(raw_routes.len());
    let mut seen = HashSet::new();
    for (path, raw) in raw_routes {
        if let Some(route) = route_settings(
            &mut p,
            &path,
            raw,
            &upstreams,
            &rate_limit.policies,
            &granted,
        ) {
            if !seen.insert((route.method.clone(), route.path.clone())) {
                p.add(
                    &path,
                    format!("duplicate route {} {}", route.method, route.path),
                );
            }
            routes.push(route);
        }
    }

    if p.len() == 0 {
        Ok(Settings {
            server,
            admin,
            log,
            store,
            rate_limit,
            roles,
            upstreams,
            routes,
            known_scopes,
        })
    } else {
        Err(p.finish())
    }
}

fn socket_addr(p: &mut Problems, path: &str, text: &str) -> Option<SocketAddr> {
    match text.parse() {
        Ok(a) => Some(a),
        Err(_) => {
            p.add(
                path,
                format!("invalid address {text:?}: expected IP:PORT, e.g. \"127.0.0.1:8443\""),
            );
            None
        }
    }
}

fn server_settings(p: &mut Problems, raw: RawServer) -> ServerSettings {
    let listen = socket_addr(
        p,
        "server.listen",
        raw.listen.as_deref().unwrap_or("0.0.0.0:8443"),
    )
    .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 8443)));
    let tls = match (raw.insecure_http, raw.tls) {
        (true, _) => None,
        (false, None) => {
            p.add("server.tls", "required unless server.insecure_http = true (set cert and key, or self_signed = true)");
            None
        }
        (false, Some(tls)) if tls.self_signed => {
            if tls.cert.is_some() || tls.key.is_some() {
                p.add("server.tls.self_signed", "cannot be combined with cert/key");
            }
            Some(TlsSettings::SelfSigned)
        }
        (false, Some(tls)) => {
            let mut file = |name: &str, v: Option<String>| -> Option<PathBuf> {
                let path = format!("server.tls.{name}");
                match v {
                    None => {
                        p.add(path, "required (a PEM file path)");
                        None
                    }
                    Some(f) if !std::path::Path::new(&f).is_file() => {
                        p.add(path, format!("file {f:?} does not exist or is not a file"));
                        None
                    }
                    Some(f) => Some(PathBuf::from(f)),
                }
            };
            let cert = file("cert", tls.cert);
            let key = file("key", tls.key);
            cert.zip(key)
                .map(|(cert, key)| TlsSettings::Files { cert, key })
        }
    };
    if raw.workers > 1024 {
        p.add("server.workers", "at most 1024 (0 = one per core)");
    }
    let l = raw.limits;
    if l.max_header_bytes < 1024 {
        p.add("server.limits.max_header_bytes", "must be at least 1024");
    } else if l.max_header_bytes > MAX_HEADER_BYTES {
        p.add(
            "server.limits.max_header_bytes",
            format!("at most {MAX_HEADER_BYTES}"),
        );
    }
    if l.max_body_bytes == 0 {
        p.add("server.limits.max_body_bytes", "must be greater than zero");
    }
    if l.max_connections == 0 {
        p.add("server.limits.max_connections", "must be greater than zero");
    } else if l.max_connections > MAX_CONNECTIONS {
        p.add(
            "server.limits.max_connections",
            format!("at most {MAX_CONNECTIONS}"),
        );
    }
    p.positive("server.limits.header_read_timeout", l.header_read_timeout);
    p.positive("server.limits.idle_timeout", l.idle_timeout);
    ServerSettings {
        listen,
        tls,
        workers: raw.workers,
        limits: Limits {
            max_header_bytes: l.max_header_bytes,
            max_body_bytes: l.max_body_bytes,
            header_read_timeout: l.header_read_timeout,
            idle_timeout: l.idle_timeout,
            max_connections: l.max_connections,
            shutdown_grace: l.shutdown_grace,
        },
    }
}

fn store_settings(p: &mut Problems, raw: RawStore) -> StoreSettings {
    let (url, display) = match raw.kind {
        StoreKind::Sqlite => {
            if raw.url.is_some() {
                p.add(
                    "store.url",
                    "only for kind = \"postgres\" (sqlite takes store.path)",
                );
            }
            let path = raw.path.unwrap_or_else(|| "data/gateway.db".into());
            if path.is_empty() {
                p.add("store.path", "must not be empty");
            }
            let url = format!("sqlite://{path}?mode=rwc");
            (url, format!("sqlite:{path}"))
        }
        StoreKind::Postgres => {
            if raw.path.is_some() {
                p.add(
                    "store.path",
                    "only for kind = \"sqlite\" (postgres takes store.url)",
                );
            }
            match raw.url {
                Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                    let display = redact_url(&url);
                    (url, display)
                }
                Some(url) => {
                    p.add(
                        "store.url",
                        format!("expected a postgres:// url, got {:?}", redact_url(&url)),
                    );
                    (String::new(), String::new())
                }
                None => {
                    p.add("store.url", "required when kind = \"postgres\"");
                    (String::new(), String::new())
                }
            }
        }
    };
    p.positive("store.cache_ttl", raw.cache_ttl);
    p.positive("store.negative_cache_ttl", raw.negative_cache_ttl);
    p.positive("store.query_timeout", raw.query_timeout);
    if raw.cache_capacity == 0 {
        p.add("store.cache_capacity", "must be greater than zero");
    }
    if raw.negative_cache_capacity == 0 {
        p.add("store.negative_cache_capacity", "must be greater than zero");
    }
    StoreSettings {
        url,
        display,
        cache_ttl: raw.cache_ttl,
        negative_cache_ttl: raw.negative_cache_ttl,
        cache_capacity: raw.cache_capacity,
        negative_cache_capacity: raw.negative_cache_capacity,
        stale_if_error: raw.stale_if_error,
        query_timeout: raw.query_timeout,
    }
}

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

fn rate_limit_settings(p: &mut Problems, raw: RawRateLimit) -> RateLimitSettings {
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

fn default_roles() -> BTreeMap<String, Vec<String>> {
    let list = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    BTreeMap::from([
        ("owner".into(), list(&["*"])),
        ("admin".into(), list(&["*"])),
        (
            "member".into(),
            list(&[
                "clusters:read",
                "clusters:write",
                "api-keys:read",
                "api-keys:write",
            ]),
        ),
        ("viewer".into(), list(&["clusters:read", "api-keys:read"])),
    ])
}

fn roles_settings(
    p: &mut Problems,
    raw: &BTreeMap<String, Vec<String>>,
    known: &BTreeSet<String>,
) -> Roles {
    let mut map = foldhash::HashMap::default();
    for (role, perms) in raw {
        let path = format!("roles.{role}");
        if perms.iter().any(|x| x == "*") {
            if perms.len() > 1 {
                p.add(&path, "\"*\" already grants everything; list nothing else");
            }
            map.insert(role.clone(), Permissions::All);
            continue;
        }
        for (i, perm) in perms.iter().enumerate() {
            if !known.contains(perm) {
                let all: Vec<&str> = known.iter().map(String::as_str).collect();
                p.add(
                    format!("{path}[{i}]"),
                    format!("unknown permission {perm:?}; known: {}", all.join(", ")),
                );
            }
        }
        map.insert(role.clone(), Permissions::Only(perms.clone()));
    }
    Roles { map }
}
