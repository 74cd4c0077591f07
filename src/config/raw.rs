//! The configuration file exactly as TOML spells it: serde structs with
//! `deny_unknown_fields` and a default for every key but `upstreams` and
//! `routes`. Nothing here is checked beyond types; `super::validate` turns
//! it into `Settings`.
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

use super::duration::serde_str;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawServer {
    pub(crate) listen: Option<String>,
    pub(crate) insecure_http: bool,
    pub(crate) workers: usize,
    pub(crate) tls: Option<RawTls>,
    pub(crate) limits: RawLimits,
    pub(crate) proxy_protocol: bool,
    pub(crate) client_ip: RawClientIp,
    #[serde(with = "serde_str")]
    pub(crate) shutdown_delay: Duration,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawClientIp {
    pub(crate) trusted_proxies: Vec<String>,
    pub(crate) header: String,
}

impl Default for RawClientIp {
    fn default() -> Self {
        Self {
            trusted_proxies: Vec::new(),
            header: "x-forwarded-for".into(),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawTls {
    pub(crate) cert: Option<String>,
    pub(crate) key: Option<String>,
    pub(crate) self_signed: bool,
    pub(crate) key_exchange: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawLimits {
    pub(crate) max_header_bytes: usize,
    pub(crate) max_body_bytes: u64,
    #[serde(with = "serde_str")]
    pub(crate) header_read_timeout: Duration,
    #[serde(with = "serde_str")]
    pub(crate) idle_timeout: Duration,
    pub(crate) max_connections: usize,
    #[serde(with = "serde_str")]
    pub(crate) shutdown_grace: Duration,
}

impl Default for RawLimits {
    fn default() -> Self {
        Self {
            max_header_bytes: 16_384,
            max_body_bytes: 1_048_576,
            header_read_timeout: secs(10),
            idle_timeout: secs(60),
            max_connections: 10_000,
            shutdown_grace: secs(30),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawAdmin {
    pub(crate) listen: String,
    pub(crate) enabled: bool,
    pub(crate) allowed_hosts: Vec<String>,
    pub(crate) tls: Option<RawAdminTls>,
}

/// `[admin.tls]`: the admin listener's certificate.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAdminTls {
    pub(crate) cert: Option<String>,
    pub(crate) key: Option<String>,
}

impl Default for RawAdmin {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:9901".into(),
            enabled: true,
            allowed_hosts: Vec::new(),
            tls: None,
        }
    }
}

/// `[log] format`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawLog {
    pub(crate) level: String,
    pub(crate) format: LogFormat,
    #[serde(with = "serde_str")]
    pub(crate) summary_interval: Duration,
}

impl Default for RawLog {
    fn default() -> Self {
        Self {
            level: "info".into(),
            format: LogFormat::Text,
            summary_interval: secs(10),
        }
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum StoreKind {
    #[default]
    Sqlite,
    Postgres,
}

/// `[auth]`: ways to sign in besides the store's own credentials.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawAuth {
    pub(crate) oidc: Option<RawOidc>,
}

/// `[auth.oidc]`: JWTs of an identity provider, verified against its JWKS.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawOidc {
    pub(crate) issuer: Option<String>,
    pub(crate) audiences: Vec<String>,
    pub(crate) jwks_url: Option<String>,
    pub(crate) ca_file: Option<String>,
    pub(crate) user_claim: String,
    pub(crate) algorithms: Vec<String>,
    #[serde(with = "serde_str")]
    pub(crate) leeway: Duration,
    #[serde(with = "serde_str")]
    pub(crate) jwks_refresh: Duration,
    pub(crate) provision_users: bool,
}

impl Default for RawOidc {
    fn default() -> Self {
        Self {
            issuer: None,
            audiences: Vec::new(),
            jwks_url: None,
            ca_file: None,
            user_claim: "sub".into(),
            algorithms: vec!["RS256".into(), "ES256".into(), "EdDSA".into()],
            leeway: secs(60),
            jwks_refresh: secs(600),
            provision_users: false,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawStore {
    pub(crate) kind: StoreKind,
    pub(crate) path: Option<String>,
    pub(crate) url: Option<String>,
    #[serde(with = "serde_str")]
    pub(crate) cache_ttl: Duration,
    #[serde(with = "serde_str")]
    pub(crate) negative_cache_ttl: Duration,
    pub(crate) cache_capacity: u64,
    pub(crate) negative_cache_capacity: u64,
    #[serde(with = "serde_str")]
    pub(crate) stale_if_error: Duration,
    #[serde(with = "serde_str")]
    pub(crate) query_timeout: Duration,
    #[serde(with = "serde_str")]
    pub(crate) audit_retention: Duration,
    pub(crate) wait_at_start: bool,
}

impl Default for RawStore {
    fn default() -> Self {
        Self {
            kind: StoreKind::Sqlite,
            path: None,
            url: None,
            cache_ttl: secs(30),
            negative_cache_ttl: secs(5),
            cache_capacity: 1_000_000,
            negative_cache_capacity: 100_000,
            stale_if_error: secs(60),
            query_timeout: secs(2),
            audit_retention: secs(90 * 24 * 60 * 60),
            wait_at_start: true,
        }
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawBackend {
    #[default]
    Local,
    Redis,
}

/// `[rate_limit] on_backend_error`: what to do while Redis does not answer.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendErrorPolicy {
    /// Fall back to a per-instance local limiter.
    #[default]
    Local,
    /// Refuse with 429.
    Deny,
    /// Let the request through unlimited.
    Allow,
}

/// `[rate_limit.policies.NAME] key`: what one bucket is keyed by.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKey {
    /// The API key id, or the session's user id.
    #[default]
    Credential,
    /// The organization the request is for.
    Organization,
    /// The client's IP address.
    ClientIp,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPolicy {
    pub(crate) requests: u32,
    #[serde(with = "serde_str")]
    pub(crate) per: Duration,
    #[serde(default)]
    pub(crate) key: PolicyKey,
    #[serde(default)]
    pub(crate) mode: PolicyMode,
}

/// `[rate_limit.policies.NAME] mode`: whether the policy refuses.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyMode {
    /// Over the limit: 429.
    #[default]
    Enforce,
    /// Counted and answered with the same headers, never refused: each
    /// request it would have refused is counted and marked in the access log.
    Shadow,
}

/// `[rate_limit.auth_failures]`: each key defaults on its own.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawQuota {
    pub(crate) requests: u32,
    #[serde(with = "serde_str")]
    pub(crate) per: Duration,
}

impl Default for RawQuota {
    fn default() -> Self {
        Self {
            requests: 20,
            per: secs(60),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawRateLimit {
    pub(crate) backend: RawBackend,
    pub(crate) redis_url: Option<String>,
    pub(crate) redis_prefix: String,
    #[serde(with = "serde_str")]
    pub(crate) redis_timeout: Duration,
    pub(crate) on_backend_error: BackendErrorPolicy,
    pub(crate) ietf_headers: bool,
    pub(crate) policies: Option<BTreeMap<String, toml::Value>>,
    pub(crate) auth_failures: RawQuota,
    pub(crate) redis_ca_file: Option<String>,
}

impl Default for RawRateLimit {
    fn default() -> Self {
        Self {
            backend: RawBackend::Local,
            redis_url: None,
            redis_prefix: "mpg:".into(),
            redis_timeout: Duration::from_millis(50),
            on_backend_error: BackendErrorPolicy::Local,
            ietf_headers: false,
            policies: None,
            auth_failures: RawQuota::default(),
            redis_ca_file: None,
        }
    }
}

/// `[upstreams.NAME] balance`: how a target is picked among the healthy ones.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Balance {
    /// Each target in turn.
    #[default]
    RoundRobin,
    /// The target with the fewest requests in flight (ties taken in turn).
    LeastOutstanding,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawUpstream {
    pub(crate) targets: Option<Vec<String>>,
    pub(crate) builtin: Option<String>,
    #[serde(default, with = "opt_duration")]
    pub(crate) connect_timeout: Option<Duration>,
    #[serde(default, with = "opt_duration")]
    pub(crate) request_timeout: Option<Duration>,
    #[serde(default, with = "opt_duration")]
    pub(crate) timeout: Option<Duration>,
    pub(crate) balance: Option<Balance>,
    pub(crate) retries: Option<u32>,
    pub(crate) max_connections_per_target: Option<usize>,
    #[serde(default, with = "opt_duration")]
    pub(crate) idle_timeout: Option<Duration>,
    pub(crate) max_fails: Option<u32>,
    #[serde(default, with = "opt_duration")]
    pub(crate) fail_timeout: Option<Duration>,
    pub(crate) health_path: Option<String>,
    #[serde(default, with = "opt_duration")]
    pub(crate) health_interval: Option<Duration>,
    pub(crate) ca_file: Option<String>,
    pub(crate) client_cert: Option<String>,
    pub(crate) client_key: Option<String>,
    pub(crate) http2: Option<bool>,
    pub(crate) sign_identity_key_env: Option<String>,
    pub(crate) sign_identity_previous_key_env: Option<String>,
    pub(crate) sign_content_digest: Option<bool>,
    pub(crate) forward_key_meta: Option<bool>,
}

impl RawUpstream {
    /// Names of the keys that only make sense with `targets` (for builtin upstreams).
    pub(crate) fn forwarding_keys(&self) -> Vec<&'static str> {
        let set = [
            ("connect_timeout", self.connect_timeout.is_some()),
            ("request_timeout", self.request_timeout.is_some()),
            ("timeout", self.timeout.is_some()),
            ("balance", self.balance.is_some()),
            ("retries", self.retries.is_some()),
            (
                "max_connections_per_target",
                self.max_connections_per_target.is_some(),
            ),
            ("idle_timeout", self.idle_timeout.is_some()),
            ("max_fails", self.max_fails.is_some()),
            ("fail_timeout", self.fail_timeout.is_some()),
            ("health_path", self.health_path.is_some()),
            ("health_interval", self.health_interval.is_some()),
            ("ca_file", self.ca_file.is_some()),
            ("client_cert", self.client_cert.is_some()),
            ("client_key", self.client_key.is_some()),
            ("http2", self.http2.is_some()),
            (
                "sign_identity_key_env",
                self.sign_identity_key_env.is_some(),
            ),
            (
                "sign_identity_previous_key_env",
                self.sign_identity_previous_key_env.is_some(),
            ),
            ("sign_content_digest", self.sign_content_digest.is_some()),
            ("forward_key_meta", self.forward_key_meta.is_some()),
        ];
        set.iter().filter(|(_, s)| *s).map(|(k, _)| *k).collect()
    }
}

/// `[[routes]] auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthMode {
    /// `Authorization: Bearer mpg_…`
    ApiKey,
    /// `Authorization: Bearer <session token>`
    Session,
    /// No authentication (and so no identity headers).
    None,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRoute {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) auth: AuthMode,
    pub(crate) scope: Option<String>,
    #[serde(default)]
    pub(crate) organization: Option<String>,
    pub(crate) upstream: String,
    pub(crate) rate_limit: Option<String>,
    #[serde(default)]
    pub(crate) keep_client_headers: Vec<String>,
    pub(crate) cost: Option<i64>,
}

mod opt_duration {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        let text = String::deserialize(d)?;
        crate::config::duration::parse_duration(&text)
            .map(Some)
            .map_err(serde::de::Error::custom)
    }
}
