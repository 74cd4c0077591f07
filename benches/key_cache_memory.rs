//! Memory per cached API key: 100 000 distinct keys loaded into a
//! [`CachedKeyStore`] (from a store that makes each record on the fly, so only
//! the cache holds them), measured as the growth of the process's resident set.
//! Prints the bytes per key, and the same less the strings the hot path reads
//! (key id, organization, user, role, scopes), which every representation holds.
//!
//! `cargo bench --bench key_cache_memory` (or `cargo test --bench key_cache_memory`:
//! the layout, hence the figure, is the same in a debug build). Linux only (`/proc`).
use mpg_gateway::secret::{hash_secret, SecretHash};
use mpg_gateway::store::{
    ApiKeyAuth, ApiKeyRecord, CacheConfig, CachedKeyStore, KeyStore, SessionAuth, StoreError,
    UserAccess,
};
use std::sync::Arc;
use std::time::Duration;

const KEYS: usize = 100_000;
/// Lookups in flight at once while the cache fills.
const CONCURRENT: usize = 256;

/// Answers every hash with a key derived from it, as the load suite seeds them.
struct Synthetic;

fn record(hash: &SecretHash) -> ApiKeyAuth {
    let hex = hash.to_hex();
    ApiKeyAuth {
        key: ApiKeyRecord {
            id: format!("key_{}", &hex[..16]),
            name: format!("bench-{}", &hex[16..21]),
            organization_id: "acme".into(),
            user_id: "alice".into(),
            scopes: vec!["clusters:read".into()],
            prefix: hex[21..29].to_owned(),
            created_at: 1_700_000_000,
            expires_at: None,
            revoked_at: None,
            last_used_at: None,
            replaced_by: None,
            rate_limit: None,
            controls: Default::default(),
        },
        role: Some("owner".into()),
        org_limits: Vec::new(),
    }
}

/// The bytes of the strings authentication reads, per key.
fn hot_strings() -> usize {
    let r = record(&hash_secret("x"));
    r.key.id.len()
        + r.key.organization_id.len()
        + r.key.user_id.len()
        + r.role.as_deref().map_or(0, str::len)
        + r.key.scopes.iter().map(String::len).sum::<usize>()
}

#[async_trait::async_trait]
impl KeyStore for Synthetic {
    async fn find_api_key(&self, hash: &SecretHash) -> Result<Option<ApiKeyAuth>, StoreError> {
        Ok(Some(record(hash)))
    }
    async fn find_session(&self, _: &SecretHash) -> Result<Option<SessionAuth>, StoreError> {
        Ok(None)
    }
    async fn find_user_access(&self, _: &str) -> Result<Option<UserAccess>, StoreError> {
        Ok(None)
    }
    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// Resident set size in bytes (`/proc/self/statm`, second field, in pages).
fn rss() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

async fn measure() {
    let hashes: Vec<SecretHash> = (0..KEYS)
        .map(|i| hash_secret(&format!("mpg_bench_{i}")))
        .collect();
    let cfg = CacheConfig {
        ttl: Duration::from_secs(3600),
        negative_ttl: Duration::from_secs(5),
        capacity: 1_000_000,
        negative_capacity: 100_000,
        stale_if_error: Duration::from_secs(60),
    };
    let cache = CachedKeyStore::new(Arc::new(Synthetic), cfg);
    // One warm-up lookup: the runtime's and the tier's first allocations are not per key.
    let _ = cache.api_key(&hash_secret("warm-up")).await;
    let before = rss();
    for chunk in hashes.chunks(CONCURRENT) {
        let lookups = chunk.iter().map(|h| cache.api_key(h));
        for found in futures_util::future::join_all(lookups).await {
            assert!(matches!(found, Ok(Some(_))), "lookup failed");
        }
    }
    let grown = rss().saturating_sub(before);
    let per_key = grown as f64 / KEYS as f64;
    let strings = hot_strings();
    println!(
        "{KEYS} keys cached: RSS +{:.1} MiB, {per_key:.0} bytes per key, \
         {:.0} beyond the {strings} bytes of strings authentication reads",
        grown as f64 / (1 << 20) as f64,
        per_key - strings as f64
    );
    assert_eq!(cache.entry_count(), KEYS as u64 + 1);
}

fn main() {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(measure());
}
