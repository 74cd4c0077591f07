use super::*;
use std::time::Duration;

mod backends;
mod oidc;
mod server;
mod upstreams;

pub(super) const MINIMAL: &str = r#"
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
    assert_eq!(s.server.shutdown_delay, Duration::ZERO);
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
    let text = include_str!("../../../config/gateway.toml");
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
    assert_eq!(s.routes.len(), 13);
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
fn a_route_may_keep_only_fields_that_are_removed_by_default() {
    let s = Settings::parse(&format!(
        "{MINIMAL}keep_client_headers = [\"X-Original-URI\", \"remote-user\"]\n"
    ))
    .unwrap();
    let kept: Vec<&str> = s.routes[0]
        .keep_client_headers
        .iter()
        .map(|n| n.as_str())
        .collect();
    assert_eq!(kept, ["x-original-uri", "remote-user"]);
    assert!(Settings::parse(MINIMAL).unwrap().routes[0]
        .keep_client_headers
        .is_empty());
    let errs = problems(&format!(
        "{MINIMAL}keep_client_headers = [\"x-mpg-user-id\", \"x-forwarded-for\"]\n"
    ));
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert!(
        errs[0].starts_with("routes[0].keep_client_headers[0]: \"x-mpg-user-id\" cannot be kept"),
        "{errs:?}"
    );
    assert!(
        errs[1].starts_with("routes[0].keep_client_headers[1]"),
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
    let text = include_str!("../../../config/production.toml");
    let errs = Settings::parse(text).err().unwrap_or_default();
    assert!(
        errs.iter().all(|p| p.path.starts_with("server.tls.")),
        "{errs:?}"
    );
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

#[test]
fn durations_of_several_parts_are_read_and_bad_ones_name_their_path() {
    let text = format!(
        "{MINIMAL}\n[store]\ncache_ttl = \"1h30m\"\n[rate_limit.policies.a]\nrequests = 1\nper = \"1m30s\"\n"
    );
    let s = Settings::parse(&text).unwrap();
    assert_eq!(s.store.cache_ttl, Duration::from_secs(5_400));
    assert_eq!(s.rate_limit.policies[0].quota.per, Duration::from_secs(90));
    let text = format!("{MINIMAL}\n[store]\ncache_ttl = \"1h 30m\"\n");
    let errs = problems(&text);
    assert!(
        errs.iter()
            .any(|e| e.starts_with("store.cache_ttl: invalid duration \"1h 30m\"")),
        "{errs:#?}"
    );
}

#[test]
fn every_bad_key_of_one_section_is_reported_in_one_run() {
    let text = format!(
        "{MINIMAL}\n[server.limits]\nidle_timeout = \"forever\"\nheader_read_timeout = \"soon\"\n\
         max_connections = \"many\"\n[rate_limit.policies.a]\nrequests = 1\nper = \"x\"\n\
         [auth.oidc]\nissuers = 1\nissuer = \"https://id.example\"\naudiences = [\"a\"]\n\
         algorithms = [\"HS256\"]\n"
    );
    let errs = problems(&text);
    for want in [
        "server.limits.idle_timeout: invalid duration \"forever\"",
        "server.limits.header_read_timeout: invalid duration \"soon\"",
        "server.limits.max_connections: invalid type",
        "rate_limit.policies.a.per: invalid duration \"x\"",
        "auth.oidc.issuers: unknown field",
        // Only an unknown key failed: the rest of the section is still checked.
        "auth.oidc.algorithms: \"HS256\" is refused",
    ] {
        assert!(
            errs.iter().any(|e| e.starts_with(want)),
            "missing {want:?} in {errs:#?}"
        );
    }
    // A required key that failed is not reported again as missing.
    assert!(
        !errs.iter().any(|e| e.contains("missing field")),
        "{errs:#?}"
    );
}
