use super::*;
use std::time::Duration;

const MINIMAL: &str = r#"
[server]
insecure_http = true
[upstreams.clusters]
targets = ["http://127.0.0.1:9000"]
[[routes]]
method = "GET"
path = "/api/v1/clusters"
auth = "api_key"
scope = "clusters:read"
organization = "query:organization_id"
upstream = "clusters"
"#;

fn problems(text: &str) -> Vec<String> {
    Settings::parse(text)
        .unwrap_err()
        .iter()
        .map(|p| p.to_string())
        .collect()
}

#[test]
fn a_small_file_gets_every_default() {
    let s = Settings::parse(MINIMAL).unwrap();
    assert_eq!(s.server.listen.to_string(), "0.0.0.0:8443");
    assert!(s.server.tls.is_none());
    assert_eq!(s.server.limits.max_header_bytes, 16_384);
    assert_eq!(s.server.limits.max_body_bytes, 1_048_576);
    assert_eq!(s.store.url, "sqlite://data/gateway.db?mode=rwc");
    assert_eq!(s.store.cache_ttl, Duration::from_secs(30));
    assert_eq!(s.store.cache_capacity, 1_000_000);
    assert_eq!(s.store.negative_cache_capacity, 100_000);
    assert_eq!(s.rate_limit.policies.len(), 1);
    assert_eq!(s.rate_limit.policies[0].name, "default");
    assert_eq!(s.rate_limit.policies[0].quota.requests.get(), 100);
    assert_eq!(s.rate_limit.auth_failures.requests.get(), 20);
    assert_eq!(s.routes[0].rate_limit, Some(0));
    assert_eq!(
        s.routes[0].organization,
        OrgSource::Query("organization_id".into())
    );
    assert!(s.roles.allows("viewer", "clusters:read"));
    assert!(!s.roles.allows("viewer", "clusters:write"));
    assert!(s.roles.allows("owner", "anything"));
    assert_eq!(s.admin.listen.unwrap().to_string(), "127.0.0.1:9901");
}

#[test]
fn the_shipped_config_is_valid_apart_from_its_tls_files() {
    let text = include_str!("../../config/gateway.toml");
    let errs = Settings::parse(text).err().unwrap_or_default();
    // The repository ships no private key; everything else must be valid.
    assert!(
        errs.iter().all(|p| p.path.starts_with("server.tls.")),
        "{errs:?}"
    );
    let text = text.replace(
        "cert = \"config/tls/cert.pem\"\nkey  = \"config/tls/key.pem\"",
        "self_signed = true",
    );
    let s = Settings::parse(&text).unwrap();
    assert_eq!(s.routes.len(), 12);
    assert!(matches!(
        s.upstreams["api-keys"],
        UpstreamSettings::Builtin(BuiltinService::ApiKeys)
    ));
}

#[test]
fn unknown_keys_are_refused_with_their_path() {
    let text = MINIMAL.replace(
        "insecure_http = true",
        "insecure_http = true\nlisten_addr = \"x\"",
    );
    let errs = problems(&text);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0].starts_with("server.listen_addr: unknown field `listen_addr`"),
        "{errs:?}"
    );
    let errs = problems(&format!("{MINIMAL}\n[server.limits]\nmax_body = 3\n"));
    assert!(
        errs[0].starts_with("server.limits.max_body: unknown field"),
        "{errs:?}"
    );
    let errs = problems(&format!("{MINIMAL}\n[ratelimit]\n"));
    assert!(
        errs[0].starts_with("ratelimit: unknown section"),
        "{errs:?}"
    );
}

#[test]
fn every_problem_is_listed_not_just_the_first() {
    let text = r#"
[server]
insecure_http = true
listen = "nowhere"
[server.limits]
idle_timeout = "forever"
[store]
cache_ttl = "0s"
negative_cache_capacity = 0
[rate_limit.policies.default]
requests = 0
per = "1m"
[roles]
viewer = ["clusters:raed"]
[upstreams.clusters]
targets = ["ftp://x"]
[[routes]]
method = "get"
path = "/api/v1/clusters"
auth = "api_key"
scope = "clusters:read"
upstream = "clustrs"
rate_limit = "strict"
[[routes]]
method = "GET"
path = "/api/v1/x"
auth = "apikey"
upstream = "clusters"
"#;
    let errs = problems(text);
    let has = |prefix: &str| errs.iter().any(|e| e.starts_with(prefix));
    for prefix in [
        "server.limits.idle_timeout: invalid duration \"forever\"",
        "store.cache_ttl: must be longer than zero",
        "store.negative_cache_capacity: must be greater than zero",
        "rate_limit.policies.default.requests: must be at least 1",
        "roles.viewer[0]: unknown permission \"clusters:raed\"",
        "upstreams.clusters.targets[0]: invalid target",
        "routes[0].method: invalid method \"get\"",
        "routes[0].upstream: unknown upstream \"clustrs\"",
        "routes[0].rate_limit: unknown policy \"strict\"",
        "routes[1].auth: unknown variant `apikey`",
    ] {
        assert!(has(prefix), "missing {prefix:?} in {errs:#?}");
    }
    // server.listen is reported even though server.limits also failed to parse.
    assert!(errs.iter().any(|e| e.starts_with("server")), "{errs:#?}");
}

#[test]
fn tls_is_required_and_files_must_exist() {
    let text = MINIMAL.replace("insecure_http = true", "");
    assert!(problems(&text)[0].starts_with("server.tls: required"));
    let text = MINIMAL.replace(
        "insecure_http = true",
        "[server.tls]\ncert = \"/nonexistent/cert.pem\"\nkey = \"/nonexistent/key.pem\"",
    );
    let errs = problems(&text);
    assert!(
        errs.iter().any(|e| e.starts_with("server.tls.cert: file")),
        "{errs:?}"
    );
    assert!(
        errs.iter().any(|e| e.starts_with("server.tls.key: file")),
        "{errs:?}"
    );
    let text = MINIMAL.replace("insecure_http = true", "[server.tls]\nself_signed = true");
    assert_eq!(
        Settings::parse(&text).unwrap().server.tls,
        Some(TlsSettings::SelfSigned)
    );
}

#[test]
fn route_cross_references_are_checked() {
    let route = |extra: &str| {
        format!("{MINIMAL}\n[[routes]]\nmethod = \"POST\"\nupstream = \"clusters\"\n{extra}\n")
    };
    let errs = problems(&route("path = \"/a/{id}\"\nauth = \"session\"\nscope = \"clusters:write\"\norganization = \"path:org\""));
    assert!(
        errs[0].starts_with("routes[1].organization: the path has no {org} parameter"),
        "{errs:?}"
    );
    let errs = problems(&route(
        "path = \"/a\"\nauth = \"session\"\nscope = \"clusters:write\"",
    ));
    assert!(errs[0].contains("needs an organization"), "{errs:?}");
    let errs = problems(&route(
        "path = \"/a\"\nauth = \"none\"\nscope = \"clusters:write\"",
    ));
    assert!(
        errs[0].starts_with("routes[1].scope: a scope needs auth"),
        "{errs:?}"
    );
    let errs = problems(&route("path = \"/a//b\"\nauth = \"none\""));
    assert!(errs[0].starts_with("routes[1].path"), "{errs:?}");
    let errs = problems(&route(
        "path = \"/api/v1/clusters\"\nauth = \"api_key\"\nmethod = \"GET\"",
    ));
    assert!(!errs.is_empty());
    let dup = format!(
        "{MINIMAL}{}",
        &MINIMAL[MINIMAL.find("[[routes]]").unwrap()..]
    );
    let errs = problems(&dup);
    assert!(
        errs[0].contains("duplicate route GET /api/v1/clusters"),
        "{errs:?}"
    );
}

#[test]
fn builtin_routes_must_be_key_endpoints() {
    let text = format!(
        "{MINIMAL}\n[upstreams.keys]\nbuiltin = \"api-keys\"\n[[routes]]\nmethod = \"PUT\"\npath = \"/api/v1/api-keys\"\nauth = \"session\"\nscope = \"api-keys:write\"\norganization = \"query:organization_id\"\nupstream = \"keys\"\n"
    );
    let errs = problems(&text);
    assert!(
        errs[0].contains("not an endpoint of the built-in api-keys service"),
        "{errs:?}"
    );
    let errs = problems(&format!("{MINIMAL}\n[upstreams.x]\nbuiltin = \"users\"\n"));
    assert!(
        errs[0].starts_with("upstreams.x.builtin: unknown builtin service"),
        "{errs:?}"
    );
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

#[test]
fn syntax_errors_name_the_line() {
    let errs = problems("[server\nlisten = 1");
    assert_eq!(errs.len(), 1);
    assert!(errs[0].contains("line 1"), "{errs:?}");
    // The excerpt keeps its lines: the source line, then a caret under column 8.
    let lines: Vec<&str> = errs[0].lines().collect();
    let source = lines
        .iter()
        .position(|l| l.ends_with("| [server"))
        .expect(&errs[0]);
    let caret = lines[source + 1];
    assert_eq!(
        caret.find('^'),
        Some(lines[source].find('[').unwrap() + 7),
        "{errs:?}"
    );
}

/// `MINIMAL` with a second route on `clusters`, and a `strict` policy both use.
fn with_policy(policy: &str) -> String {
    let text = MINIMAL.replace(
        "upstream = \"clusters\"",
        "upstream = \"clusters\"\nrate_limit = \"strict\"",
    );
    format!(
        "{text}[[routes]]\nmethod = \"POST\"\npath = \"/api/v1/clusters\"\nauth = \"api_key\"\nscope = \"clusters:write\"\norganization = \"query:organization_id\"\nupstream = \"clusters\"\nrate_limit = \"strict\"\n[rate_limit.policies.strict]\n{policy}\n"
    )
}

#[test]
fn an_invalid_upstream_is_one_problem_not_one_per_route_using_it() {
    let two_routes = |upstream: &str| {
        with_policy("requests = 5\nper = \"1s\"").replace(
            "[upstreams.clusters]\ntargets = [\"http://127.0.0.1:9000\"]",
            upstream,
        )
    };
    let errs = problems(&two_routes(
        "[upstreams.clusters]\ntargets = [\"http://127.0.0.1:9000\"]\nconect_timeout = \"2s\"",
    ));
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert!(
        errs[0].starts_with("upstreams.clusters.conect_timeout: unknown field"),
        "{errs:?}"
    );
    // Parsed but refused: the same.
    let errs = problems(&two_routes(
        "[upstreams.clusters]\ntargets = [\"http://127.0.0.1:9000\"]\nbuiltin = \"api-keys\"",
    ));
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert!(
        errs[0].starts_with("upstreams.clusters: set either"),
        "{errs:?}"
    );
    // The whole section unreadable: one problem.
    let errs = problems(&format!("upstreams = 5\n{}", two_routes("")));
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert!(errs[0].starts_with("upstreams: invalid type"), "{errs:?}");
    // A name no entry has is still unknown.
    let errs = problems(&two_routes(
        "[upstreams.clustrs]\ntargets = [\"http://127.0.0.1:9000\"]\nconect_timeout = \"2s\"",
    ));
    assert_eq!(errs.len(), 3, "{errs:#?}");
    assert!(
        errs[1].starts_with("routes[0].upstream: unknown upstream \"clusters\""),
        "{errs:?}"
    );
}

#[test]
fn an_invalid_policy_is_one_problem_not_one_per_route_using_it() {
    for (policy, problem) in [
        (
            "requests = \"100\"\nper = \"1s\"",
            "rate_limit.policies.strict.requests: invalid type",
        ),
        (
            "requests = 0\nper = \"1s\"",
            "rate_limit.policies.strict.requests: must be at least 1",
        ),
        (
            "requests = 5\nper = \"1s\"\nkey = \"client\"",
            "rate_limit.policies.strict.key: unknown variant",
        ),
    ] {
        let errs = problems(&with_policy(policy));
        assert_eq!(errs.len(), 1, "{policy}: {errs:#?}");
        assert!(errs[0].starts_with(problem), "{errs:?}");
    }
    // The whole [rate_limit] unreadable (a bad backend): its policies are not known.
    let errs = problems(&with_policy("requests = 5\nper = \"1s\"").replace(
        "[rate_limit.policies.strict]",
        "[rate_limit]\nbackend = \"memcached\"\n[rate_limit.policies.strict]",
    ));
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert!(errs[0].starts_with("rate_limit.backend"), "{errs:?}");
}

#[test]
fn roles_and_routes_do_not_echo_each_others_parse_failures() {
    // A route that fails to parse still names the scope a role grants.
    let text = format!(
        "{MINIMAL}[[routes]]\nmethod = \"GET\"\npath = \"/b\"\nauth = \"api_key\"\nscope = \"billing:read\"\norganization = \"query:org\"\nupstream = \"clusters\"\ntimeout = 1\n[roles]\nowner = [\"*\"]\nbilling = [\"billing:read\"]\n"
    );
    let errs = problems(&text);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert!(
        errs[0].starts_with("routes[1].timeout: unknown field"),
        "{errs:?}"
    );
    // Unreadable roles: a route's scope is not called granted by none.
    let text = format!(
        "{MINIMAL}[[routes]]\nmethod = \"GET\"\npath = \"/b\"\nauth = \"api_key\"\nscope = \"billing:read\"\norganization = \"query:org\"\nupstream = \"clusters\"\n[roles]\nbilling = \"billing:read\"\n"
    );
    let errs = problems(&text);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert!(
        errs[0].starts_with("roles.billing: invalid type"),
        "{errs:?}"
    );
}

#[test]
fn a_config_error_indents_the_lines_of_a_syntax_error_alike() {
    let err = ConfigError {
        file: "gateway.toml".into(),
        problems: Settings::parse("[server\n").unwrap_err(),
    };
    let text = err.to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "gateway.toml: 1 problem(s)");
    assert!(
        lines[1].starts_with("  TOML parse error at line 1, column 8"),
        "{text}"
    );
    let source = lines
        .iter()
        .position(|l| l.ends_with("| [server"))
        .expect(&text);
    assert_eq!(
        lines[source + 1].find('^'),
        Some(lines[source].find('[').unwrap() + 7),
        "{text}"
    );
    assert!(lines[2..].iter().all(|l| l.starts_with("    ")), "{text}");
}

#[test]
fn the_production_example_is_valid_apart_from_its_tls_files() {
    let text = include_str!("../../config/production.toml");
    let errs = Settings::parse(text).err().unwrap_or_default();
    assert!(
        errs.iter().all(|p| p.path.starts_with("server.tls.")),
        "{errs:?}"
    );
}

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
            "postgres://db.internal/gateway?sslmode=require&PASSWORD=hunter2",
            "postgres://db.internal/gateway?sslmode=require&PASSWORD=***",
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
fn connection_and_header_counts_too_large_to_serve_are_refused_by_path() {
    // Past tokio's semaphore limit (usize::MAX >> 3) the server or an upstream
    // pool panics at start; past 2^31 the HTTP/2 header-list limit overflows.
    let huge = i64::MAX;
    for (section, key) in [
        ("[server.limits]", "max_connections"),
        ("[server.limits]", "max_header_bytes"),
    ] {
        let errs = problems(&MINIMAL.replace(
            "[server]\ninsecure_http = true",
            &format!("[server]\ninsecure_http = true\n{section}\n{key} = {huge}"),
        ));
        assert!(
            errs.iter()
                .any(|e| e.starts_with(&format!("server.limits.{key}: at most"))),
            "{key}: {errs:?}"
        );
    }
    let errs = problems(&MINIMAL.replace(
        "targets = [",
        &format!("max_connections_per_target = {huge}\ntargets = ["),
    ));
    assert!(
        errs.iter()
            .any(|e| e.starts_with("upstreams.clusters.max_connections_per_target: at most")),
        "{errs:?}"
    );
    // Large but servable values stay accepted.
    let ok = MINIMAL.replace(
        "[server]\ninsecure_http = true",
        "[server]\ninsecure_http = true\n[server.limits]\nmax_connections = 1000000\nmax_header_bytes = 1048576",
    );
    assert!(Settings::parse(&ok).is_ok());
}

#[test]
fn key_service_routes_by_id_must_take_the_organization_of_that_key() {
    // Without `organization = "key:id"` the key's organization is never checked
    // against the caller's: revoke or delete would reach any organization's key.
    let keys = "\n[upstreams.keys]\nbuiltin = \"api-keys\"\n";
    for (method, path, organization) in [
        ("POST", "/api/v1/api-keys/{id}/revoke", "none"),
        ("DELETE", "/api/v1/api-keys/{id}", "query:organization_id"),
        ("GET", "/api/v1/api-keys/{id}", "path:id"),
    ] {
        let errs = problems(&format!(
            "{MINIMAL}{keys}[[routes]]\nmethod = \"{method}\"\npath = \"{path}\"\nauth = \"session\"\norganization = \"{organization}\"\nupstream = \"keys\"\n"
        ));
        assert!(
            errs.iter()
                .any(|e| e.starts_with("routes[1].organization:") && e.contains("\"key:id\"")),
            "{method} {path} with {organization}: {errs:?}"
        );
    }
    for (method, organization) in [("POST", "none"), ("GET", "none")] {
        let errs = problems(&format!(
            "{MINIMAL}{keys}[[routes]]\nmethod = \"{method}\"\npath = \"/api/v1/api-keys\"\nauth = \"session\"\norganization = \"{organization}\"\nupstream = \"keys\"\n"
        ));
        assert!(
            errs.iter()
                .any(|e| e.starts_with("routes[1].organization:")),
            "{method} with {organization}: {errs:?}"
        );
    }
    // The shipped form stays valid.
    let ok = format!(
        "{MINIMAL}{keys}[[routes]]\nmethod = \"POST\"\npath = \"/api/v1/api-keys/{{id}}/revoke\"\nauth = \"session\"\nscope = \"api-keys:write\"\norganization = \"key:id\"\nupstream = \"keys\"\n"
    );
    assert!(
        Settings::parse(&ok).is_ok(),
        "{:?}",
        Settings::parse(&ok).err()
    );
}

#[test]
fn auth_failures_keys_default_one_by_one() {
    // Every key but routes and upstreams has a default, so a table that
    // sets one of the two keys keeps the other's default.
    let text = |body: &str| format!("{MINIMAL}\n[rate_limit.auth_failures]\n{body}\n");
    let s = Settings::parse(&text("requests = 5")).unwrap();
    assert_eq!(s.rate_limit.auth_failures.requests.get(), 5);
    assert_eq!(s.rate_limit.auth_failures.per, Duration::from_secs(60));
    let s = Settings::parse(&text("per = \"10m\"")).unwrap();
    assert_eq!(s.rate_limit.auth_failures.requests.get(), 20);
    assert_eq!(s.rate_limit.auth_failures.per, Duration::from_secs(600));
    let errs = problems(&text("requests = 0"));
    assert!(
        errs[0].starts_with("rate_limit.auth_failures.requests"),
        "{errs:?}"
    );
}

#[test]
fn scopes_that_would_not_survive_a_space_separated_list_are_refused() {
    // `X-Mpg-Scopes` and the store list scopes space-separated: a route scope
    // "billing clusters:write" granted by a role reached the upstream as the
    // two scopes `billing` and `clusters:write`.
    for scope in ["billing clusters:write", "", "tab\tscope", "*"] {
        let text = format!(
            "{MINIMAL}\n[roles]\nowner = [\"*\"]\nbilling = [{scope:?}]\n[[routes]]\nmethod = \"POST\"\npath = \"/b\"\nauth = \"api_key\"\nscope = {scope:?}\nupstream = \"clusters\"\n"
        );
        let errs = problems(&text);
        assert!(
            errs.iter()
                .any(|e| e.starts_with("routes[1].scope: invalid scope")),
            "{scope:?}: {errs:?}"
        );
    }
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
fn postgres_tls_parameters_are_checked_before_start() {
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
}

#[test]
fn admin_allowed_hosts_are_dns_names_without_port_or_scheme() {
    let s = Settings::parse(&format!(
        "{MINIMAL}[admin]\nallowed_hosts = [\"GW-1.internal\", \"gw-1.internal\", \"metrics\"]\n"
    ))
    .unwrap();
    assert_eq!(s.admin.allowed_hosts, ["gw-1.internal", "metrics"]);
    assert!(Settings::parse(MINIMAL)
        .unwrap()
        .admin
        .allowed_hosts
        .is_empty());
    let errs = problems(&format!(
        "{MINIMAL}[admin]\nallowed_hosts = [\"ok.internal\", \"gw:9901\", \"http://gw\", \"\", \"a..b\"]\n"
    ));
    for i in 1..=4 {
        assert!(
            errs.iter()
                .any(|e| e.starts_with(&format!("admin.allowed_hosts[{i}]: invalid host name"))),
            "[{i}] not named in {errs:#?}"
        );
    }
    assert_eq!(errs.len(), 4, "{errs:#?}");
}

#[test]
fn client_ip_defaults_to_no_trusted_proxy_and_x_forwarded_for() {
    let s = Settings::parse(MINIMAL).unwrap();
    assert!(s.server.client_ip.trusted_proxies.is_empty());
    assert_eq!(s.server.client_ip.header, "x-forwarded-for");
    assert!(!s.server.proxy_protocol);
    let s = Settings::parse(&MINIMAL.replace(
        "insecure_http = true",
        "insecure_http = true\nproxy_protocol = true\n[server.client_ip]\ntrusted_proxies = [\"10.0.0.0/8\", \"2001:db8::/32\", \"192.0.2.1\"]\nheader = \"X-Real-Client\"",
    ))
    .unwrap();
    assert!(s.server.proxy_protocol);
    assert_eq!(s.server.client_ip.header, "x-real-client");
    let trusted = &s.server.client_ip.trusted_proxies;
    assert!(trusted.contains("10.1.2.3".parse().unwrap()));
    assert!(trusted.contains("2001:db8::5".parse().unwrap()));
    assert!(trusted.contains("192.0.2.1".parse().unwrap()));
    assert!(!trusted.contains("192.0.2.2".parse().unwrap()));
}

#[test]
fn bad_client_ip_settings_are_each_named() {
    let errs = problems(&MINIMAL.replace(
        "insecure_http = true",
        "insecure_http = true\n[server.client_ip]\ntrusted_proxies = [\"10.0.0.0/8\", \"10.0.0.1/8\", \"nlb.internal\"]\nheader = \"x forwarded\"",
    ));
    assert_eq!(errs.len(), 3, "{errs:?}");
    assert!(
        errs[0].starts_with("server.client_ip.trusted_proxies[1]: ")
            && errs[0].contains("10.0.0.0/8"),
        "{errs:?}"
    );
    assert!(
        errs[1].starts_with("server.client_ip.trusted_proxies[2]: ")
            && errs[1].contains("nlb.internal"),
        "{errs:?}"
    );
    assert!(errs[2].starts_with("server.client_ip.header: "), "{errs:?}");
    let errs = problems(&MINIMAL.replace(
        "insecure_http = true",
        "insecure_http = true\n[server.client_ip]\nheader = \"Forwarded\"",
    ));
    assert!(
        errs[0].starts_with("server.client_ip.header: ") && errs[0].contains("RFC 7239"),
        "{errs:?}"
    );
}

#[test]
fn the_proxy_protocol_needs_trusted_proxies() {
    let errs = problems(&MINIMAL.replace(
        "insecure_http = true",
        "insecure_http = true\nproxy_protocol = true",
    ));
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0].starts_with("server.proxy_protocol: ")
            && errs[0].contains("server.client_ip.trusted_proxies"),
        "{errs:?}"
    );
}

#[test]
fn a_policy_is_enforced_unless_its_mode_is_shadow() {
    let s = Settings::parse(MINIMAL).unwrap();
    assert_eq!(s.rate_limit.policies[0].mode, PolicyMode::Enforce);
    let text = |mode: &str| {
        format!("{MINIMAL}\n[rate_limit.policies.default]\nrequests = 5\nper = \"1s\"\nmode = {mode:?}\n")
    };
    let s = Settings::parse(&text("shadow")).unwrap();
    assert_eq!(s.rate_limit.policies[0].mode, PolicyMode::Shadow);
    let s = Settings::parse(&text("enforce")).unwrap();
    assert_eq!(s.rate_limit.policies[0].mode, PolicyMode::Enforce);
    let errs = problems(&text("log-only"));
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0].starts_with("rate_limit.policies.default.mode: unknown variant `log-only`"),
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
