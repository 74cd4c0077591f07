//! The validated settings: one type per section of the file, as `run`
//! and the admin commands use them once the file has passed every check.
use http::{Method, Uri};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use super::*;

/// The validated, frozen configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `[server]`
    pub server: ServerSettings,
    /// `[admin]`
    pub admin: AdminSettings,
    /// `[log]`
    pub log: LogSettings,
    /// `[tracing]`
    pub tracing: TracingSettings,
    /// `[store]`
    pub store: StoreSettings,
    /// `[auth]`
    pub auth: AuthSettings,
    /// `[rate_limit]`
    pub rate_limit: RateLimitSettings,
    /// `[roles]`
    pub roles: Roles,
    /// `[upstreams.NAME]`, by name.
    pub upstreams: BTreeMap<String, UpstreamSettings>,
    /// `[[routes]]`, in file order.
    pub routes: Vec<RouteSettings>,
    /// Every scope a key may be created with: the built-in ones, route scopes and role permissions.
    pub known_scopes: BTreeSet<String>,
}

/// `[server]`
#[derive(Debug, Clone, PartialEq)]
pub struct ServerSettings {
    /// Address the gateway listens on.
    pub listen: SocketAddr,
    /// `None` = plain HTTP (`insecure_http = true`).
    pub tls: Option<TlsSettings>,
    /// `[server.tls] key_exchange`: the groups offered, in order of preference.
    pub key_exchange: Vec<crate::tls::KeyExchange>,
    /// Tokio worker threads; 0 = one per core.
    pub workers: usize,
    /// `[server.limits]`
    pub limits: Limits,
    /// Every connection begins with a PROXY protocol (v1 or v2) header from
    /// a trusted proxy, whose source address is the client's.
    pub proxy_protocol: bool,
    /// `[server.client_ip]`
    pub client_ip: ClientIpSettings,
    /// On a stop signal, how long `/readyz` says 503 while the listeners
    /// still accept and serve, before the drain (a balancer's pre-stop window).
    pub shutdown_delay: Duration,
}

/// `[server.client_ip]`: which proxies may say who the client is, and in
/// which field.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientIpSettings {
    /// Connections from these networks may name the client; empty: none may.
    pub trusted_proxies: TrustedProxies,
    /// The field a trusted proxy names the client in (`X-Forwarded-For` syntax).
    pub header: http::HeaderName,
}

/// Where the server certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsSettings {
    /// PEM files on disk.
    Files {
        /// Certificate chain.
        cert: PathBuf,
        /// Private key.
        key: PathBuf,
    },
    /// A localhost certificate generated in memory (development only).
    SelfSigned,
}

/// `[server.limits]`
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Total request header bytes; over it: 431.
    pub max_header_bytes: usize,
    /// Request body bytes; over it: 413.
    pub max_body_bytes: u64,
    /// A client must finish sending headers within this.
    pub header_read_timeout: Duration,
    /// Idle keep-alive connections are closed after this.
    pub idle_timeout: Duration,
    /// Open client connections at most.
    pub max_connections: usize,
    /// How long in-flight requests may run after a stop signal.
    pub shutdown_grace: Duration,
}

/// `[admin]`
#[derive(Debug, Clone, PartialEq)]
pub struct AdminSettings {
    /// `None` when `enabled = false`.
    pub listen: Option<SocketAddr>,
    /// Host names, lower-case, the admin listener answers for besides
    /// `localhost` and IP addresses that reach it.
    pub allowed_hosts: Vec<String>,
    /// `[admin.tls]`: the listener serves TLS with these PEM files.
    pub tls: Option<TlsSettings>,
}

impl AdminSettings {
    /// A warning when the admin listener, which serves the admin API, is
    /// reachable from other hosts without TLS: admin tokens would cross the
    /// network in clear.
    pub fn exposure_warning(&self) -> Option<String> {
        let listen = self.listen?;
        (self.tls.is_none() && !listen.ip().is_loopback()).then(|| {
            format!(
                "admin.listen = \"{listen}\" is not a loopback address and [admin.tls] is not set: \
                 admin tokens would cross the network in clear"
            )
        })
    }
}

/// `[log]`
#[derive(Debug, Clone, PartialEq)]
pub struct LogSettings {
    /// A tracing filter, e.g. `info` or `mpg_gateway=debug,info`.
    pub level: String,
    /// Text or JSON lines.
    pub format: LogFormat,
    /// A failure repeated on every request (an upstream down, the store or
    /// the Redis limiter failing) is logged once, then counted in one line
    /// per this interval while it goes on.
    pub summary_interval: Duration,
}

/// `[auth]`
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AuthSettings {
    /// `[auth.oidc]`: `None` = no JWTs are taken.
    pub oidc: Option<OidcSettings>,
}

/// `[auth.oidc]`: an identity provider whose JWTs act as session tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct OidcSettings {
    /// `iss` must equal it.
    pub issuer: String,
    /// `aud` must hold one of them.
    pub audiences: Vec<String>,
    /// Where the key set is; `None` = discovered from
    /// `{issuer}/.well-known/openid-configuration`.
    pub jwks_url: Option<String>,
    /// CA certificates for the key set's (and discovery's) HTTPS; `None` =
    /// the system's roots.
    pub ca_file: Option<PathBuf>,
    /// The claim that names `users.id`.
    pub user_claim: String,
    /// The signature algorithms taken (asymmetric only).
    pub algorithms: Vec<jsonwebtoken::Algorithm>,
    /// Allowance for clock skew on `exp`, `nbf` and `iat`.
    pub leeway: Duration,
    /// How often the key set is fetched again.
    pub jwks_refresh: Duration,
    /// A valid token of a user the store does not know creates the user.
    pub provision_users: bool,
}

/// `[store]`
#[derive(Debug, Clone, PartialEq)]
pub struct StoreSettings {
    /// `sqlite://PATH?mode=rwc` or the `postgres://` url as written.
    pub url: String,
    /// The url with any password replaced, for logs.
    pub display: String,
    /// Positive cache entries live this long.
    pub cache_ttl: Duration,
    /// Unknown keys and tokens are remembered this long.
    pub negative_cache_ttl: Duration,
    /// Positive cache entries at most, per tier (API keys, sessions).
    pub cache_capacity: u64,
    /// "Not found" cache entries at most, per tier, apart from `cache_capacity`.
    pub negative_cache_capacity: u64,
    /// Cached valid entries are still served this long while the store is down.
    pub stale_if_error: Duration,
    /// Every store query gives up after this.
    pub query_timeout: Duration,
    /// Key lifecycle audit events are deleted once older than this.
    pub audit_retention: Duration,
    /// A store that cannot be reached at start: serve 503 and retry until
    /// it answers (`true`), or exit (`false`).
    pub wait_at_start: bool,
}

/// `[rate_limit]`
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimitSettings {
    /// `None` = in-process limiter; `Some` = shared Redis limiter.
    pub redis: Option<RedisSettings>,
    /// What to do while Redis is unreachable.
    pub on_backend_error: BackendErrorPolicy,
    /// Also emit the IETF draft `RateLimit` / `RateLimit-Policy` fields.
    pub ietf_headers: bool,
    /// Named policies; routes refer to them by index.
    pub policies: Vec<PolicySettings>,
    /// Per client IP: 401s allowed before answering 429 without a lookup.
    pub auth_failures: QuotaSettings,
}

/// The Redis limiter backend.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisSettings {
    /// `redis://…`, `rediss://…` (TLS), `redis+cluster://h:p,h:p` or
    /// `rediss+cluster://…` (may hold a password: never log it).
    pub url: String,
    /// Prefix for every key the gateway writes.
    pub prefix: String,
    /// Per-decision timeout.
    pub timeout: Duration,
    /// With TLS: trust only the CA certificates of this PEM file.
    pub ca_file: Option<PathBuf>,
}

/// A bucket: `requests` capacity, refilled entirely every `per`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaSettings {
    /// Capacity.
    pub requests: NonZeroU32,
    /// Time to refill the whole bucket.
    pub per: Duration,
}

/// `[rate_limit.policies.NAME]`
#[derive(Debug, Clone, PartialEq)]
pub struct PolicySettings {
    /// The table name.
    pub name: String,
    /// The bucket.
    pub quota: QuotaSettings,
    /// What a bucket is keyed by.
    pub key: PolicyKey,
    /// Enforce, or only count what it would refuse.
    pub mode: PolicyMode,
}

/// Role → permissions.
#[derive(Debug, Clone, Default)]
pub struct Roles {
    pub(super) map: foldhash::HashMap<String, Permissions>,
}

/// What one role may do.
#[derive(Debug, Clone)]
pub enum Permissions {
    /// `"*"`
    All,
    /// An explicit list.
    Only(Vec<String>),
}

impl Roles {
    /// Whether `role` grants `scope` (an unknown role grants nothing).
    pub fn allows(&self, role: &str, scope: &str) -> bool {
        match self.map.get(role) {
            Some(Permissions::All) => true,
            Some(Permissions::Only(list)) => list.iter().any(|p| p == scope),
            None => false,
        }
    }

    /// The permissions of `role`, if it exists.
    pub fn permissions(&self, role: &str) -> Option<&Permissions> {
        self.map.get(role)
    }

    /// Whether the role exists.
    pub fn contains(&self, role: &str) -> bool {
        self.map.contains_key(role)
    }

    /// Role names, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.map.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }
}

/// `[upstreams.NAME]`
#[derive(Debug, Clone)]
pub enum UpstreamSettings {
    /// Forward over HTTP(S).
    Http(Box<HttpUpstreamSettings>),
    /// Served in-process.
    Builtin(BuiltinService),
}

/// `[upstreams.NAME]` with `targets`: how requests are forwarded there.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpUpstreamSettings {
    /// One or more `http://` or `https://` base URIs.
    pub targets: Vec<Uri>,
    /// How a target is picked among the healthy ones.
    pub balance: Balance,
    /// TCP connect and TLS handshake must finish within this (else a connect error: 502).
    pub connect_timeout: Duration,
    /// No response headers within this: 504.
    pub request_timeout: Duration,
    /// The whole exchange, response body included; `None` = no limit.
    pub timeout: Option<Duration>,
    /// Extra attempts on other targets after a connect failure (idempotent methods only).
    pub retries: u32,
    /// Requests in flight to one target at most (= connections for HTTP/1.1).
    pub max_connections_per_target: usize,
    /// Idle pooled connections are closed after this.
    pub idle_timeout: Duration,
    /// Consecutive failures that eject a target; 0 = never eject.
    pub max_fails: u32,
    /// How long an ejected target is left alone.
    pub fail_timeout: Duration,
    /// Active check: `GET` this path on every target each `health_interval`.
    pub health_path: Option<String>,
    /// Period of the active check.
    pub health_interval: Duration,
    /// Trust only these CA certificates (PEM) for `https://` targets, not the system's.
    pub ca_file: Option<PathBuf>,
    /// Client certificate chain and key (PEM) presented to `https://` targets.
    pub client_identity: Option<(PathBuf, PathBuf)>,
    /// Talk HTTP/2 to the targets (prior knowledge on `http://`, ALPN `h2` on `https://`).
    pub http2: bool,
    /// Sign the identity headers sent to the targets (`X-Mpg-Signature`).
    pub sign_identity: Option<SigningKeys>,
    /// With `sign_identity`: send a request's body with its `Content-Digest`
    /// (SHA-256), inside the signature (`sign_content_digest`, default on).
    pub sign_content_digest: bool,
    /// Send a key's `meta` as `X-Mpg-Key-Meta` (base64url JSON, signed).
    pub forward_key_meta: bool,
}

/// Where a route finds the organization a request is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrgSource {
    /// The credential's own organization (API keys), or none at all.
    None,
    /// A query parameter, e.g. `organization_id`.
    Query(String),
    /// A path parameter.
    Path(String),
    /// The organization of the API key whose id is this path parameter.
    Key(String),
}

/// `[[routes]]`
#[derive(Debug, Clone)]
pub struct RouteSettings {
    /// Exact method.
    pub method: Method,
    /// Template, `{name}` for one segment.
    pub path: String,
    /// Which credential the route takes.
    pub auth: AuthMode,
    /// Permission required, if any.
    pub scope: Option<String>,
    /// Where the organization comes from.
    pub organization: OrgSource,
    /// Name of an `[upstreams.NAME]`.
    pub upstream: String,
    /// Index into `rate_limit.policies`; `None` = not limited.
    pub rate_limit: Option<usize>,
    /// Client fields of [`STACK_TRUSTED_FIELDS`](crate::http_core::fields::STACK_TRUSTED_FIELDS)
    /// this route passes on instead of removing.
    pub keep_client_headers: Vec<http::HeaderName>,
    /// Credits a request spends, for a key that has credits (default 1).
    pub cost: u64,
}
