//! Stage 1 of the pipeline: refuse every ambiguous request target, then
//! route by method and path as received (no decoding, case-sensitive).
//! Also the strict query parser used by stage 4.
mod query;
mod request_target;

pub use query::{decode_segment, find_secret_param, path_holds_secret, Query, QueryError};
pub use request_target::{check_head, check_request_target, named_host, RequestTargetError};

use http::header::HeaderValue;
use http::Method;
use std::collections::BTreeMap;

/// Why a route table cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// The same method and template twice.
    #[error("duplicate route {method} {template}")]
    Duplicate {
        /// Method.
        method: Method,
        /// Template.
        template: String,
    },
    /// Two templates the router cannot tell apart.
    #[error("conflicting routes: {0}")]
    Conflict(String),
}

/// Routes by method and template (`/api/v1/api-keys/{id}/revoke`; `{name}` = one segment).
pub struct Router<T> {
    paths: matchit::Router<PathEntry<T>>,
}

struct PathEntry<T> {
    methods: Vec<(Method, T)>,
    /// Precomputed `Allow` for 405 answers.
    allow: HeaderValue,
}

/// Collects routes, then builds a [`Router`].
pub struct RouterBuilder<T> {
    templates: BTreeMap<String, Vec<(Method, T)>>,
}

/// What a lookup found.
pub enum RouteMatch<'r, 'p, T> {
    /// A route for this method and path.
    Found {
        /// The value inserted for it.
        value: &'r T,
        /// Path parameters.
        params: Params<'r, 'p>,
    },
    /// The path has routes, but not for this method.
    MethodNotAllowed {
        /// Methods the path accepts.
        allow: &'r HeaderValue,
    },
    /// No route for the path.
    NotFound,
}

/// Path parameters of a match.
pub struct Params<'r, 'p>(matchit::Params<'r, 'p>);

impl<'r, 'p> Params<'r, 'p> {
    /// The segment matched by `{name}`, as received.
    pub fn get(&self, name: &str) -> Option<&'p str> {
        self.0.get(name)
    }
}

impl<T> Router<T> {
    /// A builder.
    pub fn builder() -> RouterBuilder<T> {
        RouterBuilder {
            templates: BTreeMap::new(),
        }
    }

    /// Looks up `method` and `path`; allocates nothing. `HEAD` finds the
    /// path's `GET` route unless it has a `HEAD` route of its own (RFC 9110
    /// §9.3.2: wherever GET is served, HEAD is served too).
    pub fn at<'r, 'p>(&'r self, method: &Method, path: &'p str) -> RouteMatch<'r, 'p, T> {
        match self.paths.at(path) {
            Ok(m) => match m.value.find(method) {
                Some(value) => RouteMatch::Found {
                    value,
                    params: Params(m.params),
                },
                None => RouteMatch::MethodNotAllowed {
                    allow: &m.value.allow,
                },
            },
            Err(_) => RouteMatch::NotFound,
        }
    }
}

impl<T> PathEntry<T> {
    /// The value for `method`: its own route, else for `HEAD` the `GET` one.
    fn find(&self, method: &Method) -> Option<&T> {
        let route = |m: &Method| self.methods.iter().find(|(mm, _)| mm == m);
        match route(method) {
            Some((_, value)) => Some(value),
            None if *method == Method::HEAD => route(&Method::GET).map(|(_, value)| value),
            None => None,
        }
    }
}

impl<T> RouterBuilder<T> {
    /// Adds a route.
    pub fn insert(
        &mut self,
        method: Method,
        template: &str,
        value: T,
    ) -> Result<&mut Self, RouteError> {
        let methods = self.templates.entry(template.to_string()).or_default();
        if methods.iter().any(|(m, _)| *m == method) {
            return Err(RouteError::Duplicate {
                method,
                template: template.to_string(),
            });
        }
        methods.push((method, value));
        Ok(self)
    }

    /// The router; fails when two templates overlap ambiguously.
    pub fn build(self) -> Result<Router<T>, RouteError> {
        let mut paths = matchit::Router::new();
        for (template, methods) in self.templates {
            // `HEAD` goes with `GET` (see `Router::at`).
            let implied_head = methods.iter().any(|(m, _)| *m == Method::GET)
                && !methods.iter().any(|(m, _)| *m == Method::HEAD);
            let allow = methods
                .iter()
                .flat_map(|(m, _)| {
                    let head = (*m == Method::GET && implied_head).then_some("HEAD");
                    std::iter::once(m.as_str()).chain(head)
                })
                .collect::<Vec<_>>()
                .join(", ");
            let allow =
                HeaderValue::from_str(&allow).map_err(|e| RouteError::Conflict(e.to_string()))?;
            paths
                .insert(template.clone(), PathEntry { methods, allow })
                .map_err(|e| RouteError::Conflict(format!("{template}: {e}")))?;
        }
        Ok(Router { paths })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router() -> Router<u8> {
        let mut b = Router::builder();
        b.insert(Method::GET, "/api/v1/clusters", 1).unwrap();
        b.insert(Method::POST, "/api/v1/clusters", 2).unwrap();
        b.insert(Method::GET, "/api/v1/api-keys/{id}", 3).unwrap();
        b.insert(Method::DELETE, "/api/v1/api-keys/{id}", 4)
            .unwrap();
        b.insert(Method::POST, "/api/v1/api-keys/{id}/revoke", 5)
            .unwrap();
        b.build().unwrap()
    }

    #[test]
    fn finds_routes_with_params() {
        let r = router();
        match r.at(&Method::GET, "/api/v1/api-keys/key_abc") {
            RouteMatch::Found { value, params } => {
                assert_eq!(*value, 3);
                assert_eq!(params.get("id"), Some("key_abc"));
            }
            _ => panic!("no match"),
        }
        assert!(matches!(
            r.at(&Method::POST, "/api/v1/api-keys/k/revoke"),
            RouteMatch::Found { value: 5, .. }
        ));
    }

    #[test]
    fn method_not_allowed_lists_the_methods_and_unknown_paths_are_not_found() {
        let r = router();
        match r.at(&Method::PUT, "/api/v1/clusters") {
            RouteMatch::MethodNotAllowed { allow } => assert_eq!(allow, "GET, HEAD, POST"),
            _ => panic!("expected 405"),
        }
        match r.at(&Method::HEAD, "/api/v1/api-keys/x/revoke") {
            RouteMatch::MethodNotAllowed { allow } => assert_eq!(allow, "POST"),
            _ => panic!("expected 405"),
        }
        for path in [
            "/api/v1/cluster",
            "/api/v1/clusters/x",
            "/API/v1/clusters",
            "/api/v1/api-keys/x/revoke/y",
            "/",
        ] {
            assert!(
                matches!(r.at(&Method::GET, path), RouteMatch::NotFound),
                "{path}"
            );
        }
    }

    #[test]
    fn head_is_served_by_the_get_route_unless_it_has_its_own() {
        let r = router();
        assert!(matches!(
            r.at(&Method::HEAD, "/api/v1/clusters"),
            RouteMatch::Found { value: 1, .. }
        ));
        match r.at(&Method::HEAD, "/api/v1/api-keys/key_abc") {
            RouteMatch::Found { value, params } => {
                assert_eq!(*value, 3);
                assert_eq!(params.get("id"), Some("key_abc"));
            }
            _ => panic!("HEAD did not find the GET route"),
        }
        // Only HEAD falls back, and only to GET.
        assert!(matches!(
            r.at(&Method::OPTIONS, "/api/v1/clusters"),
            RouteMatch::MethodNotAllowed { .. }
        ));
        let mut b = Router::builder();
        b.insert(Method::GET, "/a", 1).unwrap();
        b.insert(Method::HEAD, "/a", 2).unwrap();
        b.insert(Method::POST, "/b", 3).unwrap();
        let r = b.build().unwrap();
        assert!(matches!(
            r.at(&Method::HEAD, "/a"),
            RouteMatch::Found { value: 2, .. }
        ));
        match r.at(&Method::PUT, "/a") {
            RouteMatch::MethodNotAllowed { allow } => assert_eq!(allow, "GET, HEAD"),
            _ => panic!("expected 405"),
        }
        match r.at(&Method::HEAD, "/b") {
            RouteMatch::MethodNotAllowed { allow } => assert_eq!(allow, "POST"),
            _ => panic!("expected 405"),
        }
    }

    #[test]
    fn a_parameter_is_one_whole_nonempty_segment_and_braces_in_a_path_are_bytes() {
        let r = router();
        for path in [
            "/api/v1/api-keys/",
            "/api/v1/api-keys//revoke",
            "/api/v1/api-keys/a/b",
            "/api/v1/api-keys/a/revoke/",
        ] {
            assert!(
                matches!(r.at(&Method::GET, path), RouteMatch::NotFound),
                "{path}"
            );
        }
        // matchit 0.9 reads `{{` in a template as an escaped brace; in a
        // request path braces are plain bytes (templates never hold them:
        // config/routes.rs refuses any but a whole `{name}` segment).
        match r.at(&Method::GET, "/api/v1/api-keys/{id}") {
            RouteMatch::Found { params, .. } => assert_eq!(params.get("id"), Some("{id}")),
            _ => panic!("no match"),
        }
    }

    #[test]
    fn duplicates_and_conflicts_are_refused() {
        let mut b = Router::builder();
        b.insert(Method::GET, "/a/{id}", 1).unwrap();
        assert!(matches!(
            b.insert(Method::GET, "/a/{id}", 2),
            Err(RouteError::Duplicate { .. })
        ));
        b.insert(Method::GET, "/a/{other}", 3).unwrap();
        assert!(matches!(b.build(), Err(RouteError::Conflict(_))));
    }
}
