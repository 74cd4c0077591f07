//! Raw TOML → [`Settings`], collecting every problem with its TOML path: splits
//! the file into sections, has each validated on its own, then checks what
//! crosses sections (upstreams and policies named by routes, scopes named by roles).
use std::collections::{BTreeMap, BTreeSet, HashSet};

use super::log_filter::log_filter;
use super::oidc::oidc_settings;
use super::problems::Problems;
use super::rate_limit::rate_limit_settings;
use super::raw::*;
use super::roles::{default_roles, roles_settings};
use super::routes::{route_settings, RouteTargets};
use super::server::{admin_settings, server_settings};
use super::signing::Env;
use super::store::store_settings;
use super::tracing::{tracing_settings, RawTracing};
use super::*;

const SECTIONS: [&str; 10] = [
    "server",
    "admin",
    "log",
    "tracing",
    "store",
    "auth",
    "rate_limit",
    "roles",
    "upstreams",
    "routes",
];

/// `tls_files`: whether the server's certificate and key files must exist,
/// and the upstreams' signing keys be set in the environment. Neither is so
/// for the admin commands, which act on the store only and may run on an
/// operator's machine that holds neither: they read a stand-in key, which
/// nothing of theirs uses.
pub(super) fn validate(text: &str, tls_files: bool) -> Result<Settings, Vec<Problem>> {
    if !tls_files {
        return validate_with_env(text, false, &|_| Some("unused by admin commands".into()));
    }
    validate_with_env(text, true, &|name| std::env::var_os(name))
}

/// [`validate`], reading the environment variables the file names (the
/// upstreams' signing keys) through `env`. Each step adds its problems in
/// turn, so they are listed in this order: sections that fail to parse, then
/// each section's own checks, then what crosses sections.
pub(super) fn validate_with_env(
    text: &str,
    tls_files: bool,
    env: Env<'_>,
) -> Result<Settings, Vec<Problem>> {
    let mut table = parse_toml(text)?;
    let mut p = Problems::default();
    unknown_sections(&mut p, &table);
    let raw = RawSections::take(&mut p, &mut table);

    let server = server_settings(&mut p, raw.server, tls_files);
    let admin = admin_settings(&mut p, raw.admin, tls_files);
    let log = log_settings(&mut p, raw.log);
    let tracing = tracing_settings(&mut p, raw.tracing);
    let store = store_settings(&mut p, raw.store);
    let auth = AuthSettings {
        oidc: raw.auth.oidc.and_then(|raw| oidc_settings(&mut p, raw)),
    };
    let rate_limit = rate_limit_settings(&mut p, raw.rate_limit);

    // Routes first: their scopes are part of what roles may name.
    let upstreams = upstreams_settings(&mut p, raw.upstreams, env);
    // Scopes routes name, read before each route is checked: a route that
    // fails to parse still names its scope, which roles may then grant.
    let route_scopes = route_scopes(&raw.routes);
    let raw_routes = parse_routes(&mut p, raw.routes);

    let raw_roles = raw.roles.unwrap_or_else(default_roles);
    let mut known_scopes: BTreeSet<String> = BUILTIN_SCOPES.iter().map(|s| s.to_string()).collect();
    known_scopes.extend(route_scopes);
    let granted: HashSet<&str> = raw_roles.values().flatten().map(String::as_str).collect();
    let roles = roles_settings(&mut p, &raw_roles, &known_scopes);

    let named = RouteTargets {
        upstreams: &upstreams,
        policies: &rate_limit.policies,
        granted: &granted,
    };
    let routes = routes_settings(&mut p, raw_routes, &named);

    if p.len() == 0 {
        Ok(Settings {
            server,
            admin,
            log,
            tracing,
            store,
            auth,
            rate_limit,
            roles,
            upstreams,
            routes,
            known_scopes,
        })
    } else {
        Err(p.finish())
    }
}

/// The file as a TOML table, or its one syntax problem.
fn parse_toml(text: &str) -> Result<toml::Table, Vec<Problem>> {
    text.parse().map_err(|e: toml::de::Error| {
        // Multi-line on purpose: the line, its text and a caret under the column.
        let message = e.to_string().trim_end().to_string();
        vec![Problem {
            path: String::new(),
            message,
        }]
    })
}

/// Checks that every top-level key is one of [`SECTIONS`].
fn unknown_sections(p: &mut Problems, table: &toml::Table) {
    for key in table.keys() {
        if !SECTIONS.contains(&key.as_str()) {
            p.add(
                key.clone(),
                format!("unknown section; expected one of {}", SECTIONS.join(", ")),
            );
        }
    }
}

/// Each section of the file, deserialized on its own (defaults for those
/// absent or failing); upstreams and routes are kept as values, to be read
/// one entry at a time.
struct RawSections {
    server: RawServer,
    admin: RawAdmin,
    log: RawLog,
    tracing: RawTracing,
    store: RawStore,
    auth: RawAuth,
    rate_limit: RawRateLimit,
    roles: Option<BTreeMap<String, Vec<String>>>,
    upstreams: BTreeMap<String, toml::Value>,
    routes: Vec<toml::Value>,
}

impl RawSections {
    /// Takes the sections out of `table`, in file-format order.
    fn take(p: &mut Problems, table: &mut toml::Table) -> RawSections {
        RawSections {
            server: p.section(table, "server"),
            admin: p.section(table, "admin"),
            log: p.section(table, "log"),
            tracing: p.section(table, "tracing"),
            store: p.section(table, "store"),
            auth: p.section(table, "auth"),
            rate_limit: p.section(table, "rate_limit"),
            roles: table.remove("roles").and_then(|v| p.de("roles", v)),
            upstreams: table
                .remove("upstreams")
                .and_then(|v| p.de("upstreams", v))
                .unwrap_or_default(),
            routes: table
                .remove("routes")
                .and_then(|v| p.de("routes", v))
                .unwrap_or_default(),
        }
    }
}

/// `[log]`: checks the level filter and the summary interval.
fn log_settings(p: &mut Problems, log: RawLog) -> LogSettings {
    if let Err(e) = log_filter(&log.level) {
        p.add(
            "log.level",
            format!("invalid level or filter {:?}: {e}", log.level),
        );
    }
    p.positive("log.summary_interval", log.summary_interval);
    LogSettings {
        level: log.level,
        format: log.format,
        summary_interval: log.summary_interval,
    }
}

/// `[upstreams.NAME]`: at least one, each checked on its own; one that
/// parses but is invalid is recorded as refused.
fn upstreams_settings(
    p: &mut Problems,
    raw_upstreams: BTreeMap<String, toml::Value>,
    env: Env<'_>,
) -> BTreeMap<String, UpstreamSettings> {
    let mut upstreams = BTreeMap::new();
    if raw_upstreams.is_empty() {
        p.add("upstreams", "at least one [upstreams.NAME] is required");
    }
    for (name, value) in raw_upstreams {
        let path = format!("upstreams.{name}");
        if let Some(raw) = p.de::<RawUpstream>(&path, value) {
            match super::upstream::upstream_settings(p, &path, raw, env) {
                Some(u) => {
                    upstreams.insert(name, u);
                }
                None => p.refuse(path),
            }
        }
    }
    upstreams
}

/// The scope each `[[routes]]` entry names, whether or not the entry parses.
fn route_scopes(raw_routes: &[toml::Value]) -> Vec<String> {
    raw_routes
        .iter()
        .filter_map(|v| v.get("scope")?.as_str().map(str::to_string))
        .collect()
}

/// Deserializes each `[[routes]]` entry, paired with its TOML path; checks
/// that there is at least one, unless the routes failed to parse.
fn parse_routes(p: &mut Problems, raw_routes: Vec<toml::Value>) -> Vec<(String, RawRoute)> {
    let raw_routes: Vec<(String, RawRoute)> = raw_routes
        .into_iter()
        .enumerate()
        .filter_map(|(i, v)| {
            let path = format!("routes[{i}]");
            p.de::<RawRoute>(&path, v).map(|r| (path, r))
        })
        .collect();
    if raw_routes.is_empty() && !p.failed.iter().any(|f| f.starts_with("routes")) {
        p.add("routes", "at least one [[routes]] entry is required");
    }
    raw_routes
}

/// Checks each route, and that no two share a method and path.
fn routes_settings(
    p: &mut Problems,
    raw_routes: Vec<(String, RawRoute)>,
    named: &RouteTargets<'_>,
) -> Vec<RouteSettings> {
    let mut routes = Vec::with_capacity(raw_routes.len());
    let mut seen = HashSet::new();
    for (path, raw) in raw_routes {
        if let Some(route) = route_settings(p, &path, raw, named) {
            if !seen.insert((route.method.clone(), route.path.clone())) {
                p.add(
                    &path,
                    format!("duplicate route {} {}", route.method, route.path),
                );
            }
            routes.push(route);
        }
    }
    routes
}
