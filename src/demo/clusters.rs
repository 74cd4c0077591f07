//! The demo's clusters service: an in-memory stand-in for the upstream the
//! gateway fronts. It creates, lists, gets, updates and deletes the clusters
//! of the organization the gateway vouches for in `X-Mpg-Organization-Id`.
//! A created or updated cluster is busy ("provisioning", "updating") for a
//! while, and a change to a busy cluster is a 409 with `Retry-After`; bad
//! input is a 400 naming the field. Errors use the gateway's own JSON body.
use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, LOCATION, RETRY_AFTER};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use rand::RngExt;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cli::rfc3339;
use crate::clock::unix_now;
use crate::error::GatewayError;
use crate::http_core::body::{self, Body, Limited, RequestBody};
use crate::http_core::service::{ConnInfo, Handler, Reply};

mod input;

use input::{json_object, name, one_of};

/// The collection's path; a cluster is `{COLLECTION}/{id}`.
const COLLECTION: &str = "/api/v1/clusters";
const ENGINES: &[&str] = &["postgres-15", "postgres-16", "postgres-17"];
const PLANS: &[&str] = &["small", "medium", "large"];
/// Bounds on what one client on the loopback can make the demo hold.
const MAX_BODY_BYTES: u64 = 64 * 1024;
const MAX_CLUSTERS: usize = 1000;

/// The service: every organization's clusters, in creation order.
pub struct DemoClusters {
    clusters: Mutex<Vec<Cluster>>,
    busy_for: Duration,
}

/// One cluster, as the service keeps it.
#[derive(Debug, Clone)]
struct Cluster {
    id: String,
    organization_id: String,
    name: String,
    engine: String,
    plan: String,
    /// What the cluster is doing until `busy_until` ("provisioning",
    /// "updating"); "running" after it.
    change: &'static str,
    busy_until: Instant,
    created_at: i64,
    updated_at: i64,
}

impl Cluster {
    fn status(&self, now: Instant) -> &'static str {
        if now < self.busy_until {
            self.change
        } else {
            "running"
        }
    }

    fn to_json(&self, now: Instant) -> Value {
        json!({
            "id": self.id,
            "organization_id": self.organization_id,
            "name": self.name,
            "engine": self.engine,
            "plan": self.plan,
            "status": self.status(now),
            "created_at": rfc3339(self.created_at),
            "updated_at": rfc3339(self.updated_at),
        })
    }
}

/// Why a request is refused: one of the gateway's errors, or a busy cluster
/// (a 409 that also says when to retry).
enum Refusal {
    Error(GatewayError),
    Busy { message: String, retry_after: u64 },
}

impl From<GatewayError> for Refusal {
    fn from(e: GatewayError) -> Self {
        Refusal::Error(e)
    }
}

impl Refusal {
    fn into_response(self) -> Response<Body> {
        match self {
            Refusal::Error(e) => e.into_response(),
            Refusal::Busy {
                message,
                retry_after,
            } => {
                let mut res = GatewayError::Conflict(message).into_response();
                res.headers_mut()
                    .insert(RETRY_AFTER, HeaderValue::from(retry_after));
                res
            }
        }
    }
}

impl Handler for DemoClusters {
    type Stamp = ();

    async fn handle(&self, req: Request<RequestBody>, _conn: Arc<ConnInfo>) -> Reply {
        let (head, body) = req.into_parts();
        let res = match Limited::new(body, MAX_BODY_BYTES).collect().await {
            Ok(bytes) => self.answer(
                &head.method,
                head.uri.path(),
                &head.headers,
                &bytes.to_bytes(),
                Instant::now(),
            ),
            Err(_) => {
                GatewayError::bad_field("body", "cannot be read (at most 64 KiB)").into_response()
            }
        };
        res.into()
    }
}

impl DemoClusters {
    /// The service with two running clusters of `organization`.
    pub fn seeded(organization: &str, busy_for: Duration) -> Self {
        let now = Instant::now();
        let t = unix_now();
        let cluster = |id: &str, name: &str| Cluster {
            id: id.into(),
            organization_id: organization.into(),
            name: name.into(),
            engine: "postgres-16".into(),
            plan: "small".into(),
            change: "provisioning",
            busy_until: now,
            created_at: t,
            updated_at: t,
        };
        DemoClusters {
            clusters: Mutex::new(vec![
                cluster("cl_demo_primary", "primary"),
                cluster("cl_demo_analytics", "analytics"),
            ]),
            busy_for,
        }
    }

    /// Answers one request at `now`. The organization is the one the gateway
    /// put in `X-Mpg-Organization-Id`.
    pub fn answer(
        &self,
        method: &Method,
        path: &str,
        headers: &HeaderMap,
        body: &Bytes,
        now: Instant,
    ) -> Response<Body> {
        let org = headers
            .get("x-mpg-organization-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        self.route(method, path, org, body, now)
            .unwrap_or_else(Refusal::into_response)
    }

    fn route(
        &self,
        method: &Method,
        path: &str,
        org: &str,
        body: &[u8],
        now: Instant,
    ) -> Result<Response<Body>, Refusal> {
        let id = match path.strip_prefix(COLLECTION) {
            Some("") => None,
            Some(rest) => match rest.strip_prefix('/') {
                Some(id) if !id.is_empty() && !id.contains('/') => Some(id),
                _ => return Err(GatewayError::NotFound.into()),
            },
            None => return Err(GatewayError::NotFound.into()),
        };
        if org.is_empty() {
            return Err(GatewayError::bad_field("organization_id", "is required").into());
        }
        match (id, method) {
            (None, &Method::GET | &Method::HEAD) => Ok(self.list(org, now)),
            (None, &Method::POST) => self.create(org, body, now),
            (Some(id), &Method::GET | &Method::HEAD) => self.get(org, id, now),
            (Some(id), &Method::PATCH) => self.update(org, id, body, now),
            (Some(id), &Method::DELETE) => self.delete(org, id, now),
            (None, _) => Err(not_allowed("GET, HEAD, POST")),
            (Some(_), _) => Err(not_allowed("GET, HEAD, PATCH, DELETE")),
        }
    }

    fn list(&self, org: &str, now: Instant) -> Response<Body> {
        let clusters = self.clusters.lock().unwrap_or_else(|e| e.into_inner());
        let data: Vec<Value> = clusters
            .iter()
            .filter(|c| c.organization_id == org)
            .map(|c| c.to_json(now))
            .collect();
        json_response(StatusCode::OK, &json!({ "data": data }))
    }

    fn get(&self, org: &str, id: &str, now: Instant) -> Result<Response<Body>, Refusal> {
        let clusters = self.clusters.lock().unwrap_or_else(|e| e.into_inner());
        let c = clusters
            .iter()
            .find(|c| c.id == id && c.organization_id == org)
            .ok_or(GatewayError::NotFound)?;
        Ok(json_response(StatusCode::OK, &c.to_json(now)))
    }

    fn create(&self, org: &str, body: &[u8], now: Instant) -> Result<Response<Body>, Refusal> {
        let input = json_object(body, &["name", "engine", "plan"])?;
        let name = name(input.get("name"))?
            .ok_or_else(|| GatewayError::bad_field("name", "is required"))?;
        let engine = one_of("engine", input.get("engine"), ENGINES)?.unwrap_or("postgres-16");
        let plan = one_of("plan", input.get("plan"), PLANS)?.unwrap_or("small");
        let t = unix_now();
        let cluster = Cluster {
            id: new_id(),
            organization_id: org.into(),
            name,
            engine: engine.into(),
            plan: plan.into(),
            change: "provisioning",
            busy_until: now + self.busy_for,
            created_at: t,
            updated_at: t,
        };
        let mut clusters = self.clusters.lock().unwrap_or_else(|e| e.into_inner());
        if clusters.len() >= MAX_CLUSTERS {
            return Err(GatewayError::Conflict(format!(
                "the demo holds at most {MAX_CLUSTERS} clusters; delete one first"
            ))
            .into());
        }
        let mut res = json_response(StatusCode::CREATED, &cluster.to_json(now));
        if let Ok(location) = HeaderValue::from_str(&format!("{COLLECTION}/{}", cluster.id)) {
            res.headers_mut().insert(LOCATION, location);
        }
        clusters.push(cluster);
        Ok(res)
    }

    fn update(
        &self,
        org: &str,
        id: &str,
        body: &[u8],
        now: Instant,
    ) -> Result<Response<Body>, Refusal> {
        let input = json_object(body, &["name", "plan", "engine"])?;
        if input.contains_key("engine") {
            return Err(GatewayError::bad_field("engine", "cannot be changed").into());
        }
        let name = name(input.get("name"))?;
        let plan = one_of("plan", input.get("plan"), PLANS)?;
        if name.is_none() && plan.is_none() {
            return Err(GatewayError::bad_field("body", "must set name or plan").into());
        }
        let mut clusters = self.clusters.lock().unwrap_or_else(|e| e.into_inner());
        let c = clusters
            .iter_mut()
            .find(|c| c.id == id && c.organization_id == org)
            .ok_or(GatewayError::NotFound)?;
        settled(c, now)?;
        if let Some(name) = name {
            c.name = name;
        }
        if let Some(plan) = plan {
            c.plan = plan.into();
        }
        c.change = "updating";
        c.busy_until = now + self.busy_for;
        c.updated_at = unix_now();
        Ok(json_response(StatusCode::OK, &c.to_json(now)))
    }

    fn delete(&self, org: &str, id: &str, now: Instant) -> Result<Response<Body>, Refusal> {
        let mut clusters = self.clusters.lock().unwrap_or_else(|e| e.into_inner());
        let at = clusters
            .iter()
            .position(|c| c.id == id && c.organization_id == org)
            .ok_or(GatewayError::NotFound)?;
        settled(&clusters[at], now)?;
        clusters.remove(at);
        let mut res = Response::new(body::empty());
        *res.status_mut() = StatusCode::NO_CONTENT;
        Ok(res)
    }
}

/// A cluster may change only when it is not already changing: else a 409
/// saying, in whole seconds rounded up, when it will be done.
fn settled(c: &Cluster, now: Instant) -> Result<(), Refusal> {
    let Some(left) = c
        .busy_until
        .checked_duration_since(now)
        .filter(|d| !d.is_zero())
    else {
        return Ok(());
    };
    let retry_after = (left.as_secs() + u64::from(left.subsec_nanos() > 0)).max(1);
    Err(Refusal::Busy {
        message: format!(
            "cluster {} is {}; retry after {retry_after} s",
            c.id, c.change
        ),
        retry_after,
    })
}

fn not_allowed(allow: &'static str) -> Refusal {
    GatewayError::MethodNotAllowed {
        allow: HeaderValue::from_static(allow),
    }
    .into()
}

/// `cl_` and 16 random lower-case letters and digits.
fn new_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    let tail: String = (0..16)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect();
    format!("cl_{tail}")
}

fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    let mut text = value.to_string();
    // One line per answer, ending in a newline, so that curl's output reads well.
    text.push('\n');
    let mut res = Response::new(body::full(text));
    *res.status_mut() = status;
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    res
}

#[cfg(test)]
mod tests;
