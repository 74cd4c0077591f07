//! Validation of `[store]`: the SQLite path or PostgreSQL url, and the
//! cache sizes and timeouts.
use super::problems::Problems;
use super::raw::{RawStore, StoreKind};
use super::redact::redact_url;
use super::StoreSettings;

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
