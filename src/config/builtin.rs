//! The services the gateway serves itself, and which endpoint of the key
//! service a configured route is.
use http::Method;

/// Services the gateway serves itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuiltinService {
    /// The `/api-keys` endpoints.
    ApiKeys,
}

/// The eight endpoints of the key service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// `POST …/api-keys`
    Create,
    /// `GET …/api-keys`
    List,
    /// `GET …/api-keys/{id}`
    Get,
    /// `POST …/api-keys/{id}/revoke`
    Revoke,
    /// `POST …/api-keys/{id}/rotate`
    Rotate,
    /// `DELETE …/api-keys/{id}`
    Delete,
    /// `PATCH …/api-keys/{id}`
    Update,
    /// `GET …/audit-events`
    AuditList,
}

impl Operation {
    /// Which endpoint a configured route is, judged by its method and template
    /// (`None`: the route is no endpoint of this service).
    pub fn for_route(method: &Method, template: &str) -> Option<Operation> {
        let m = method.as_str();
        if template.ends_with("/api-keys") {
            return match m {
                "POST" => Some(Operation::Create),
                "GET" => Some(Operation::List),
                _ => None,
            };
        }
        if template.ends_with("/audit-events") {
            return (m == "GET").then_some(Operation::AuditList);
        }
        if template.ends_with("/api-keys/{id}/revoke") {
            return (m == "POST").then_some(Operation::Revoke);
        }
        if template.ends_with("/api-keys/{id}/rotate") {
            return (m == "POST").then_some(Operation::Rotate);
        }
        if template.ends_with("/api-keys/{id}") {
            return match m {
                "GET" => Some(Operation::Get),
                "DELETE" => Some(Operation::Delete),
                "PATCH" => Some(Operation::Update),
                _ => None,
            };
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_map_to_operations() {
        let op = |m: Method, p: &str| Operation::for_route(&m, p);
        assert_eq!(
            op(Method::POST, "/api/v1/api-keys"),
            Some(Operation::Create)
        );
        assert_eq!(op(Method::GET, "/api/v1/api-keys"), Some(Operation::List));
        assert_eq!(
            op(Method::GET, "/api/v1/api-keys/{id}"),
            Some(Operation::Get)
        );
        assert_eq!(
            op(Method::DELETE, "/api/v1/api-keys/{id}"),
            Some(Operation::Delete)
        );
        assert_eq!(
            op(Method::PATCH, "/api/v1/api-keys/{id}"),
            Some(Operation::Update)
        );
        assert_eq!(
            op(Method::POST, "/api/v1/api-keys/{id}/revoke"),
            Some(Operation::Revoke)
        );
        assert_eq!(
            op(Method::POST, "/api/v1/api-keys/{id}/rotate"),
            Some(Operation::Rotate)
        );
        assert_eq!(
            op(Method::GET, "/api/v1/audit-events"),
            Some(Operation::AuditList)
        );
        assert_eq!(op(Method::POST, "/api/v1/audit-events"), None);
        assert_eq!(op(Method::PUT, "/api/v1/api-keys/{id}"), None);
        assert_eq!(op(Method::GET, "/api/v1/clusters"), None);
    }
}
