//! Micro-benchmarks of the per-request hot path, one group per stage:
//! the API key check (format + SHA-256 + cache hit), the session lookup,
//! a JWT's first verification per algorithm (what a token costs before it
//! is cached),
//! the rate-limit decision (local; Redis in its own group, skipped when no
//! Redis answers at `MPG_TEST_REDIS_URL`), route matching, the request header
//! rewrite, and error body rendering.
//!
//! `cargo bench --bench micro` runs them all; `cargo bench --bench micro -- limiter`
//! runs one group. The load suite (`benches/load/run.sh`) measures the whole
//! gateway against nginx and HAProxy.
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use http::header::{HeaderValue, AUTHORIZATION};
use http::{HeaderMap, Method, Uri, Version};
use mpg_gateway::auth::credential::{parse_authorization, Credential};
use mpg_gateway::auth::Scopes;
use mpg_gateway::error::{AuthReason, GatewayError};
use mpg_gateway::http_core::fields::FieldLines;
use mpg_gateway::proxy::headers::{sanitize_request, Added, ForwardedFor, Identity};
use mpg_gateway::proxy::signature::{self, IdentitySigner};
use mpg_gateway::ratelimit::{
    LocalLimiter, OnBackendError, PolicyId, Quota, RateLimiter, RedisTarget,
};
use mpg_gateway::routes::{check_head, check_request_target, RouteMatch, Router};
use mpg_gateway::secret::SecretHash;
use mpg_gateway::secret::{check_api_key_format, generate_api_key, hash_secret};
use mpg_gateway::store::{
    ApiKeyAuth, ApiKeyRecord, CacheConfig, CachedKeyStore, KeyStore, SessionAuth, SessionRecord,
    StoreError, UserAccess,
};
use std::collections::HashMap;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

/// An in-memory key store: the benches measure the cache, never I/O.
#[derive(Default)]
struct MemStore {
    keys: HashMap<[u8; 32], ApiKeyAuth>,
    sessions: HashMap<[u8; 32], SessionAuth>,
}

#[async_trait::async_trait]
impl KeyStore for MemStore {
    async fn find_api_key(&self, hash: &SecretHash) -> Result<Option<ApiKeyAuth>, StoreError> {
        Ok(self.keys.get(&hash.0).cloned())
    }
    async fn find_session(&self, hash: &SecretHash) -> Result<Option<SessionAuth>, StoreError> {
        Ok(self.sessions.get(&hash.0).cloned())
    }
    async fn find_user_access(&self, _: &str) -> Result<Option<UserAccess>, StoreError> {
        Ok(None)
    }
    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

fn key_record(i: usize) -> ApiKeyRecord {
    ApiKeyRecord {
        id: format!("key_{i:016}"),
        name: "bench".into(),
        organization_id: "acme".into(),
        user_id: "alice".into(),
        scopes: vec!["clusters:read".into()],
        prefix: "AbCdEfGh".into(),
        created_at: 0,
        expires_at: None,
        revoked_at: None,
        last_used_at: None,
        replaced_by: None,
        rate_limit: None,
        controls: Default::default(),
    }
}

const SESSION: &str = "mps_0123456789abcdefghijABCDEFGHIJ0123456789abc";

/// A cache over `n` keys (and one session), every entry already loaded.
fn warm_cache(rt: &tokio::runtime::Runtime, n: usize) -> (CachedKeyStore, Vec<String>) {
    let mut store = MemStore::default();
    let mut secrets = Vec::with_capacity(n);
    for i in 0..n {
        let (secret, _) = generate_api_key();
        store.keys.insert(
            hash_secret(&secret).0,
            ApiKeyAuth {
                key: key_record(i),
                role: Some("member".into()),
                org_limits: vec![],
            },
        );
        secrets.push(secret);
    }
    store.sessions.insert(
        hash_secret(SESSION).0,
        SessionAuth {
            session: SessionRecord {
                id: "ses_1".into(),
                user_id: "alice".into(),
                created_at: 0,
                expires_at: i64::MAX,
            },
            memberships: vec![("acme".into(), "owner".into())],
            org_limits: vec![],
            token: None,
        },
    );
    let cache = CachedKeyStore::new(
        Arc::new(store),
        CacheConfig {
            ttl: Duration::from_secs(3600),
            negative_ttl: Duration::from_secs(3600),
            capacity: 1_000_000,
            negative_capacity: 100_000,
            stale_if_error: Duration::from_secs(60),
        },
    );
    rt.block_on(async {
        for s in &secrets {
            assert!(cache.api_key(&hash_secret(s)).await.unwrap().is_some());
        }
        assert!(cache
            .session(&hash_secret(SESSION))
            .await
            .unwrap()
            .is_some());
    });
    (cache, secrets)
}

fn bearer(secret: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {secret}")).unwrap(),
    );
    h
}

fn auth(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (cache, secrets) = warm_cache(&rt, 1000);
    let headers = bearer(&secrets[0]);
    let mut g = c.benchmark_group("auth");
    g.throughput(Throughput::Elements(1));
    g.bench_function("format_check", |b| {
        b.iter(|| check_api_key_format(black_box(&secrets[0])))
    });
    g.bench_function("sha256", |b| b.iter(|| hash_secret(black_box(&secrets[0]))));
    g.bench_function("parse_check_hash_cache_hit", |b| {
        b.to_async(&rt).iter(|| async {
            let Ok(Credential::ApiKey(secret)) = parse_authorization(black_box(&headers)) else {
                panic!("the bench key is well-formed");
            };
            let found = cache.api_key(&hash_secret(secret)).await.unwrap();
            black_box(found.is_some())
        })
    });
    let mut i = 0usize;
    g.bench_function("cache_hit_1000_keys_rotating", |b| {
        b.to_async(&rt).iter(|| {
            i = (i + 1) % secrets.len();
            let hash = hash_secret(&secrets[i]);
            let cache = &cache;
            async move { black_box(cache.api_key(&hash).await.unwrap().is_some()) }
        })
    });
    let unknown = generate_api_key().0;
    rt.block_on(async { cache.api_key(&hash_secret(&unknown)).await.unwrap() });
    g.bench_function("negative_cache_hit", |b| {
        b.to_async(&rt).iter(|| async {
            black_box(
                cache
                    .api_key(&hash_secret(&unknown))
                    .await
                    .unwrap()
                    .is_none(),
            )
        })
    });
    g.bench_function("session_lookup", |b| {
        let headers = bearer(SESSION);
        b.to_async(&rt).iter(|| async {
            let Ok(Credential::Session(token)) = parse_authorization(black_box(&headers)) else {
                panic!("the bench token is well-formed");
            };
            black_box(cache.session(&hash_secret(token)).await.unwrap().is_some())
        })
    });
    g.finish();
}

fn quota(requests: u32) -> Quota {
    Quota::new(NonZeroU32::new(requests).unwrap(), Duration::from_secs(1))
}

fn limiter_local(c: &mut Criterion) {
    let mut g = c.benchmark_group("limiter_local");
    g.throughput(Throughput::Elements(1));
    let limiter = LocalLimiter::new(vec![quota(1_000_000_000)]);
    g.bench_function("one_key_allowed", |b| {
        b.iter(|| limiter.check(PolicyId(0), black_box("key_0000000000000000")))
    });
    let keys: Vec<String> = (0..100_000).map(|i| format!("key_{i:016}")).collect();
    for k in &keys {
        limiter.check(PolicyId(0), k);
    }
    let mut i = 0usize;
    g.bench_function("100k_keys_rotating", |b| {
        b.iter(|| {
            i = (i + 1) % keys.len();
            limiter.check(PolicyId(0), black_box(&keys[i]))
        })
    });
    let tight = LocalLimiter::new(vec![quota(1)]);
    tight.check(PolicyId(0), "key_limited");
    g.bench_function("one_key_limited", |b| {
        b.iter(|| tight.check(PolicyId(0), black_box("key_limited")))
    });
    g.finish();
}

fn limiter_redis(c: &mut Criterion) {
    let url = std::env::var("MPG_TEST_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_string());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let prefix = format!("mpg-bench-{}:", std::process::id());
    let Ok(target) = RedisTarget::new(&url, None) else {
        eprintln!("limiter_redis: skipped (bad MPG_TEST_REDIS_URL)");
        return;
    };
    let limiter = rt.block_on(RateLimiter::redis(
        target,
        &prefix,
        vec![quota(1_000_000_000)],
        quota(20),
        OnBackendError::Deny,
        Duration::from_millis(500),
    ));
    let Ok(limiter) = limiter else {
        eprintln!("limiter_redis: skipped (bad MPG_TEST_REDIS_URL)");
        return;
    };
    if !limiter.healthy() {
        eprintln!("limiter_redis: skipped (no Redis answers at {url})");
        return;
    }
    let mut g = c.benchmark_group("limiter_redis");
    g.throughput(Throughput::Elements(1));
    g.bench_function("one_key_allowed", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(limiter.check(PolicyId(0), "key_bench").await) })
    });
    g.finish();
    // The bench's own keys expire with their policy's period (1 s); nothing to clean.
}

fn shipped_router() -> Router<usize> {
    let mut b = Router::builder();
    let routes = [
        (Method::GET, "/api/v1/clusters"),
        (Method::POST, "/api/v1/api-keys"),
        (Method::GET, "/api/v1/api-keys"),
        (Method::GET, "/api/v1/api-keys/{id}"),
        (Method::POST, "/api/v1/api-keys/{id}/revoke"),
        (Method::DELETE, "/api/v1/api-keys/{id}"),
    ];
    for (i, (m, p)) in routes.into_iter().enumerate() {
        b.insert(m, p, i).unwrap();
    }
    b.build().unwrap()
}

fn routing(c: &mut Criterion) {
    let router = shipped_router();
    let uri: Uri = "/api/v1/clusters?organization_id=acme".parse().unwrap();
    let mut headers = HeaderMap::new();
    headers.insert(http::header::HOST, HeaderValue::from_static("127.0.0.1"));
    let mut g = c.benchmark_group("route");
    g.throughput(Throughput::Elements(1));
    g.bench_function("match_static", |b| {
        b.iter(|| {
            matches!(
                router.at(&Method::GET, black_box(uri.path())),
                RouteMatch::Found { .. }
            )
        })
    });
    g.bench_function("match_param", |b| {
        b.iter(|| {
            match router.at(
                &Method::DELETE,
                black_box("/api/v1/api-keys/key_0123456789abcdef"),
            ) {
                RouteMatch::Found { params, .. } => params.get("id").map(str::len),
                _ => None,
            }
        })
    });
    g.bench_function("target_and_head_checks", |b| {
        b.iter(|| {
            check_request_target(black_box(&uri), Version::HTTP_11)
                .and_then(|()| check_head(&uri, Version::HTTP_11, black_box(&headers)))
                .is_ok()
        })
    });
    g.finish();
}

fn client_headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        http::header::HOST,
        HeaderValue::from_static("api.example.com"),
    );
    h.insert(
        AUTHORIZATION,
        HeaderValue::from_static("Bearer mpg_0123456789abcdefghijABCDEFGHIJ01abcdef"),
    );
    h.insert(
        http::header::ACCEPT,
        HeaderValue::from_static("application/json"),
    );
    h.insert(
        http::header::USER_AGENT,
        HeaderValue::from_static("bench/1.0"),
    );
    h.insert(
        http::header::CONNECTION,
        HeaderValue::from_static("keep-alive"),
    );
    h
}

fn header_rewrite(c: &mut Criterion) {
    let request_id = HeaderValue::from_static("0123456789abcdef0123456789abcdef");
    let scopes = vec!["clusters:read".to_string()];
    let id = Identity {
        organization_id: "acme",
        user_id: "alice",
        role: "member",
        auth: "api_key",
        key_id: Some("key_0123456789abcdef"),
        scopes: Scopes::listed(&scopes),
    };
    let fwd = ForwardedFor {
        chain: "127.0.0.1",
        proto: "https",
        host: Some("api.example.com"),
    };
    let added = Added {
        identity: Some(id),
        forwarded: fwd,
        key_meta: None,
        request_id: request_id.as_bytes(),
        traceparent: None,
        signature: None,
    };
    let mut g = c.benchmark_group("headers");
    g.throughput(Throughput::Elements(1));
    // HTTP/2 targets: the gateway's fields go into the header map.
    g.bench_function("sanitize_and_add_identity", |b| {
        b.iter_batched(
            client_headers,
            |mut h| {
                sanitize_request(&mut h, &[]);
                added.add_to(&mut h);
                h
            },
            BatchSize::SmallInput,
        )
    });
    // HTTP/1.1 targets: written as lines behind the request's own headers.
    g.bench_function("sanitize_and_write_identity", |b| {
        b.iter_batched(
            || (client_headers(), Vec::with_capacity(512)),
            |(mut h, mut out)| {
                sanitize_request(&mut h, &[]);
                added.write_lines(&mut out);
                (h, out)
            },
            BatchSize::SmallInput,
        )
    });
    // `X-Mpg-Signature` for an upstream with `sign_identity_key_env`: the
    // HMAC-SHA256 of an API-key request's identity, on top of the rewrite.
    let signer = IdentitySigner::new(b"0123456789abcdef0123456789abcdef").unwrap();
    g.bench_function("sign_identity", |b| {
        b.iter(|| {
            signer.sign(
                black_box(&added),
                (
                    &Method::GET,
                    black_box("/api/v1/clusters?organization_id=acme"),
                ),
                1_700_000_000,
                &signature::nonce(),
                None,
            )
        })
    });
    // A signed request with a 1 KiB body: its `Content-Digest`, then the
    // signature over it.
    let body = vec![b'x'; 1024];
    g.bench_function("sign_identity_with_content_digest_1k", |b| {
        b.iter(|| {
            let digest = signature::content_digest(black_box(&body));
            signer.sign(
                black_box(&added),
                (
                    &Method::POST,
                    black_box("/api/v1/clusters?organization_id=acme"),
                ),
                1_700_000_000,
                &signature::nonce(),
                Some(digest.as_bytes()),
            )
        })
    });
    g.finish();
}

/// A JWT's first verification, per algorithm: header, key, signature and
/// claims, against the key set and tokens Node's crypto minted for the
/// verifier's tests. (A cached token costs what a session token does.)
fn jwt_first_verification(c: &mut Criterion) {
    use jsonwebtoken::Algorithm::*;
    use mpg_gateway::auth::jwt::KeySet;
    use mpg_gateway::config::OidcSettings;
    let vectors: serde_json::Value =
        serde_json::from_str(include_str!("../src/auth/jwt/vectors.json")).unwrap();
    let mut cfg = OidcSettings::new("https://id.test", &["mpg-api"]);
    cfg.algorithms = vec![RS256, PS256, ES256, EdDSA];
    let keys = KeySet::parse(vectors["jwks"].to_string().as_bytes(), &cfg.algorithms).unwrap();
    let mut g = c.benchmark_group("jwt_first_verification");
    g.throughput(Throughput::Elements(1));
    for (name, alg) in [
        ("rs256", "RS256"),
        ("ps256", "PS256"),
        ("es256", "ES256"),
        ("eddsa", "EdDSA"),
    ] {
        let token = vectors["tokens"][name].as_str().unwrap().to_string();
        g.bench_function(alg, |b| {
            b.iter(|| keys.verify(black_box(&token), &cfg, 1_893_456_000).unwrap())
        });
    }
    g.finish();
}

fn error_bodies(c: &mut Criterion) {
    let mut g = c.benchmark_group("error_body");
    g.throughput(Throughput::Elements(1));
    g.bench_function("401_invalid", |b| {
        b.iter(|| GatewayError::Unauthorized(black_box(AuthReason::Invalid)).into_response())
    });
    g.bench_function("429", |b| {
        b.iter(|| {
            GatewayError::TooManyRequests {
                retry_after: black_box(1),
            }
            .into_response()
        })
    });
    g.bench_function("400_field", |b| {
        b.iter(|| {
            GatewayError::bad_field(black_box("organization_id"), "must not be empty")
                .into_response()
        })
    });
    g.finish();
}

criterion_group!(
    benches,
    auth,
    limiter_local,
    limiter_redis,
    routing,
    header_rewrite,
    jwt_first_verification,
    error_bodies
);
criterion_main!(benches);
