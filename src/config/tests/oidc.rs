//! `[auth.oidc]`: the defaults, and what is refused with its TOML path.
use super::*;
use jsonwebtoken::Algorithm;

fn with_oidc(section: &str) -> String {
    format!("{MINIMAL}\n[auth.oidc]\n{section}")
}

#[test]
fn a_small_oidc_section_gets_every_default() {
    let s = Settings::parse(&with_oidc(
        "issuer = \"https://id.example.com\"\naudiences = [\"mpg-api\"]",
    ))
    .unwrap();
    let o = s.auth.oidc.expect("[auth.oidc] read");
    assert_eq!(o.issuer, "https://id.example.com");
    assert_eq!(o.jwks_url, None, "discovered from the issuer");
    assert_eq!(o.user_claim, "sub");
    assert_eq!(
        o.algorithms,
        [Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA]
    );
    assert_eq!(o.leeway, Duration::from_secs(60));
    assert_eq!(o.jwks_refresh, Duration::from_secs(600));
    assert!(!o.provision_users);
    assert_eq!(o, OidcSettings::new("https://id.example.com", &["mpg-api"]));
    assert!(Settings::parse(MINIMAL).unwrap().auth.oidc.is_none());
}

#[test]
fn unsigned_and_symmetric_algorithms_are_refused() {
    let errs = problems(&with_oidc(
        "issuer = \"https://id.example.com\"\naudiences = [\"mpg-api\"]\n\
         algorithms = [\"RS256\", \"none\", \"HS256\", \"hs512\", \"RS257\"]",
    ));
    for want in [
        "auth.oidc.algorithms: \"none\" is refused",
        "auth.oidc.algorithms: \"HS256\" is refused",
        "auth.oidc.algorithms: \"hs512\" is refused",
        "auth.oidc.algorithms: unknown algorithm \"RS257\"",
    ] {
        assert!(
            errs.iter().any(|e| e.starts_with(want)),
            "missing {want:?} in {errs:#?}"
        );
    }
}

#[test]
fn the_key_set_comes_over_https_or_from_this_host() {
    let ok = |url: &str| {
        Settings::parse(&with_oidc(&format!(
            "issuer = \"x\"\naudiences = [\"a\"]\njwks_url = \"{url}\""
        )))
        .is_ok()
    };
    assert!(ok("https://id.example.com/jwks"));
    assert!(ok("http://127.0.0.1:8080/jwks"));
    assert!(ok("http://[::1]:8080/jwks"));
    assert!(ok("http://localhost/jwks"));
    assert!(!ok("http://id.example.com/jwks"));
    assert!(!ok("http://10.0.0.1/jwks"));
    assert!(!ok("ftp://id.example.com/jwks"));
    // Without jwks_url the issuer is fetched from, so the same holds for it.
    let errs = problems(&with_oidc(
        "issuer = \"http://id.example.com\"\naudiences = [\"a\"]",
    ));
    assert!(
        errs.iter()
            .any(|e| e.starts_with("auth.oidc.issuer: http:// only for a loopback")),
        "{errs:#?}"
    );
}

#[test]
fn every_missing_or_wrong_key_is_named() {
    let errs = problems(&with_oidc(
        "audiences = []\nuser_claim = \"\"\njwks_refresh = \"0s\"\nca_file = \"/nonexistent/ca.pem\"\nissuers = 1",
    ));
    assert!(
        errs.iter()
            .any(|e| e.starts_with("auth.oidc.issuers: unknown field `issuers`")),
        "{errs:#?}"
    );
    let errs = problems(&with_oidc(
        "audiences = []\nuser_claim = \"\"\njwks_refresh = \"0s\"\nca_file = \"/nonexistent/ca.pem\"",
    ));
    for want in [
        "auth.oidc.issuer: required",
        "auth.oidc.audiences: at least one",
        "auth.oidc.user_claim: must name a claim",
        "auth.oidc.jwks_refresh: must be longer than zero",
        "auth.oidc.ca_file:",
    ] {
        assert!(
            errs.iter().any(|e| e.starts_with(want)),
            "missing {want:?} in {errs:#?}"
        );
    }
}
