//! An upstream: its targets with their health and pools, the transport
//! that reaches them (a pooled HTTP/1.1 connection of the gateway's own
//! client, or hyper-util's client for h2 targets; HTTPS through rustls),
//! and the tasks that run beside the requests (the active checker, the
//! idle-connection reaper). How a request goes through it is `forward`.
//!
//! An upstream is built once per configuration: a reload that leaves its
//! `[upstreams.NAME]` table and TLS files as they were keeps it running
//! ([`Upstream::serves`]), with its targets' health, pools and checker.
use http::uri::{Authority, PathAndQuery, Scheme};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::task::AbortOnDropHandle;

use super::balance::Balancer;
pub use super::error::UpstreamError;
use super::health::{active_check, Targets};
use super::signature::IdentitySigner;
use super::tls_client::{connector, files_digest};
use super::transport::{Connector, Transport};
use crate::config::HttpUpstreamSettings;
use crate::metrics::names;

/// A named upstream: its targets, their health, and the connection pool.
pub struct Upstream {
    pub(super) name: String,
    /// What it was built from, to tell whether a reload changed it.
    settings: HttpUpstreamSettings,
    /// The contents of its TLS files when it was built (see [`files_digest`]).
    tls_files: Option<[u8; 32]>,
    pub(super) targets: Arc<Targets>,
    pub(super) balancer: Balancer,
    pub(super) transport: Arc<Transport>,
    pub(super) connect_timeout: Duration,
    pub(super) request_timeout: Duration,
    pub(super) timeout: Option<Duration>,
    pub(super) retries: u32,
    pub(super) retry_counter: metrics::Counter,
    /// Signs the identity headers (`sign_identity_key_env`), if asked to.
    signer: Option<IdentitySigner>,
    /// The active checker and the idle-connection reaper.
    _tasks: Vec<AbortOnDropHandle<()>>,
}

// === impl Upstream ===

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let labels: Vec<&str> = self.targets.list.iter().map(|t| t.label.as_str()).collect();
        f.debug_struct("Upstream")
            .field("name", &self.name)
            .field("targets", &labels)
            .finish()
    }
}

impl Upstream {
    /// Builds the pool for `cfg` (and starts its active checker, if any).
    pub fn new(name: &str, cfg: &HttpUpstreamSettings) -> Result<Self, UpstreamError> {
        let targets = target_parts(cfg)?;
        // Before the connector reads them: a file replaced in between makes
        // the next reload rebuild, never keep a stale connector.
        let tls_files = files_digest(cfg);
        let targets = Arc::new(Targets::new(
            name,
            targets,
            cfg.max_connections_per_target,
            cfg.max_fails,
            cfg.fail_timeout,
            cfg.idle_timeout,
        ));
        let connector = connector(cfg).map_err(UpstreamError::Config)?;
        let signer = signer(cfg)?;
        let transport = Arc::new(transport(cfg, connector));
        let tasks = spawn_tasks(cfg, &targets, &transport)?;
        Ok(Upstream {
            name: name.to_string(),
            settings: cfg.clone(),
            tls_files,
            retry_counter: metrics::counter!(names::UPSTREAM_RETRIES, "upstream" => name.to_string()),
            targets,
            balancer: Balancer::new(cfg.balance),
            transport,
            connect_timeout: cfg.connect_timeout,
            request_timeout: cfg.request_timeout,
            timeout: cfg.timeout,
            retries: cfg.retries,
            signer,
            _tasks: tasks,
        })
    }

    /// Its targets' state now, for the console.
    pub fn targets(&self) -> Vec<super::health::TargetView> {
        self.targets.view()
    }

    /// The upstream's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What signs the identity headers sent here, when the upstream asks
    /// for `X-Mpg-Signature`.
    pub fn signer(&self) -> Option<&IdentitySigner> {
        self.signer.as_ref()
    }

    /// Whether this upstream is what `cfg` would build: the same settings,
    /// and the same contents in its CA and client certificate files (which
    /// a build reads). A reload keeps such an upstream running, its health
    /// state, pooled connections and active checker with it.
    pub(crate) fn serves(&self, cfg: &HttpUpstreamSettings) -> bool {
        self.settings == *cfg && self.tls_files.is_some() && files_digest(cfg) == self.tls_files
    }

    /// Makes its targets' `mpg_upstream_target_up` show their state: it is
    /// the upstream serving. Idempotent.
    pub(crate) fn publish(&self) {
        self.targets.publish();
    }

    /// A reload replaced or removed it: its active checker stops, and the
    /// requests still in flight on it no longer move the target gauges
    /// (its replacement's do). Call before publishing the replacement.
    pub(crate) fn retire(&self) {
        self.targets.retire();
    }
}

/// The targets of `cfg`, each as its scheme, authority and label (its URI
/// without a trailing `/`); an error for one without a scheme and host, or
/// for none at all.
fn target_parts(
    cfg: &HttpUpstreamSettings,
) -> Result<Vec<(Scheme, Authority, String)>, UpstreamError> {
    let mut targets = Vec::with_capacity(cfg.targets.len());
    for t in &cfg.targets {
        let parts = t.clone().into_parts();
        match (parts.scheme, parts.authority) {
            (Some(s), Some(a)) => {
                targets.push((s, a, t.to_string().trim_end_matches('/').to_string()))
            }
            _ => {
                return Err(UpstreamError::Config(format!(
                    "target {t} needs a scheme and host"
                )))
            }
        }
    }
    if targets.is_empty() {
        return Err(UpstreamError::Config("no targets".into()));
    }
    Ok(targets)
}

/// What signs the identity headers, when `sign_identity_key_env` asks.
fn signer(cfg: &HttpUpstreamSettings) -> Result<Option<IdentitySigner>, UpstreamError> {
    Ok(match &cfg.sign_identity {
        Some(keys) => Some(
            IdentitySigner::new(keys.key())
                .ok_or_else(|| {
                    UpstreamError::Config("sign_identity_key_env: the key was refused".into())
                })?
                .with_content_digest(cfg.sign_content_digest),
        ),
        None => None,
    })
}

/// The transport over `connector`: hyper-util's client for `http2 = true`,
/// else our HTTP/1.1 client's pools.
fn transport(cfg: &HttpUpstreamSettings, connector: Connector) -> Transport {
    if cfg.http2 {
        Transport::Http2(Box::new(
            Client::builder(TokioExecutor::new())
                .pool_timer(TokioTimer::new())
                .timer(TokioTimer::new())
                .pool_idle_timeout(cfg.idle_timeout)
                .pool_max_idle_per_host(cfg.max_connections_per_target)
                .http2_only(true)
                .build(connector),
        ))
    } else {
        Transport::Http1(connector)
    }
}

/// Starts the tasks that run beside the requests, when there is a runtime:
/// the active checker (with `health_path`) and the idle-connection reaper.
fn spawn_tasks(
    cfg: &HttpUpstreamSettings,
    targets: &Arc<Targets>,
    transport: &Arc<Transport>,
) -> Result<Vec<AbortOnDropHandle<()>>, UpstreamError> {
    let mut tasks = Vec::new();
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        if let Some(path) = &cfg.health_path {
            let path = PathAndQuery::try_from(path.as_str())
                .map_err(|e| UpstreamError::Config(format!("health_path: {e}")))?;
            let timeout = cfg.request_timeout.min(cfg.health_interval);
            tasks.push(AbortOnDropHandle::new(rt.spawn(active_check(
                Arc::downgrade(targets),
                transport.clone(),
                path,
                cfg.health_interval,
                timeout,
            ))));
        }
        // Idle connections past `idle_timeout` are closed even when no
        // request comes to take them.
        let weak = Arc::downgrade(targets);
        let every = (cfg.idle_timeout / 2).max(Duration::from_millis(100));
        tasks.push(AbortOnDropHandle::new(rt.spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(t) = weak.upgrade() else { return };
                t.list.iter().for_each(|t| t.pool.prune());
            }
        })));
    }
    Ok(tasks)
}

#[cfg(test)]
mod tests;
