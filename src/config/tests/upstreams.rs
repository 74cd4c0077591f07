//! `[upstreams.NAME]`: forwarding defaults, bad keys named, CA and client
//! certificate files, and identity-signing keys read from the environment.
use super::*;

fn clusters(s: &Settings) -> &HttpUpstreamSettings {
    match &s.upstreams["clusters"] {
        UpstreamSettings::Http(h) => h,
        other => panic!("not forwarded: {other:?}"),
    }
}

#[test]
fn forwarding_keys_get_defaults_a_user_would_expect() {
    let s = Settings::parse(MINIMAL).unwrap();
    let h = clusters(&s);
    assert_eq!(h.balance, Balance::RoundRobin);
    assert_eq!(h.connect_timeout, Duration::from_secs(2));
    assert_eq!(h.request_timeout, Duration::from_secs(30));
    assert_eq!(h.timeout, None);
    assert_eq!(h.retries, 1);
    assert_eq!(h.max_connections_per_target, 512);
    assert_eq!(h.idle_timeout, Duration::from_secs(90));
    assert_eq!(h.max_fails, 3);
    assert_eq!(h.fail_timeout, Duration::from_secs(2));
    assert_eq!(h.health_path, None);
    assert!(!h.http2);
    assert!(h.ca_file.is_none() && h.client_identity.is_none());

    let text = MINIMAL.replace(
        "targets = [\"http://127.0.0.1:9000\"]",
        "targets = [\"http://127.0.0.1:9000\", \"http://127.0.0.1:9001\"]\nbalance = \"least_outstanding\"\ntimeout = \"2m\"\nretries = 0\nmax_connections_per_target = 8\nmax_fails = 0\nfail_timeout = \"1s\"\nhealth_path = \"/healthz\"\nhealth_interval = \"2s\"\nhttp2 = true",
    );
    let s = Settings::parse(&text).unwrap();
    let h = clusters(&s);
    assert_eq!(h.targets.len(), 2);
    assert_eq!(h.balance, Balance::LeastOutstanding);
    assert_eq!(h.timeout, Some(Duration::from_secs(120)));
    assert_eq!(
        (h.retries, h.max_connections_per_target, h.max_fails),
        (0, 8, 0)
    );
    assert_eq!(h.health_path.as_deref(), Some("/healthz"));
    assert_eq!(h.health_interval, Duration::from_secs(2));
    assert!(h.http2);
}

#[test]
fn bad_forwarding_keys_are_each_named() {
    let text = MINIMAL.replace(
        "targets = [\"http://127.0.0.1:9000\"]",
        "targets = [\"http://127.0.0.1:9000\", \"http://127.0.0.1:9000\"]\nrequest_timeout = \"10s\"\ntimeout = \"5s\"\nretries = 11\nmax_connections_per_target = 0\nfail_timeout = \"0s\"\nhealth_path = \"healthz\"\nca_file = \"ca.pem\"\nclient_key = \"k.pem\"",
    );
    let errs = problems(&text);
    for expected in [
        "upstreams.clusters.targets[1]: duplicate target",
        "upstreams.clusters.timeout: the whole-request timeout must not be shorter than request_timeout",
        "upstreams.clusters.retries: at most 10",
        "upstreams.clusters.max_connections_per_target: must be at least 1",
        "upstreams.clusters.fail_timeout: must be longer than zero",
        "upstreams.clusters.health_path: invalid path",
        "upstreams.clusters.ca_file: applies only to https:// targets",
        "upstreams.clusters.client_key: applies only to https:// targets",
    ] {
        assert!(
            errs.iter().any(|e| e.starts_with(expected)),
            "missing {expected:?} in {errs:?}"
        );
    }
    let errs = problems(&MINIMAL.replace("http://127.0.0.1:9000", "https://127.0.0.1:9000").replace(
        "targets = [",
        "client_cert = \"/nonexistent/c.pem\"\nclient_key = \"/nonexistent/k.pem\"\ntargets = [",
    ));
    assert!(
        errs.iter().any(
            |e| e.starts_with("upstreams.clusters.client_cert: cannot read /nonexistent/c.pem")
        ),
        "{errs:?}"
    );
    let errs = problems(&format!(
        "{MINIMAL}\n[upstreams.keys]\nbuiltin = \"api-keys\"\nretries = 2\nhttp2 = true\n"
    ));
    assert!(
        errs.iter()
            .any(|e| e
                == "upstreams.keys: retries, http2 apply to targets, not to a builtin service"),
        "{errs:?}"
    );
}

#[test]
fn a_ca_file_and_a_matching_client_identity_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = crate::tls::self_signed_pem().unwrap();
    let (_, other_key) = crate::tls::self_signed_pem().unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let (c, k, o) = (
        write("c.pem", &cert),
        write("k.pem", &key),
        write("o.pem", &other_key),
    );
    let text = |key: &str| {
        MINIMAL
            .replace("http://127.0.0.1:9000", "https://127.0.0.1:9000")
            .replace(
                "targets = [",
                &format!("ca_file = {c:?}\nclient_cert = {c:?}\nclient_key = {key:?}\ntargets = ["),
            )
    };
    let s = Settings::parse(&text(&k)).unwrap();
    assert_eq!(
        clusters(&s).client_identity,
        Some((PathBuf::from(&c), PathBuf::from(&k)))
    );
    let errs = problems(&text(&o));
    assert!(
        errs.iter()
            .any(|e| e.starts_with("upstreams.clusters.client_key: does not match client_cert")),
        "{errs:?}"
    );
    let errs = problems(&text(&c));
    assert!(
        errs.iter()
            .any(|e| e.starts_with("upstreams.clusters.client_key: cannot read")),
        "{errs:?}"
    );
}

/// Validates `text` with `vars` as the whole environment.
fn with_env(text: &str, vars: &[(&str, &str)]) -> Result<Settings, Vec<String>> {
    let env = |name: &str| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| std::ffi::OsString::from(v))
    };
    super::validate::validate_with_env(text, true, &env)
        .map_err(|ps| ps.iter().map(|p| p.to_string()).collect())
}

#[test]
fn content_digests_are_signed_by_default_and_need_a_signing_key() {
    let signed = MINIMAL.replacen(
        "targets = [\"http://127.0.0.1:9000\"]",
        "targets = [\"http://127.0.0.1:9000\"]\nsign_identity_key_env = \"MPG_SIGN\"",
        1,
    );
    let s = with_env(&signed, &[("MPG_SIGN", "k")]).unwrap();
    assert!(clusters(&s).sign_content_digest);
    let off = signed.replacen(
        "sign_identity_key_env",
        "sign_content_digest = false\nsign_identity_key_env",
        1,
    );
    let s = with_env(&off, &[("MPG_SIGN", "k")]).unwrap();
    assert!(!clusters(&s).sign_content_digest);
    let alone = MINIMAL.replacen(
        "targets = [\"http://127.0.0.1:9000\"]",
        "targets = [\"http://127.0.0.1:9000\"]\nsign_content_digest = true",
        1,
    );
    assert_eq!(
        with_env(&alone, &[]).unwrap_err(),
        ["upstreams.clusters.sign_content_digest: needs sign_identity_key_env"]
    );
}

#[test]
fn the_identity_signing_key_comes_from_the_named_variable() {
    let text = &MINIMAL.replacen(
        "targets = [\"http://127.0.0.1:9000\"]",
        "targets = [\"http://127.0.0.1:9000\"]\nsign_identity_key_env = \"MPG_SIGN\"",
        1,
    );
    let s = with_env(text, &[("MPG_SIGN", "s3cr3t-value")]).unwrap();
    let keys = clusters(&s).sign_identity.as_ref().unwrap();
    assert_eq!(keys.key(), b"s3cr3t-value");
    assert_eq!(keys.key_env, "MPG_SIGN");
    assert!(!format!("{s:?}").contains("s3cr3t"), "Debug shows the key");
    assert!(clusters(&Settings::parse(MINIMAL).unwrap())
        .sign_identity
        .is_none());

    let errs = with_env(text, &[]).unwrap_err();
    assert_eq!(
        errs,
        ["upstreams.clusters.sign_identity_key_env: environment variable MPG_SIGN is not set"]
    );
    let errs = with_env(text, &[("MPG_SIGN", "")]).unwrap_err();
    assert_eq!(
        errs,
        ["upstreams.clusters.sign_identity_key_env: environment variable MPG_SIGN is empty"]
    );

    // The previous key is checked like the first, and never printed.
    let rotating = text.replacen(
        "sign_identity_key_env = \"MPG_SIGN\"",
        "sign_identity_key_env = \"MPG_SIGN\"\nsign_identity_previous_key_env = \"MPG_SIGN_OLD\"",
        1,
    );
    let s = with_env(&rotating, &[("MPG_SIGN", "new"), ("MPG_SIGN_OLD", "old")]).unwrap();
    let keys = clusters(&s).sign_identity.as_ref().unwrap();
    assert_eq!(
        (keys.key(), keys.previous_key_env.as_deref()),
        (&b"new"[..], Some("MPG_SIGN_OLD"))
    );
    let errs = with_env(&rotating, &[("MPG_SIGN", "s3cr3t-value")]).unwrap_err();
    assert_eq!(
        errs,
        ["upstreams.clusters.sign_identity_previous_key_env: environment variable MPG_SIGN_OLD is not set"]
    );
    let errs = with_env(&rotating, &[("MPG_SIGN_OLD", "old-s3cr3t")]).unwrap_err();
    assert_eq!(
        errs,
        ["upstreams.clusters.sign_identity_key_env: environment variable MPG_SIGN is not set"]
    );
    let errs = with_env(
        &rotating,
        &[("MPG_SIGN", ""), ("MPG_SIGN_OLD", "old-s3cr3t")],
    );
    assert!(!format!("{errs:?}").contains("s3cr3t"), "{errs:?}");
    let alone = text.replacen("sign_identity_key_env", "sign_identity_previous_key_env", 1);
    let errs = with_env(&alone, &[("MPG_SIGN", "x")]).unwrap_err();
    assert_eq!(
        errs,
        ["upstreams.clusters.sign_identity_previous_key_env: needs sign_identity_key_env (the previous key never signs)"]
    );
    let bad_name = text.replacen("\"MPG_SIGN\"", "\"A=B\"", 1);
    let errs = with_env(&bad_name, &[]).unwrap_err();
    assert_eq!(
        errs,
        ["upstreams.clusters.sign_identity_key_env: \"A=B\" is not an environment variable name"]
    );
    let builtin = format!(
        "{MINIMAL}\n[upstreams.keys]\nbuiltin = \"api-keys\"\nsign_identity_key_env = \"MPG_SIGN\"\n"
    );
    let errs = with_env(&builtin, &[("MPG_SIGN", "x")]).unwrap_err();
    assert_eq!(
        errs,
        ["upstreams.keys: sign_identity_key_env apply to targets, not to a builtin service"]
    );
}
