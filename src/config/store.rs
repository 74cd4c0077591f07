//! Validation of `[store]`: the SQLite path or PostgreSQL url (with its TLS
//! parameters), and the cache sizes and timeouts.
use super::problems::Problems;
use super::raw::{RawStore, StoreKind};
use super::redact::redact_url;
use super::StoreSettings;
use std::path::Path;

/// The `sslmode` values the PostgreSQL driver knows (any case).
const SSL_MODES: [&str; 6] = [
    "disable",
    "allow",
    "prefer",
    "require",
    "verify-ca",
    "verify-full",
];

/// The connect parameters the PostgreSQL driver reads (sqlx-postgres's
/// `options/parse.rs`); it ignores any other, and logs its value as it does.
const CONNECT_PARAMETERS: [&str; 19] = [
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
    "options[NAME]",
];

/// Checks the connect parameters of a `postgres://` url now, so that a typo
/// in `sslmode`, a missing `sslrootcert` file, or a parameter the driver
/// does not know (which it would ignore, and log with its value, a password
/// perhaps) is a configuration error rather than a failed start or a secret
/// in the log. Names as the driver reads them (it also takes `ssl-mode`,
/// `ssl-root-cert` and `ssl-ca`). Values are never printed.
fn postgres_params(p: &mut Problems, url: &str) {
    // After the user info, which may hold a `?` in a password.
    let rest = url.rsplit_once('@').map_or(url, |(_, rest)| rest);
    let Some((_, query)) = rest.split_once('?') else {
        return;
    };
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        match &*name {
            "sslmode" | "ssl-mode" if !SSL_MODES.contains(&value.to_ascii_lowercase().as_str()) => {
                p.add(
                    "store.url",
                    format!("{name}={value:?}: expected one of {}", SSL_MODES.join(", ")),
                );
            }
            "sslrootcert" | "ssl-root-cert" | "ssl-ca" => {
                if let Err(e) = crate::tls::pem::load_roots(Path::new(&*value)) {
                    p.add("store.url", format!("{name}: {e}"));
                }
            }
            known if CONNECT_PARAMETERS.contains(&known) => {}
            option if option.starts_with("options[") && option.ends_with(']') => {}
            unknown => {
                let name = match crate::secret::looks_like_secret(unknown.bytes()) {
                    true => "(a secret)",
                    false => unknown,
                };
                p.add(
                    "store.url",
                    format!(
                        "unknown connect parameter {name:?} (the driver would ignore it); expected one of {}",
                        CONNECT_PARAMETERS.join(", ")
                    ),
                );
            }
        }
    }
}

pub(super) fn store_settings(p: &mut Problems, raw: RawStore) -> StoreSettings {
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
                    postgres_params(p, &url);
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
    p.positive("store.audit_retention", raw.audit_retention);
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
        audit_retention: raw.audit_retention,
        wait_at_start: raw.wait_at_start,
    }
}
