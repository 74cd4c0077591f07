//! `[auth.oidc]` over real sockets: an identity provider served over HTTPS
//! by the test (discovery and key set), tokens minted by Node's crypto
//! (`tests/support/mint_jwt.mjs`, another implementation than the
//! verifier's), and the gateway's answers on its session routes, on SQLite
//! and PostgreSQL.
mod common;

use common::backends::{free_port, Pki};
use common::scale::PgDb;
use common::*;
use serde_json::{json, Value};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

/// The identity provider: `/.well-known/openid-configuration` and `/jwks`
/// over TLS with the test CA's certificate, on a port it keeps across
/// stops and starts.
struct Idp {
    port: u16,
    pki: Arc<Pki>,
    jwks: Arc<Mutex<String>>,
    fetches: Arc<AtomicUsize>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Idp {
    fn new(pki: Arc<Pki>) -> Idp {
        Idp {
            port: free_port(),
            pki,
            jwks: Arc::default(),
            fetches: Arc::default(),
            task: None,
        }
    }

    fn issuer(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    fn serve(&self, jwks: &str) {
        *self.jwks.lock().unwrap() = jwks.to_string();
    }

    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }

    async fn start(&mut self) {
        let listener = TcpListener::bind(("127.0.0.1", self.port)).await.unwrap();
        let certs = mpg_gateway::tls::pem::certs(&self.pki.cert).unwrap();
        let key = mpg_gateway::tls::pem::private_key(&self.pki.key).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let (jwks, fetches, issuer) = (self.jwks.clone(), self.fetches.clone(), self.issuer());
        self.task = Some(tokio::spawn(async move {
            // Connections live in the set: stopping the provider ends them too.
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let (acceptor, jwks, fetches, issuer) = (
                    acceptor.clone(),
                    jwks.clone(),
                    fetches.clone(),
                    issuer.clone(),
                );
                conns.spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |req: http::Request<_>| {
                        let body = match req.uri().path() {
                            "/.well-known/openid-configuration" => json!({
                                "issuer": issuer,
                                "jwks_uri": format!("{issuer}/jwks"),
                            })
                            .to_string(),
                            _ => {
                                fetches.fetch_add(1, Ordering::SeqCst);
                                jwks.lock().unwrap().clone()
                            }
                        };
                        async move {
                            Ok::<_, std::convert::Infallible>(http::Response::new(
                                http_body_util::Full::new(bytes::Bytes::from(body)),
                            ))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        }));
    }

    fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Drop for Idp {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs the minting script on `spec`: (public JWKs by kid, tokens by name).
fn mint(spec: Value) -> (Value, Value) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/mint_jwt.mjs");
    let mut child = Command::new("node")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("node (18 or later) runs the minting script");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(spec.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "mint_jwt.mjs failed");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    (v["jwks"].clone(), v["tokens"].clone())
}

/// A JWKS document of the keys `kids` of `jwks`.
fn jwks_of(jwks: &Value, kids: &[&str]) -> String {
    json!({ "keys": kids.iter().map(|k| jwks[*k].clone()).collect::<Vec<_>>() }).to_string()
}

struct World {
    idp: Idp,
    _cfg: TestConfig,
    path: std::path::PathBuf,
    gw: Gateway,
    _db: Option<PgDb>,
}

/// A gateway with `[auth.oidc]` for `idp` (discovered from its issuer
/// unless `jwks_url`), with the admin listener for `/metrics`.
async fn world(idp: Idp, pg: bool, jwks_url: bool, tune: impl FnOnce(&mut TestConfig)) -> World {
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    std::mem::forget(up);
    let db = if pg { Some(PgDb::create().await) } else { None };
    if let Some(db) = &db {
        cfg.postgres(&db.url);
    }
    cfg.set("admin.enabled", true);
    cfg.set("admin.listen", "127.0.0.1:0");
    cfg.set("auth.oidc.issuer", idp.issuer());
    cfg.set("auth.oidc.audiences", vec!["mpg-api"]);
    cfg.set(
        "auth.oidc.algorithms",
        vec!["RS256", "PS256", "ES256", "EdDSA"],
    );
    cfg.set("auth.oidc.ca_file", idp.pki.ca.to_str().unwrap());
    if jwks_url {
        cfg.set("auth.oidc.jwks_url", format!("{}/jwks", idp.issuer()));
    }
    tune(&mut cfg);
    let path = cfg.write();
    for args in [
        &["orgs", "create", "--id", "acme"][..],
        &["users", "create", "--id", "alice"],
        &["users", "create", "--id", "bob"],
        &[
            "members", "add", "--org", "acme", "--user", "alice", "--role", "admin",
        ],
    ] {
        cli_ok(&path, args);
    }
    let gw = Gateway::start(&path);
    World {
        idp,
        _cfg: cfg,
        path,
        gw,
        _db: db,
    }
}

/// `GET /api/v1/api-keys?organization_id=acme` with `token`: (status, JSON).
async fn list_keys(gw: &Gateway, token: &str) -> (u16, Value) {
    let res = client()
        .get(gw.url("/api/v1/api-keys?organization_id=acme"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

async fn reason(gw: &Gateway, token: &str) -> (u16, String) {
    let (status, body) = list_keys(gw, token).await;
    (
        status,
        body["details"]["reason"].as_str().unwrap_or("").to_string(),
    )
}

async fn metrics(gw: &Gateway) -> String {
    common::scale::metrics(gw.admin.unwrap()).await
}

async fn metrics_have(gw: &Gateway, needle: &str) -> bool {
    metrics(gw).await.contains(needle)
}

/// Polls `check` every 100 ms until it holds or `limit` passes.
async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < limit {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

fn claims(sub: &str) -> Value {
    let now = unix_now();
    json!({"iss": "ISSUER", "aud": "mpg-api", "sub": sub, "iat": now, "exp": now + 600})
}

/// Every case of a provider's token acting as a session, on one store.
async fn tokens_act_as_sessions(pg: bool) {
    let pki = Arc::new(Pki::new());
    let mut idp = Idp::new(pki);
    idp.start().await;
    let issuer = idp.issuer();
    let now = unix_now();
    let with = |over: Value| {
        let mut c = claims("alice");
        c["iss"] = issuer.clone().into();
        for (k, v) in over.as_object().unwrap() {
            if v.is_null() {
                c.as_object_mut().unwrap().remove(k);
            } else {
                c[k] = v.clone();
            }
        }
        c
    };
    let spec = json!({
        "keys": [{"kid": "rsa-1", "type": "rsa"}, {"kid": "ec-1", "type": "ec"},
                 {"kid": "ed-1", "type": "ed25519"}],
        "tokens": {
            "rs256": {"kid": "rsa-1", "alg": "RS256", "claims": with(json!({}))},
            "ps256": {"kid": "rsa-1", "alg": "PS256", "claims": with(json!({}))},
            "es256": {"kid": "ec-1", "alg": "ES256", "claims": with(json!({}))},
            "eddsa": {"kid": "ed-1", "alg": "EdDSA", "claims": with(json!({}))},
            "bob": {"kid": "ec-1", "alg": "ES256", "claims": with(json!({"sub": "bob"}))},
            "stranger": {"kid": "ec-1", "alg": "ES256", "claims": with(json!({"sub": "zed"}))},
            "none": {"kid": "rsa-1", "alg": "RS256", "claims": with(json!({})), "sign": "none"},
            "hs256_public_key": {"kid": "rsa-1", "alg": "RS256", "claims": with(json!({})),
                                 "sign": "hs256_public_pem"},
            "wrong_iss": {"kid": "ec-1", "alg": "ES256",
                          "claims": with(json!({"iss": "https://evil.example"}))},
            "wrong_aud": {"kid": "ec-1", "alg": "ES256", "claims": with(json!({"aud": "other"}))},
            "expired": {"kid": "ec-1", "alg": "ES256",
                        "claims": with(json!({"iat": now - 3600, "exp": now - 120}))},
            "not_yet": {"kid": "ec-1", "alg": "ES256", "claims": with(json!({"nbf": now + 600}))},
            "unknown_kid": {"kid": "ec-1", "alg": "ES256", "claims": with(json!({})),
                            "header": {"kid": "ec-404"}},
            "tampered": {"kid": "rsa-1", "alg": "RS256", "claims": with(json!({})),
                         "sign": "tamper"},
            "huge": {"kid": "ec-1", "alg": "ES256", "claims": with(json!({})), "pad": 8192},
        }
    });
    let (jwks, tokens) = mint(spec);
    idp.serve(&jwks_of(&jwks, &["rsa-1", "ec-1", "ed-1"]));
    let w = world(idp, pg, false, |_| {}).await;
    let token = |name: &str| tokens[name].as_str().unwrap().to_string();

    // The key set is discovered from the issuer and fetched at start.
    assert!(
        eventually(Duration::from_secs(10), || async {
            list_keys(&w.gw, &token("rs256")).await.0 == 200
        })
        .await,
        "a token of the provider never worked: {}",
        w.gw.log_text()
    );
    for name in ["rs256", "ps256", "es256", "eddsa"] {
        let (status, body) = list_keys(&w.gw, &token(name)).await;
        assert_eq!(status, 200, "{name}: {body}");
    }

    // The token acts as alice's session: it creates a key for her.
    let res = client()
        .post(w.gw.url("/api/v1/api-keys?organization_id=acme"))
        .bearer_auth(token("es256"))
        .json(&json!({"name": "from-sso", "scopes": ["clusters:read"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let created: Value = res.json().await.unwrap();
    assert_eq!(created["user_id"], "alice", "{created}");

    // curl, as a user would call it.
    let out = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-H"])
        .arg(format!("Authorization: Bearer {}", token("eddsa")))
        .arg(w.gw.url("/api/v1/api-keys?organization_id=acme"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200");

    // A member of no organization gets 404; an unknown user 401.
    assert_eq!(list_keys(&w.gw, &token("bob")).await.0, 404);
    assert_eq!(
        reason(&w.gw, &token("stranger")).await,
        (401, "unknown_user".into())
    );
    // On an API-key route a JWT is the wrong credential.
    let res = client()
        .get(w.gw.url("/api/v1/clusters?organization_id=acme"))
        .bearer_auth(token("es256"))
        .send()
        .await
        .unwrap();
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["details"]["reason"], "wrong_credential_type");

    // RS256 signs deterministically: the tampered token carries the signature
    // of the cached rs256 token, so it shares its cache key, and must still
    // be refused (a hit counts only for the very token cached).
    let signature = |name: &str| token(name).rsplit('.').next().unwrap().to_string();
    assert_eq!(signature("tampered"), signature("rs256"));
    for (name, want) in [
        ("none", "invalid"),
        ("hs256_public_key", "invalid"),
        ("wrong_iss", "invalid"),
        ("wrong_aud", "invalid"),
        ("expired", "expired"),
        ("not_yet", "not_yet_valid"),
        ("unknown_kid", "invalid"),
        ("tampered", "invalid"),
        ("huge", "malformed"),
    ] {
        assert_eq!(
            reason(&w.gw, &token(name)).await,
            (401, want.into()),
            "{name}"
        );
    }
    assert!(token("huge").len() > 8192);

    // Roles come from the store, now: alice leaves acme, and her cached
    // token stops reaching it within a second.
    cli_ok(
        &w.path,
        &["members", "remove", "--org", "acme", "--user", "alice"],
    );
    assert!(
        eventually(Duration::from_secs(2), || async {
            list_keys(&w.gw, &token("rs256")).await.0 == 404
        })
        .await
    );

    let text = metrics(&w.gw).await;
    for line in [
        "mpg_jwt_verifications_total{outcome=\"ok\"}",
        "mpg_jwt_verifications_total{outcome=\"invalid\"}",
        "mpg_jwt_verifications_total{outcome=\"expired\"}",
        "mpg_jwks_refreshes_total{outcome=\"ok\"}",
    ] {
        assert!(text.contains(line), "{line} not in /metrics");
    }
    // A token is a secret: no log line or metric holds one.
    let log = w.gw.log_text();
    for name in ["rs256", "es256", "tampered"] {
        let signature = token(name).rsplit('.').next().unwrap().to_string();
        assert!(!log.contains(&signature), "{name}'s signature was logged");
        assert!(!text.contains(&signature));
    }
    drop(w.idp);
}

#[tokio::test]
async fn provider_tokens_act_as_sessions_on_sqlite() {
    tokens_act_as_sessions(false).await;
}

#[tokio::test]
async fn provider_tokens_act_as_sessions_on_postgres() {
    tokens_act_as_sessions(true).await;
}

/// The key set's life: the provider down at start (503, never 401), up
/// (tokens work), rotated (a new kid fetched at once, the old kid gone),
/// a refused document (the last good set kept), and down again (kept).
#[tokio::test]
async fn the_key_set_survives_outages_and_follows_rotation() {
    let pki = Arc::new(Pki::new());
    let idp = Idp::new(pki);
    let issuer = idp.issuer();
    let mut c = claims("alice");
    c["iss"] = issuer.into();
    let mut c2 = c.clone();
    c2["jti"] = "second".into();
    let (jwks, tokens) = mint(json!({
        "keys": [{"kid": "rsa-1", "type": "rsa"}, {"kid": "ec-2", "type": "ec"}],
        "tokens": {
            "old": {"kid": "rsa-1", "alg": "RS256", "claims": c},
            "old_again": {"kid": "rsa-1", "alg": "RS256", "claims": c2},
            "new": {"kid": "ec-2", "alg": "ES256", "claims": c},
            "new_again": {"kid": "ec-2", "alg": "ES256", "claims": c2},
        }
    }));
    let token = |name: &str| tokens[name].as_str().unwrap().to_string();
    let mut w = world(idp, false, true, |cfg| {
        cfg.set("auth.oidc.jwks_refresh", "1s");
    })
    .await;

    // Down at start: a JWT gets 503 with Retry-After, and API keys still work.
    let res = client()
        .get(w.gw.url("/api/v1/api-keys?organization_id=acme"))
        .bearer_auth(token("old"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 503);
    assert!(res.headers().contains_key("retry-after"));

    // Up: the next scheduled fetch brings the set.
    w.idp.serve(&jwks_of(&jwks, &["rsa-1"]));
    w.idp.start().await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            list_keys(&w.gw, &token("old")).await.0 == 200
        })
        .await,
        "{}",
        w.gw.log_text()
    );

    // Rotation: ec-2 appears and rsa-1 goes. A token of ec-2 makes the
    // gateway fetch at once; rsa-1's tokens, cached or not, stop working.
    w.idp.serve(&jwks_of(&jwks, &["ec-2"]));
    let (status, body) = list_keys(&w.gw, &token("new")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(reason(&w.gw, &token("old")).await, (401, "invalid".into()));
    assert_eq!(
        reason(&w.gw, &token("old_again")).await,
        (401, "invalid".into())
    );

    // An unknown kid fetches at most once per 30 s.
    let fetches = w.idp.fetches();
    for _ in 0..5 {
        assert_eq!(reason(&w.gw, &token("old_again")).await.0, 401);
    }
    assert!(
        w.idp.fetches() <= fetches + 2,
        "an unknown kid fetched every time"
    );

    // A document we refuse (a symmetric key, then junk) leaves the set in use.
    w.idp
        .serve(r#"{"keys": [{"kty": "oct", "kid": "s", "k": "c2VjcmV0"}]}"#);
    let refused = "mpg_jwks_refreshes_total{outcome=\"invalid\"}";
    assert!(eventually(Duration::from_secs(5), || metrics_have(&w.gw, refused)).await);
    assert!(
        w.gw.log_text().contains("symmetric"),
        "the refusal names what is wrong"
    );
    w.idp.serve("{ not json");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(list_keys(&w.gw, &token("new_again")).await.0, 200);

    // Down later: the last good set stays.
    w.idp.serve(&jwks_of(&jwks, &["ec-2"]));
    w.idp.stop();
    let failed = "mpg_jwks_refreshes_total{outcome=\"error\"}";
    assert!(eventually(Duration::from_secs(5), || metrics_have(&w.gw, failed)).await);
    assert_eq!(list_keys(&w.gw, &token("new_again")).await.0, 200);
}

/// `provision_users = true`: a valid token of a user the store does not
/// know creates the user (with no memberships).
#[tokio::test]
async fn provision_users_creates_the_tokens_user() {
    let pki = Arc::new(Pki::new());
    let mut idp = Idp::new(pki);
    idp.start().await;
    let mut c = claims("carol");
    c["iss"] = idp.issuer().into();
    c["email"] = "carol@example.com".into();
    let (jwks, tokens) = mint(json!({
        "keys": [{"kid": "ed-1", "type": "ed25519"}],
        "tokens": {"carol": {"kid": "ed-1", "alg": "EdDSA", "claims": c}}
    }));
    idp.serve(&jwks_of(&jwks, &["ed-1"]));
    let w = world(idp, false, true, |cfg| {
        cfg.set("auth.oidc.provision_users", true);
    })
    .await;
    let carol = tokens["carol"].as_str().unwrap();
    assert!(
        eventually(Duration::from_secs(10), || async {
            list_keys(&w.gw, carol).await.0 == 404
        })
        .await,
        "carol, a member of nothing, gets 404: {}",
        w.gw.log_text()
    );
    let users = cli_ok(&w.path, &["users", "list"]);
    let carol_row = users["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["id"] == "carol")
        .unwrap_or_else(|| panic!("carol not provisioned: {users}"));
    assert_eq!(carol_row["email"], "carol@example.com");
    // A member now, through the usual way: her token reaches acme.
    cli_ok(
        &w.path,
        &[
            "members", "add", "--org", "acme", "--user", "carol", "--role", "viewer",
        ],
    );
    assert!(
        eventually(Duration::from_secs(2), || async {
            list_keys(&w.gw, carol).await.0 == 200
        })
        .await
    );
}

/// With tracing on, a JWT whose `kid` makes the gateway fetch the key set
/// has that fetch as a child span of its request.
#[tokio::test]
async fn a_key_set_fetch_for_a_request_is_a_span_of_it() {
    let collector = common::otlp::Collector::start().await;
    let pki = Arc::new(Pki::new());
    let mut idp = Idp::new(pki);
    let mut c = claims("alice");
    c["iss"] = idp.issuer().into();
    let (jwks, tokens) = mint(json!({
        "keys": [{"kid": "rsa-1", "type": "rsa"}, {"kid": "ec-2", "type": "ec"}],
        "tokens": {"new": {"kid": "ec-2", "alg": "ES256", "claims": c}}
    }));
    idp.serve(&jwks_of(&jwks, &["rsa-1"]));
    idp.start().await;
    let endpoint = collector.endpoint();
    let w = world(idp, false, true, |cfg| {
        cfg.set("tracing.otlp_endpoint", endpoint);
        cfg.set("tracing.sample_ratio", 1.0);
    })
    .await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            metrics_have(&w.gw, "mpg_jwks_refreshes_total{outcome=\"ok\"}").await
        })
        .await
    );
    // ec-2 is new to the gateway: this request waits for a fetch.
    w.idp.serve(&jwks_of(&jwks, &["rsa-1", "ec-2"]));
    let trace_id = "5b8efff798038103d269b633813fc60c";
    let res = client()
        .get(w.gw.url("/api/v1/api-keys?organization_id=acme"))
        .bearer_auth(tokens["new"].as_str().unwrap())
        .header("traceparent", format!("00-{trace_id}-eee19b7ec3c1b174-01"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let spans = collector.trace(trace_id, 2).await;
    let server = spans.iter().find(|s| s.name == "request").unwrap();
    let fetch = spans
        .iter()
        .find(|s| s.name == "jwks.fetch")
        .unwrap_or_else(|| panic!("no fetch span: {spans:#?}"));
    assert_eq!(fetch.parent, server.span_id);
    assert_eq!(fetch.attributes["mpg.jwks.outcome"], "ok");
    assert_eq!(fetch.status, 0);
    assert!(!format!("{spans:?}").contains(tokens["new"].as_str().unwrap()));
}
