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
        Operation::Get
        | Operation::Revoke
        | Operation::Rotate
        | Operation::Delete
        | Operation::Update => {
            matches!(organization, OrgSource::Key(name) if name == "id")
        }
        Operation::Create | Operation::List | Operation::AuditList => {
            matches!(organization, OrgSource::Query(_) | OrgSource::Path(_))
        }
    };
    if !fits {
        let want = match op {
            Operation::Get
            | Operation::Revoke
            | Operation::Rotate
            | Operation::Delete
            | Operation::Update => {
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

/// What a route may name that is defined elsewhere in the file.
pub(super) struct RouteTargets<'a> {
    /// The upstreams that are valid.
    pub(super) upstreams: &'a BTreeMap<String, UpstreamSettings>,
    /// The rate-limit policies that are valid.
    pub(super) policies: &'a [PolicySettings],
    /// Every scope some role grants.
    pub(super) granted: &'a HashSet<&'a str>,
}

/// What a route's `upstream` or `rate_limit` names.
enum Reference<T> {
    /// Defined and valid.
    Found(T),
    /// Defined nowhere: the problem is listed.
    Unknown,
    /// Present but invalid: not a second problem, but the route is still refused.
    Dangling,
}

/// Checks one `[[routes]]` entry field by field, each problem at `path.FIELD`.
pub(super) fn route_settings(
    p: &mut Problems,
    path: &str,
    raw: RawRoute,
    named: &RouteTargets<'_>,
) -> Option<RouteSettings> {
    let before = p.len();
    let method = route_method(p, path, &raw.method);
    let params = match template_params(&raw.path) {
        Ok(params) => params,
        Err(e) => {
            p.add(format!("{path}.path"), e);
            Vec::new()
        }
    };
    let before_organization = p.len();
    let organization = organization(p, path, raw.organization.as_deref(), &params);
    auth_requirements(p, path, &raw, &organization);
    if let Some(scope) = &raw.scope {
        check_scope(p, path, scope, named.granted);
    }
    let upstream = upstream_reference(p, path, &raw.upstream, named.upstreams);
    if let (Reference::Found(UpstreamSettings::Builtin(BuiltinService::ApiKeys)), Some(m)) =
        (&upstream, &method)
    {
        if let Some(op) = key_service_operation(p, path, m, &raw.path) {
            // Already named if the value itself is invalid.
            if p.len() == before_organization {
                key_service_organization(p, path, op, &organization);
            }
        }
    }
    let rate_limit = policy_reference(p, path, raw.rate_limit.as_deref(), named.policies);
    let keep_client_headers = keep_client_headers(p, path, &raw.keep_client_headers);
    let (Reference::Found(_), Reference::Found(rate_limit)) = (upstream, rate_limit) else {
        return None;
    };
    if p.len() > before {
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

/// `method`: an upper-case HTTP method.
fn route_method(p: &mut Problems, path: &str, method: &str) -> Option<Method> {
    match Method::from_bytes(method.as_bytes()) {
        Ok(m) if method.bytes().all(|b| b.is_ascii_uppercase()) => Some(m),
        _ => {
            p.add(
                format!("{path}.method"),
                format!("invalid method {method:?}: use an upper-case HTTP method such as GET"),
            );
            None
        }
    }
}

/// `organization`: `none` (the default), `query:NAME`, or `path:NAME` and
/// `key:NAME` naming a parameter of the path template.
fn organization(p: &mut Problems, path: &str, value: Option<&str>, params: &[&str]) -> OrgSource {
    let other = match value.unwrap_or("none") {
        "none" => return OrgSource::None,
        other => other,
    };
    match other.split_once(':') {
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
    }
}

/// Checks that the scope and organization check fit the `auth` mode: both
/// need a credential, and a session's role is found by its organization.
fn auth_requirements(p: &mut Problems, path: &str, raw: &RawRoute, organization: &OrgSource) {
    match raw.auth {
        AuthMode::None => {
            if raw.scope.is_some() {
                p.add(
                    format!("{path}.scope"),
                    "a scope needs auth = \"api_key\" or \"session\"",
                );
            }
            if *organization != OrgSource::None {
                p.add(
                    format!("{path}.organization"),
                    "an organization check needs auth = \"api_key\" or \"session\"",
                );
            }
        }
        AuthMode::Session if raw.scope.is_some() && *organization == OrgSource::None => {
            p.add(
                format!("{path}.organization"),
                "a session route with a scope needs an organization (query:, path: or key:) to find the user's role",
            );
        }
        _ => {}
    }
}

/// `scope`: printable ASCII without spaces, and built in or granted by some
/// role (unless the roles failed to parse).
fn check_scope(p: &mut Problems, path: &str, scope: &str, granted: &HashSet<&str>) {
    // Scopes travel space-separated (stored, and in `X-Mpg-Scopes`): one
    // holding a space would read as two there, and no key could hold it.
    if scope.is_empty() || !scope.bytes().all(|b| b.is_ascii_graphic()) || scope == "*" {
        p.add(
            format!("{path}.scope"),
            format!("invalid scope {scope:?}: use printable ASCII without spaces, e.g. \"clusters:read\""),
        );
    } else if !BUILTIN_SCOPES.contains(&scope)
        && !granted.contains(scope)
        && !p.invalid("roles", "roles")
    {
        p.add(
            format!("{path}.scope"),
            format!("scope {scope:?} is granted by no role and is not a built-in scope (typo?)"),
        );
    }
}

/// `upstream`: the name of a valid `[upstreams.NAME]`.
fn upstream_reference<'u>(
    p: &mut Problems,
    path: &str,
    name: &str,
    upstreams: &'u BTreeMap<String, UpstreamSettings>,
) -> Reference<&'u UpstreamSettings> {
    match upstreams.get(name) {
        Some(upstream) => Reference::Found(upstream),
        None if p.invalid("upstreams", &format!("upstreams.{name}")) => Reference::Dangling,
        None => {
            let names: Vec<&str> = upstreams.keys().map(String::as_str).collect();
            p.add(
                format!("{path}.upstream"),
                format!("unknown upstream {name:?}; defined: {}", names.join(", ")),
            );
            Reference::Unknown
        }
    }
}

/// The operation of the built-in api-keys service a route serves, if its
/// method and template are one of the service's endpoints.
fn key_service_operation(
    p: &mut Problems,
    path: &str,
    method: &Method,
    template: &str,
) -> Option<Operation> {
    let op = Operation::for_route(method, template);
    if op.is_none() {
        p.add(
            path,
            format!("{method} {template} is not an endpoint of the built-in api-keys service"),
        );
    }
    op
}

/// `rate_limit`: `"none"`, the name of a valid policy, or absent for the
/// policy named `default` (if there is one). Found holds the policy's index.
fn policy_reference(
    p: &mut Problems,
    path: &str,
    name: Option<&str>,
    policies: &[PolicySettings],
) -> Reference<Option<usize>> {
    let name = match name {
        Some("none") => return Reference::Found(None),
        Some(name) => name,
        None => return Reference::Found(policies.iter().position(|x| x.name == "default")),
    };
    match policies.iter().position(|x| x.name == name) {
        Some(i) => Reference::Found(Some(i)),
        None if p.invalid("rate_limit", &format!("rate_limit.policies.{name}")) => {
            Reference::Dangling
        }
        None => {
            p.add(
                format!("{path}.rate_limit"),
                format!("unknown policy {name:?} (use \"none\" for no limit)"),
            );
            Reference::Unknown
        }
    }
}

/// `keep_client_headers`: names from the list of fields some stacks trust,
/// which the gateway otherwise removes. Identity, `X-Forwarded-*` and the
/// other fields the gateway writes or always removes cannot be kept.
fn keep_client_headers(p: &mut Problems, path: &str, names: &[String]) -> Vec<http::HeaderName> {
    let mut kept = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let lower = name.to_ascii_lowercase();
        match crate::http_core::fields::STACK_TRUSTED_FIELDS.contains(&lower.as_str()) {
            true => kept.push(http::HeaderName::from_bytes(lower.as_bytes()).ok()),
            false => {
                p.add(
                    format!("{path}.keep_client_headers[{i}]"),
                    format!(
                        "{name:?} cannot be kept: only these client fields, removed by default, may be: {}",
                        crate::http_core::fields::STACK_TRUSTED_FIELDS.join(", ")
                    ),
                );
            }
        }
    }
    kept.into_iter().flatten().collect()
}
