//! Validation of the `[[routes]]` entries: method, path template, the
//! organization source (and what the built-in key service requires of it),
//! scope, upstream and rate-limit policy, each problem named by its TOML path.
use http::Method;
use std::collections::{BTreeMap, HashSet};

use super::problems::Problems;
use super::raw::*;
use super::*;

/// The key service trusts the organization stage 5 authorized: for a key
/// named by id it must be that key's own (else revoke, rotate or delete would reach
/// any organization's key), for the collection the one the request names.
fn key_service_organization(p: &mut Problems, path: &str, op: Operation, organization: &OrgSource) {
    let fits = match op {
        Operation::Get | Operation::Revoke | Operation::Rotate | Operation::Delete => {
            matches!(organization, OrgSource::Key(name) if name == "id")
        }
        Operation::Create | Operation::List | Operation::AuditList => {
            matches!(organization, OrgSource::Query(_) | OrgSource::Path(_))
        }
    };
    if !fits {
        let want = match op {
            Operation::Get | Operation::Revoke | Operation::Rotate | Operation::Delete => {
                "must be \"key:id\" (the organization of the key the path names)"
            }
            Operation::Create | Operation::List | Operation::AuditList => {
                "must name the organization the request is for (\"query:NAME\" or \"path:NAME\")"
            }
        };
        p.add(
            format!("{path}.organization"),
            format!("{want} on a route of the built-in api-keys service"),
        );
    }
}

/// `{name}` parameters of a route template, or why the template is invalid.
fn template_params(template: &str) -> Result<Vec<&str>, String> {
    let Some(rest) = template.strip_prefix('/') else {
        return Err("must start with /".into());
    };
    if template == "/" {
        return Ok(Vec::new());
    }
    let mut params = Vec::new();
    for seg in rest.split('/') {
        if seg.is_empty() || seg == "." || seg == ".." {
            return Err(format!("empty, . or .. segment in {template:?}"));
        }
        if let Some(name) = seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
            let ok = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if !ok {
                return Err(format!(
                    "invalid parameter {seg:?}: use {{name}} with a-z, 0-9 and _"
                ));
            }
            if params.contains(&name) {
                return Err(format!("parameter {{{name}}} appears twice"));
            }
            params.push(name);
        } else if !seg
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~:@!$&'()*+,;=".contains(&b))
        {
            return Err(format!(
                "segment {seg:?} has characters a request path cannot match as received"
            ));
        }
    }
    Ok(params)
}

pub(super) fn route_settings(
    p: &mut Problems,
    path: &str,
    raw: RawRoute,
    upstreams: &BTreeMap<String, UpstreamSettings>,
    policies: &[PolicySettings],
    granted: &HashSet<&str>,
) -> Option<RouteSettings> {
    let before = p.len();
    let method = match Method::from_bytes(raw.method.as_bytes()) {
        Ok(m) if raw.method.bytes().all(|b| b.is_ascii_uppercase()) => Some(m),
        _ => {
            p.add(
                format!("{path}.method"),
                format!(
                    "invalid method {:?}: use an upper-case HTTP method such as GET",
                    raw.method
                ),
            );
            None
        }
    };
    let params = match template_params(&raw.path) {
        Ok(params) => params,
        Err(e) => {
            p.add(format!("{path}.path"), e);
            Vec::new()
        }
    };
    let before_organization = p.len();
    let organization = match raw.organization.as_deref().unwrap_or("none") {
        "none" => OrgSource::None,
        other => match other.split_once(':') {
            Some(("query", name)) if !name.is_empty() => OrgSource::Query(name.to_string()),
            Some((kind @ ("path" | "key"), name)) if params.contains(&name) => {
                if kind == "path" {
                    OrgSource::Path(name.into())
                } else {
                    OrgSource::Key(name.into())
                }
            }
            Some(("path" | "key", name)) => {
                p.add(
                    format!("{path}.organization"),
                    format!("the path has no {{{name}}} parameter"),
                );
                OrgSource::None
            }
            _ => {
                p.add(
                    format!("{path}.organization"),
                    format!("invalid value {other:?}: expected \"query:NAME\", \"path:NAME\", \"key:NAME\" or \"none\""),
                );
                OrgSource::None
            }
        },
    };
    match raw.auth {
        AuthMode::None => {
            if raw.scope.is_some() {
                p.add(
                    format!("{path}.scope"),
                    "a scope needs auth = \"api_key\" or \"session\"",
                );
            }
            if organization != OrgSource::None {
                p.add(
                    format!("{path}.organization"),
                    "an organization check needs auth = \"api_key\" or \"session\"",
                );
            }
        }
        AuthMode::Session if raw.scope.is_some() && organization == OrgSource::None => {
            p.add(
                format!("{path}.organization"),
                "a session route with a scope needs an organization (query:, path: or key:) to find the user's role",
            );
        }
        _ => {}
    }
    if let Some(scope) = &raw.scope {
        // Scopes travel space-separated (stored, and in `X-Mpg-Scopes`): one
        // holding a space would read as two there, and no key could hold it.
        if scope.is_empty() || !scope.bytes().all(|b| b.is_ascii_graphic()) || scope == "*" {
            p.add(
                format!("{path}.scope"),
                format!("invalid scope {scope:?}: use printable ASCII without spaces, e.g. \"clusters:read\""),
            );
        } else if !BUILTIN_SCOPES.contains(&scope.as_str())
            && !granted.contains(scope.as_str())
            && !p.invalid("roles", "roles")
        {
            p.add(
                format!("{path}.scope"),
                format!(
                    "scope {scope:?} is granted by no role and is not a built-in scope (typo?)"
                ),
            );
        }
    }
    // A reference to an entry that is present but invalid is not a second
    // problem; the route is still refused.
    let mut dangling = false;
    match upstreams.get(&raw.upstream) {
        None if p.invalid("upstreams", &format!("upstreams.{}", raw.upstream)) => dangling = true,
        None => {
            let names: Vec<&str> = upstreams.keys().map(String::as_str).collect();
            p.add(
                format!("{path}.upstream"),
                format!(
                    "unknown upstream {:?}; defined: {}",
                    raw.upstream,
                    names.join(", ")
                ),
            );
        }
        Some(UpstreamSettings::Builtin(BuiltinService::ApiKeys)) => {
            if let Some(m) = &method {
                match Operation::for_route(m, &raw.path) {
                    None => p.add(
                        path,
                        format!(
                            "{m} {} is not an endpoint of the built-in api-keys service",
                            raw.path
                        ),
                    ),
                    // Already named if the value itself is invalid.
                    Some(_) if p.len() > before_organization => {}
                    Some(op) => key_service_organization(p, path, op, &organization),
                }
            }
        }
        Some(UpstreamSettings::Http(_)) => {}
    }
    let rate_limit = match raw.rate_limit.as_deref() {
        Some("none") => None,
        Some(name) => match policies.iter().position(|x| x.name == name) {
            Some(i) => Some(i),
            None if p.invalid("rate_limit", &format!("rate_limit.policies.{name}")) => {
                dangling = true;
                None
            }
            None => {
                p.add(
                    format!("{path}.rate_limit"),
                    format!("unknown policy {name:?} (use \"none\" for no limit)"),
                );
                None
            }
        },
        None => policies.iter().position(|x| x.name == "default"),
    };
    let keep_client_headers = keep_client_headers(p, path, &raw.keep_client_headers);
    if p.len() > before || dangling {
        return None;
    }
    Some(RouteSettings {
        method: method?,
        path: raw.path,
        auth: raw.auth,
        scope: raw.scope,
        organization,
        upstream: raw.upstream,
        rate_limit,
        keep_client_headers,
    })
}

/// `keep_client_headers`: names from the list of fields some stacks trust,
/// which the gateway otherwise removes. Identity, `X-Forwarded-*` and the
/// other fields the gateway writes or always removes cannot be kept.
fn keep_client_headers(p: &mut Problems, path: &str, names: &[String]) -> Vec<http::HeaderName> {
    let mut kept = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let lower = name.to_ascii_lowercase();
        match crate::http::fields::STACK_TRUSTED_FIELDS.contains(&lower.as_str()) {
            true => kept.push(http::HeaderName::from_bytes(lower.as_bytes()).ok()),
            false => {
                p.add(
                    format!("{path}.keep_client_headers[{i}]"),
                    format!(
                        "{name:?} cannot be kept: only these client fields, removed by default, may be: {}",
                        crate::http::fields::STACK_TRUSTED_FIELDS.join(", ")
                    ),
                );
            }
        }
    }
    kept.into_iter().flatten().collect()
}
