//! Building the pipeline from [`Settings`]: the store and its cache, the
//! limiter, the upstreams and the route table.
use std::sync::Arc;
use std::time::Duration;

use super::StartError;
use crate::config::Settings;
use crate::pipeline::Pipeline;
use crate::ratelimit::{OnBackendError, Quota, RateLimiter, RedisTarget};
use crate::store::cache::{CacheConfig, CachedKeyStore};
use crate::store::invalidation::{log_start, spawn_invalidation};
use crate::store::spawn_audit_pruning;
use crate::store::sql::SqlStore;
use crate::store::usage::UsageRecorder;
use crate::store::StoreConfig;

/// How often other instances' (and admin commands') changes are picked up.
const INVALIDATION_POLL: Duration = Duration::from_millis(250);
/// How often `last_used_at` is written back.
const USAGE_FLUSH: Duration = Duration::from_secs(10);

/// Opens the store (migrating it), the limiter and the upstreams, and
/// compiles the route table.
pub async fn build(settings: Settings) -> Result<Pipeline, StartError> {
    let store = open_store(&settings, settings.store.wait_at_start).await?;
    // Where the change log stands before anything is cached: the follower
    // then has nothing to clear or re-apply when it starts (a key the first
    // requests cached would otherwise be dropped, and missed in an outage
    // soon after).
    let start = log_start(&store).await.ok();
    let s = &settings.store;
    let keys = CachedKeyStore::new(
        Arc::new(store.clone()),
        CacheConfig {
            ttl: s.cache_ttl,
            negative_ttl: s.negative_cache_ttl,
            capacity: s.cache_capacity,
            negative_capacity: s.negative_cache_capacity,
            stale_if_error: s.stale_if_error,
        },
    );
    spawn_invalidation(store.clone(), keys.clone(), INVALIDATION_POLL, start);
    spawn_audit_pruning(store.clone(), s.audit_retention);
    let usage = UsageRecorder::new(store.clone(), USAGE_FLUSH);
    let limiter = Arc::new(build_limiter(&settings).await?);
    crate::ratelimit::credits::spawn_credit_writer(store.clone(), &limiter.credit_book());
    Ok(Pipeline::assemble(
        settings, store, keys, usage, limiter, None,
    )?)
}

/// Opens and migrates the store named by the settings. With `wait`, a store
/// that is down is waited for in the background ([`SqlStore::migrate_or_wait`]);
/// without, its failure is returned (the admin commands, and `run` with
/// `wait_at_start = false`).
pub async fn open_store(settings: &Settings, wait: bool) -> Result<SqlStore, StartError> {
    let s = &settings.store;
    if let Some(path) = s
        .url
        .strip_prefix("sqlite://")
        .and_then(|u| u.split('?').next())
    {
        if let Some(dir) = std::path::Path::new(path)
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
        {
            std::fs::create_dir_all(dir).map_err(|e| StartError::Store {
                what: s.display.clone(),
                cause: crate::store::StoreError::Invalid(format!(
                    "cannot create {}: {e}",
                    dir.display()
                )),
            })?;
        }
    }
    let err = |cause| StartError::Store {
        what: s.display.clone(),
        cause,
    };
    let store = SqlStore::connect(&StoreConfig {
        url: s.url.clone(),
        query_timeout: s.query_timeout,
    })
    .await
    .map_err(err)?;
    if wait {
        store.migrate_or_wait().await.map_err(err)?;
    } else {
        store.migrate().await.map_err(err)?;
    }
    Ok(store)
}

pub(crate) async fn build_limiter(settings: &Settings) -> Result<RateLimiter, StartError> {
    let rl = &settings.rate_limit;
    let quota = |q: &crate::config::QuotaSettings| Quota {
        capacity: q.requests,
        period: q.per,
    };
    let policies: Vec<Quota> = rl.policies.iter().map(|p| quota(&p.quota)).collect();
    let auth_failures = quota(&rl.auth_failures);
    Ok(match &rl.redis {
        None => RateLimiter::local(policies, auth_failures),
        Some(r) => {
            let on_error = match rl.on_backend_error {
                crate::config::BackendErrorPolicy::Local => OnBackendError::Local,
                crate::config::BackendErrorPolicy::Deny => OnBackendError::Deny,
                crate::config::BackendErrorPolicy::Allow => OnBackendError::Allow,
            };
            let target = RedisTarget::new(&r.url, r.ca_file.as_deref())?;
            RateLimiter::redis(
                target,
                &r.prefix,
                policies,
                auth_failures,
                on_error,
                r.timeout,
            )
            .await?
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http_core::body::RequestBody;
    use crate::http_core::service::ConnInfo;

    /// Every request's future is boxed (per HTTP/2 stream, per HTTP/1.1 request) and
    /// moved into its box whole: what only some routes await, such as a store query's
    /// future, is boxed where it is awaited, so that the rest do not carry room for it.
    #[tokio::test]
    async fn a_requests_future_stays_small() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "[server]\ninsecure_http = true\n[store]\npath = \"{}/gw.db\"\n\
             [upstreams.c]\ntargets = [\"http://127.0.0.1:9\"]\n\
             [[routes]]\nmethod = \"GET\"\npath = \"/a\"\nauth = \"none\"\nupstream = \"c\"\n",
            dir.path().display()
        );
        let pipeline = Arc::new(build(Settings::parse(&text).unwrap()).await.unwrap());
        let req = http::Request::new(RequestBody::empty());
        let conn = Arc::new(ConnInfo::new("127.0.0.1:1".parse().unwrap(), false));
        let future = pipeline.handle(req, conn);
        let size = std::mem::size_of_val(&future);
        assert!(size <= 3072, "a request's future is {size} bytes");
    }
}
