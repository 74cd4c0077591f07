//! `[auth.oidc]`: the identity provider, its key set's address and the
//! algorithms taken. Symmetric algorithms and `none` are refused: a key set
//! is public, so a token checked against one of its keys as an HMAC secret
//! could be minted by anyone.
use jsonwebtoken::Algorithm;
use std::path::PathBuf;

use super::problems::Problems;
use super::raw::RawOidc;
use super::OidcSettings;

/// The algorithms `algorithms` may name.
const SUPPORTED: [(&str, Algorithm); 9] = [
    ("RS256", Algorithm::RS256),
    ("RS384", Algorithm::RS384),
    ("RS512", Algorithm::RS512),
    ("PS256", Algorithm::PS256),
    ("PS384", Algorithm::PS384),
    ("PS512", Algorithm::PS512),
    ("ES256", Algorithm::ES256),
    ("ES384", Algorithm::ES384),
    ("EdDSA", Algorithm::EdDSA),
];

impl OidcSettings {
    /// `[auth.oidc]` with only `issuer` and `audiences` set: every other key
    /// at its default (the key set discovered from the issuer).
    pub fn new(issuer: &str, audiences: &[&str]) -> OidcSettings {
        OidcSettings {
            issuer: issuer.to_owned(),
            audiences: audiences.iter().map(|a| a.to_string()).collect(),
            jwks_url: None,
            ca_file: None,
            user_claim: "sub".into(),
            algorithms: vec![Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA],
            leeway: std::time::Duration::from_secs(60),
            jwks_refresh: std::time::Duration::from_secs(600),
            provision_users: false,
        }
    }
}

pub(super) fn oidc_settings(p: &mut Problems, raw: RawOidc) -> Option<OidcSettings> {
    let before = p.len();
    let issuer = match raw.issuer {
        Some(i) if !i.trim().is_empty() => i,
        _ => {
            p.add("auth.oidc.issuer", "required: the `iss` tokens must carry");
            String::new()
        }
    };
    match &raw.jwks_url {
        Some(url) => check_fetch_url(p, "auth.oidc.jwks_url", url),
        // Discovery reads `{issuer}/.well-known/openid-configuration`.
        None if !issuer.is_empty() => check_fetch_url(p, "auth.oidc.issuer", &issuer),
        None => {}
    }
    if raw.audiences.is_empty() || raw.audiences.iter().any(|a| a.is_empty()) {
        p.add(
            "auth.oidc.audiences",
            "at least one non-empty audience is required: `aud` must hold one of them",
        );
    }
    if raw.user_claim.is_empty() {
        p.add("auth.oidc.user_claim", "must name a claim");
    }
    let algorithms = algorithms(p, &raw.algorithms);
    p.positive("auth.oidc.jwks_refresh", raw.jwks_refresh);
    let ca_file = raw.ca_file.map(PathBuf::from);
    if let Some(ca) = &ca_file {
        if let Err(e) = crate::tls::pem::load_roots(ca) {
            p.add("auth.oidc.ca_file", e);
        }
    }
    (p.len() == before).then_some(OidcSettings {
        issuer,
        audiences: raw.audiences,
        jwks_url: raw.jwks_url,
        ca_file,
        user_claim: raw.user_claim,
        algorithms,
        leeway: raw.leeway,
        jwks_refresh: raw.jwks_refresh,
        provision_users: raw.provision_users,
    })
}

fn algorithms(p: &mut Problems, names: &[String]) -> Vec<Algorithm> {
    if names.is_empty() {
        p.add("auth.oidc.algorithms", "at least one algorithm is required");
    }
    let mut out = Vec::new();
    for name in names {
        match SUPPORTED.iter().find(|(n, _)| n == name) {
            Some((_, alg)) if !out.contains(alg) => out.push(*alg),
            Some(_) => {}
            None if name.eq_ignore_ascii_case("none")
                || name.to_ascii_uppercase().starts_with("HS") =>
            {
                p.add(
                    "auth.oidc.algorithms",
                    format!(
                        "{name:?} is refused: unsigned and symmetric tokens cannot be checked \
                         against a public key set"
                    ),
                );
            }
            None => p.add(
                "auth.oidc.algorithms",
                format!(
                    "unknown algorithm {name:?}; expected some of {}",
                    SUPPORTED.map(|(n, _)| n).join(", ")
                ),
            ),
        }
    }
    out
}

fn check_fetch_url(p: &mut Problems, path: &str, url: &str) {
    if let Some(problem) = fetch_url_problem(url) {
        p.add(path, problem);
    }
}

/// What is wrong with fetching the key set (or discovery) from `url`, if
/// anything. It travels over HTTPS; plain HTTP only to this host (a
/// sidecar, or a test), where nobody on the path could swap the keys.
pub fn fetch_url_problem(url: &str) -> Option<String> {
    let uri: http::Uri = match url.parse() {
        Ok(u) => u,
        Err(e) => return Some(format!("not a URL ({e})")),
    };
    let host = uri.host().unwrap_or("");
    match uri.scheme_str() {
        Some("https") if !host.is_empty() => None,
        Some("http") if is_loopback(host) => None,
        Some("http") => Some(
            "http:// only for a loopback address (127.0.0.1, [::1], localhost); use https://"
                .into(),
        ),
        _ => Some("expected an https:// URL".into()),
    }
}

fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}
