//! The fuzz targets of mpg-gateway, one module each, with `run(data)` as the
//! whole target. Two drivers call them: libFuzzer (`fuzz_targets/`, with
//! `cargo +nightly fuzz run`) and the stable driver (`src/bin/replay.rs`),
//! which replays the committed corpus (`corpus/`) and mutates it with a
//! seeded generator where no nightly toolchain is at hand.
pub mod admin_api;
pub mod authorization;
pub mod config;
pub mod http1_chunked;
pub mod http1_request_head;
pub mod http1_response;
pub mod jwks;
pub mod proxy_header;
pub mod query;
pub mod target_router;

/// Every target: its name (that of its corpus folder and libFuzzer binary)
/// and its entry point.
pub const TARGETS: &[(&str, fn(&[u8]))] = &[
    ("admin_api", admin_api::run),
    ("authorization", authorization::run),
    ("config", config::run),
    ("http1_chunked", http1_chunked::run),
    ("http1_request_head", http1_request_head::run),
    ("http1_response", http1_response::run),
    ("jwks", jwks::run),
    ("proxy_header", proxy_header::run),
    ("query", query::run),
    ("target_router", target_router::run),
];

/// The shipped configuration (`config/gateway.toml`), with an in-memory
/// certificate instead of the TLS files it names (the repository ships no
/// private key).
pub fn shipped_settings() -> mpg_gateway::config::Settings {
    let text = include_str!("../../config/gateway.toml").replace(
        "cert = \"config/tls/cert.pem\"\nkey  = \"config/tls/key.pem\"",
        "self_signed = true",
    );
    mpg_gateway::config::Settings::parse(&text).expect("the shipped config is valid")
}

/// The JWT verifier's vectors (`src/auth/jwt/vectors.json`, minted by
/// Node's crypto): the key set that signed them, its tokens, and settings
/// that take them.
pub struct Vectors {
    pub keys: mpg_gateway::auth::jwt::KeySet,
    /// Every token, each signed by one of `keys` or forged.
    pub tokens: Vec<String>,
    /// The forged ones (`alg: none`, HMAC with the public key as its secret, a
    /// tampered signature): no key set may take them.
    pub forged: Vec<String>,
    pub settings: mpg_gateway::config::OidcSettings,
}

/// The vectors, read once.
pub static VECTORS: std::sync::LazyLock<Vectors> = std::sync::LazyLock::new(|| {
    use jsonwebtoken::Algorithm::*;
    let vectors: serde_json::Value =
        serde_json::from_str(include_str!("../../src/auth/jwt/vectors.json")).unwrap();
    let mut settings = mpg_gateway::config::OidcSettings::new("https://id.test", &["mpg-api"]);
    settings.algorithms = vec![RS256, PS256, ES256, EdDSA];
    let jwks = vectors["jwks"].to_string();
    let keys = mpg_gateway::auth::jwt::KeySet::parse(jwks.as_bytes(), &settings.algorithms)
        .expect("the vectors' key set");
    let by_name = vectors["tokens"].as_object().expect("tokens by name");
    let tokens = by_name.values().filter_map(|t| Some(t.as_str()?.to_owned())).collect();
    let forged = (by_name.iter())
        .filter(|(name, _)| vectors["spec"]["tokens"][name.as_str()]["sign"].is_string())
        .filter_map(|(_, t)| Some(t.as_str()?.to_owned()))
        .collect::<Vec<_>>();
    assert_eq!(forged.len(), 3, "the vectors' forged tokens");
    Vectors {
        keys,
        tokens,
        forged,
        settings,
    }
});
