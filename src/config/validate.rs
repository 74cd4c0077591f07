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
use super::routes::route_settings;
use super::server::{admin_settings, server_settings};
use super::signing::Env;
use super::store::store_settings;
use super::*;

const SECTIONS: [&str; 9] = [
    "server",
    "admin",
    "log",
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
/// upstreams' signing keys) through `env`.
pub(super) fn validate_with_env(
    text: &str,
    tls_files: bool,
    env: Env<'_>,
) -> Result<Settings, Vec<Problem>> {
    let mut table: toml::Table = match text.parse() {
        Ok(t) => t,
        Err(e) => {
            // Multi-line on purpose: the line, its text and a caret under the column.
            let message = e.to_string().trim_end().to_string();
            return Err(vec![Problem {
                path: String::new(),
                message,
            }]);
        }
    };
    let mut p = Problems::default();
    for key in table.keys() {
        if !SECTIONS.contains(&key.as_str()) {
            p.add(
                key.clone(),
                format!("unknown section; expected one of {}", SECTIONS.join(", ")),
            );
        }
    }
    let server: RawServer = p.section(&mut table, "server");
    let admin: RawAdmin = p.section(&mut table, "admin");
    let log: RawLog = p.section(&mut table, "log");
    let store: RawStore = p.section(&mut table, "store");
    let auth: RawAuth = p.section(&mut table, "auth");
    let rate_limit: RawRateLimit = p.section(&mut table, "rate_limit");
    let raw_roles: Option<BTreeMap<String, Vec<String>>> =
        table.remove("roles").and_then(|v| p.de("roles", v));
    let raw_upstreams: BTreeMap<String, toml::Value> = table
        .remove("upstreams")
        .and_then(|v| p.de("upstreams", v))
        .unwrap_or_default();
    let raw_routes: Vec<toml::Value> = table
        .remove("routes")
        .and_then(|v| p.de("routes", v))
        .unwrap_or_default();

    let server = server_settings(&mut p, server, tls_files);
    let admin = admin_settings(&mut p, admin, tls_files);
    if let Err(e) = log_filter(&log.level) {
        p.add(
            "log.level",
            format!("invalid level or filter {:?}: {e}", log.level),
        );
    }
    p.positive("log.summary_interval", log.summary_interval);
    let log = LogSettings {
        level: log.level,
        format: log.format,
        summary_interval: log.summary_interval,
    };
    let store = store_settings(&mut p, store);
    let auth = AuthSettings {
        oidc: auth.oidc.and_then(|raw| oidc_settings(&mut p, raw)),
    };
    let rate_limit = rate_limit_settings(&mut p, rate_limit);

    // Routes first: their scopes are part of what roles may name.
    let mut upstreams = BTreeMap::new();
    if raw_upstreams.is_empty() {
        p.add("upstreams", "at least one [upstreams.NAME] is required");
    }
    for (name, value) in raw_upstreams {
        let path = format!("upstreams.{name}");
        if let Some(raw) = p.de::<RawUpstream>(&path, value) {
            match super::upstream::upstream_settings(&mut p, &path, raw, env) {
                Some(u) => {
                    upstreams.insert(name, u);
                }
                None => p.refuse(path),
            }
        }
    }
    // Scopes routes name, read before each route is checked: a route that
    // fails to parse still names its scope, which roles may then grant.
    let route_scopes: Vec<String> = raw_routes
        .iter()
        .filter_map(|v| v.get("scope")?.as_str().map(str::to_string))
        .collect();
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

    let raw_roles = raw_roles.unwrap_or_else(default_roles);
    let mut known_scopes: BTreeSet<String> = BUILTIN_SCOPES.iter().map(|s| s.to_string()).collect();
    known_scopes.extend(route_scopes);
    let granted: HashSet<&str> = raw_roles.values().flatten().map(String::as_str).collect();
    let roles = roles_settings(&mut p, &raw_roles, &known_scopes);

    let mut routes = Vec::with_capacity(raw_routes.len());
    let mut seen = HashSet::new();
    for (path, raw) in raw_routes {
        if let Some(route) = route_settings(
            &mut p,
            &path,
            raw,
            &upstreams,
            &rate_limit.policies,
            &granted,
        ) {
            if !seen.insert((route.method.clone(), route.path.clone())) {
                p.add(
                    &path,
                    format!("duplicate route {} {}", route.method, route.path),
                );
            }
            routes.push(route);
        }
    }

    if p.len() == 0 {
        Ok(Settings {
            server,
            admin,
            log,
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
