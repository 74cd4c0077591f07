//! `[store]` and the limiter's Redis: URLs, their TLS forms, passwords kept
//! out of messages, and the audit retention.
use super::*;

#[test]
fn store_urls_never_show_a_password_even_with_an_at_sign_or_in_the_query() {
    for (url, shown) in [
        (
            "postgres://gw:p@ss@db.internal:5432/gateway",
            "postgres://gw:***@db.internal:5432/gateway",
        ),
        (
            "postgres://gw:a/b@c@db.internal/gateway",
            "postgres://gw:***@db.internal/gateway",
        ),
        (
            "postgres://gw:pa?ss@db.internal/gateway",
            "postgres://gw:***@db.internal/gateway",
        ),
        (
            "postgres://gw@db.internal/gateway?password=hunter2",
            "postgres://gw@db.internal/gateway?password=***",
        ),
        (
            "postgres://db.internal/gateway?sslmode=require&password=hunter2",
            "postgres://db.internal/gateway?sslmode=require&password=***",
        ),
    ] {
        let s = Settings::parse(&format!(
            "{MINIMAL}\n[store]\nkind = \"postgres\"\nurl = {url:?}\n"
        ))
        .unwrap();
        assert_eq!(s.store.display, shown, "{url}");
    }
    // Nothing to hide: unchanged.
    for url in [
        "postgres://gw@db.internal/gateway",
        "postgres://db.internal:5432/gateway?sslmode=require",
    ] {
        assert_eq!(redact::redact_url(url), url);
    }
    let errs = problems(&format!(
        "{MINIMAL}\n[rate_limit]\nbackend = \"redis\"\nredis_url = \"http://:p@ss@cache\"\n"
    ));
    assert!(
        errs[0].starts_with("rate_limit.redis_url") && !errs[0].contains("p@ss"),
        "{errs:?}"
    );
}

#[test]
fn redis_urls_take_tls_and_cluster_forms_and_a_ca_file_only_with_tls() {
    let redis = |fields: &str| format!("{MINIMAL}\n[rate_limit]\nbackend = \"redis\"\n{fields}\n");
    for url in [
        "redis://127.0.0.1:6379",
        "rediss://:pw@cache.internal:6380/2",
        "redis+cluster://10.0.0.1:7000,10.0.0.2:7000",
        "rediss+cluster://:pw@10.0.0.1:7000,10.0.0.2:7000",
    ] {
        let s = Settings::parse(&redis(&format!("redis_url = {url:?}"))).unwrap();
        assert_eq!(s.rate_limit.redis.unwrap().url, url);
    }
    // The redis crate's "skip the certificate check" is refused, by name.
    let errs = problems(&redis(
        "redis_url = \"rediss://:pw@127.0.0.1:6380/#insecure\"",
    ));
    assert!(
        errs[0].starts_with("rate_limit.redis_url") && errs[0].contains("#insecure"),
        "{errs:?}"
    );
    assert!(!errs[0].contains("pw"), "{errs:?}");

    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    let cert = rcgen::generate_simple_self_signed(vec!["cache.internal".into()]).unwrap();
    std::fs::write(&ca, cert.cert.pem()).unwrap();
    let with_ca = |url: &str, file: &std::path::Path| {
        redis(&format!("redis_url = {url:?}\nredis_ca_file = {file:?}"))
    };
    let s = Settings::parse(&with_ca("rediss://cache.internal:6380", &ca)).unwrap();
    assert_eq!(s.rate_limit.redis.unwrap().ca_file.as_deref(), Some(&*ca));
    assert!(Settings::parse(&with_ca("rediss+cluster://h:1,h:2", &ca)).is_ok());
    let errs = problems(&with_ca("redis://cache.internal:6379", &ca));
    assert!(
        errs[0].starts_with("rate_limit.redis_ca_file: applies only to rediss://"),
        "{errs:?}"
    );
    let missing = dir.path().join("missing.pem");
    let errs = problems(&with_ca("rediss://cache.internal:6380", &missing));
    assert!(
        errs[0].starts_with("rate_limit.redis_ca_file: cannot read")
            && errs[0].contains("missing.pem"),
        "{errs:?}"
    );
}

#[test]
fn postgres_connect_parameters_are_checked_before_start() {
    let pg = |url: &str| format!("{MINIMAL}\n[store]\nkind = \"postgres\"\nurl = {url:?}\n");
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    let cert = rcgen::generate_simple_self_signed(vec!["db.internal".into()]).unwrap();
    std::fs::write(&ca, cert.cert.pem()).unwrap();
    let ca = ca.to_str().unwrap();
    let ok = format!("postgres://gw:pw@db.internal/gw?sslmode=verify-full&sslrootcert={ca}");
    assert!(Settings::parse(&pg(&ok)).is_ok());
    assert!(Settings::parse(&pg("postgres://db.internal/gw?sslmode=Require")).is_ok());

    let errs = problems(&pg("postgres://gw:pw@db.internal/gw?sslmode=verify_full"));
    assert!(
        errs[0].starts_with("store.url: sslmode=\"verify_full\": expected one of")
            && !errs[0].contains("pw"),
        "{errs:?}"
    );
    let errs = problems(&pg(
        "postgres://db.internal/gw?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
    ));
    assert!(
        errs[0].starts_with("store.url: sslrootcert: cannot read /nonexistent/ca.pem"),
        "{errs:?}"
    );
    // A parameter the driver would ignore (and log, value and all) is refused,
    // by name only; the ones it reads pass.
    let errs = problems(&pg(
        "postgres://db.internal/gw?sslpassword=HUNTER2&auth_token=s3cr3t&application_name=gw",
    ));
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert!(
        errs[0].starts_with("store.url: unknown connect parameter \"sslpassword\""),
        "{errs:?}"
    );
    assert!(errs[1].contains("\"auth_token\""), "{errs:?}");
    assert!(
        !errs
            .iter()
            .any(|e| e.contains("HUNTER2") || e.contains("s3cr3t")),
        "{errs:?}"
    );
    let ok = "postgres://u@h:5432/d?sslmode=disable&statement-cache-capacity=10&options[search_path]=x&password=p";
    assert!(Settings::parse(&pg(ok)).is_ok());
}

#[test]
fn audit_retention_defaults_to_90_days_and_must_be_positive() {
    let s = Settings::parse(MINIMAL).unwrap();
    assert_eq!(s.store.audit_retention, Duration::from_secs(90 * 24 * 3600));
    let s = Settings::parse(&format!("{MINIMAL}\n[store]\naudit_retention = \"30d\"\n")).unwrap();
    assert_eq!(s.store.audit_retention, Duration::from_secs(30 * 24 * 3600));
    for bad in ["0s", "soon"] {
        let errs = problems(&format!(
            "{MINIMAL}\n[store]\naudit_retention = \"{bad}\"\n"
        ));
        assert!(
            errs.iter().any(|e| e.contains("store.audit_retention")),
            "{bad}: {errs:?}"
        );
    }
}

#[test]
fn store_and_limiter_backends_need_their_urls() {
    let errs = problems(&format!("{MINIMAL}\n[store]\nkind = \"postgres\"\n"));
    assert!(errs[0].starts_with("store.url: required"), "{errs:?}");
    let s = Settings::parse(&format!(
        "{MINIMAL}\n[store]\nkind = \"postgres\"\nurl = \"postgres://u:secret@127.0.0.1/db\"\n"
    ))
    .unwrap();
    assert_eq!(s.store.display, "postgres://u:***@127.0.0.1/db");
    let errs = problems(&format!("{MINIMAL}\n[rate_limit]\nbackend = \"redis\"\n"));
    assert!(
        errs[0].starts_with("rate_limit.redis_url: required"),
        "{errs:?}"
    );
}
