//! Hot reload (SIGHUP, or `POST /reload` on the admin listener).
//!
//! The serving handler is a [`Live`] gateway: an `ArcSwap` of [`Pipeline`].
//! A reload re-reads the file, validates it completely, loads a renewed
//! certificate, builds new routes, policies and upstreams, and swaps them in
//! at once; requests in flight finish on the gateway they started on, and
//! open connections are never dropped. An invalid file changes nothing.
//! An upstream whose `[upstreams.NAME]` table and TLS files did not change
//! is kept running, not rebuilt: its targets stay ejected or healthy, its
//! idle connections stay pooled, its active checker keeps its rhythm.
//! What cannot change without a restart (listeners, TLS mode, store, log,
//! connection limits, `max_header_bytes`) keeps its running value and is reported.
use arc_swap::ArcSwap;
use http::{Request, Response};
use std::path::PathBuf;
use std::sync::Arc;

use super::build::build_limiter;
use super::StartError;
use crate::admin::{Configuration, Control, Reloaded, Status};
use crate::config::{ConfigError, Settings, TlsSettings};
use crate::error::GatewayError;
use crate::http_core::body::{Body, RequestBody};
use crate::http_core::service::{ConnInfo, Handler, Refusal, Reply};
use crate::metrics::names::RELOADS;
use crate::pipeline::{Pipeline, ReplyStamp};
use crate::proxy::upstream::Upstream;
use crate::tls::{CertResolver, TlsError};

/// Why a reload was refused (the running configuration stays).
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The gateway was started without a file (e.g. `demo`).
    #[error("this gateway was not started from a configuration file")]
    NoFile,
    /// The file is invalid; every problem is listed.
    #[error("{0}")]
    Config(#[from] ConfigError),
    /// The new certificate or key could not be loaded.
    #[error("server.tls: {0}")]
    Tls(#[from] TlsError),
    /// Building the new routes, limiter or upstreams failed.
    #[error("{0}")]
    Build(#[from] StartError),
}

/// The gateway that serves requests, swappable as a whole.
pub struct Live {
    current: ArcSwap<Pipeline>,
    /// Set by a stop signal: `/readyz` answers 503 from then on.
    stopping: std::sync::atomic::AtomicBool,
    config_path: Option<PathBuf>,
    resolver: Option<Arc<CertResolver>>,
    reloading: tokio::sync::Mutex<()>,
    /// Start, load and reload times, for the console.
    configuration: std::sync::Mutex<Configuration>,
}

// === impl Live ===

impl Live {
    /// Serves `gateway`; `config_path` is re-read on reload; `resolver` takes renewed certificates.
    pub fn new(
        gateway: Pipeline,
        config_path: Option<PathBuf>,
        resolver: Option<Arc<CertResolver>>,
    ) -> Self {
        hand_over_upstreams(None, &gateway);
        let path = config_path.as_ref().map(|p| p.display().to_string());
        Live {
            current: ArcSwap::from_pointee(gateway),
            stopping: std::sync::atomic::AtomicBool::new(false),
            config_path,
            resolver,
            reloading: tokio::sync::Mutex::new(()),
            configuration: std::sync::Mutex::new(Configuration {
                started_at: crate::clock::unix_now(),
                path,
                loaded_at: crate::clock::unix_now(),
                last_reload: None,
            }),
        }
    }

    /// The gateway serving right now.
    pub fn current(&self) -> Arc<Pipeline> {
        self.current.load_full()
    }

    /// `server.shutdown_delay` as the live configuration says it.
    pub fn shutdown_delay(&self) -> std::time::Duration {
        self.current.load().settings.server.shutdown_delay
    }

    /// A stop signal came: `/readyz` answers 503 from now on, while the
    /// listeners go on serving until the drain.
    pub fn set_stopping(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Re-reads the configuration and swaps it in, or changes nothing.
    pub async fn reload(&self) -> Result<Reloaded, ReloadError> {
        let result = self.try_reload().await;
        self.note_reload(&result);
        match &result {
            Ok(outcome) => {
                metrics::counter!(RELOADS, "result" => "ok").increment(1);
                // A log field holds no list: the names, comma-separated ("" for none).
                tracing::info!(
                    restart_needed = %outcome.restart_needed.join(","),
                    certificate_reloaded = outcome.certificate_reloaded,
                    upstreams_rebuilt = %outcome.upstreams_rebuilt.join(","),
                    "configuration reloaded"
                );
            }
            Err(e) => {
                metrics::counter!(RELOADS, "result" => "error").increment(1);
                tracing::error!(error = %e, "configuration reload refused; the running configuration stays");
            }
        }
        result
    }

    /// Notes a reload's time and outcome for [`Control::configuration`].
    fn note_reload(&self, result: &Result<Reloaded, ReloadError>) {
        let now = crate::clock::unix_now();
        let mut c = (self.configuration.lock()).unwrap_or_else(std::sync::PoisonError::into_inner);
        let problems = match result {
            Ok(_) => {
                c.loaded_at = now;
                Vec::new()
            }
            Err(e) => reload_problems(e),
        };
        c.last_reload = Some((now, problems));
    }

    async fn try_reload(&self) -> Result<Reloaded, ReloadError> {
        let path = self.config_path.as_ref().ok_or(ReloadError::NoFile)?;
        let _one_at_a_time = self.reloading.lock().await;
        let old = self.current();
        let mut new = Settings::load(path)?;
        let restart_needed = keep_restart_only(&mut new, &old.settings);
        let cert = match (&new.server.tls, &self.resolver) {
            (Some(tls @ TlsSettings::Files { .. }), Some(_)) => {
                Some(super::load_certified_key(tls)?)
            }
            _ => None,
        };
        // Buckets survive a reload unless the policies themselves changed.
        let limiter = if new.rate_limit == old.settings.rate_limit {
            old.limiter.clone()
        } else {
            let limiter = build_limiter(&new).await?;
            Arc::new(limiter.with_credit_book(old.limiter.credit_book()))
        };
        let gateway = Pipeline::assemble(
            new,
            old.store.clone(),
            old.keys.clone(),
            old.usage.clone(),
            limiter,
            Some(&old),
        )
        .map_err(StartError::from)?;
        let certificate_reloaded = match (cert, &self.resolver) {
            (Some(cert), Some(resolver)) => {
                resolver.replace(cert);
                true
            }
            _ => false,
        };
        let gateway = Arc::new(gateway);
        self.current.store(gateway.clone());
        let upstreams_rebuilt = hand_over_upstreams(Some(&old), &gateway);
        Ok(Reloaded {
            restart_needed,
            certificate_reloaded,
            upstreams_rebuilt,
        })
    }
}

/// Makes `new`'s upstreams the ones `mpg_upstream_target_up` shows, once
/// `new` serves. The upstreams of `old` that `new` did not keep are retired
/// first (their active checkers stop; requests still in flight on them
/// finish without moving a gauge), then `new`'s are published, so the last
/// value written for a target is its serving upstream's. Returns the names
/// of the upstreams `new` built anew.
fn hand_over_upstreams(old: Option<&Pipeline>, new: &Pipeline) -> Vec<String> {
    let kept = |name: &String, up: &Arc<Upstream>| {
        old.and_then(|o| o.upstreams.get(name))
            .is_some_and(|o| Arc::ptr_eq(o, up))
    };
    if let Some(old) = old {
        for (name, up) in &old.upstreams {
            let still = new.upstreams.get(name).is_some_and(|n| Arc::ptr_eq(n, up));
            if !still {
                up.retire();
            }
        }
    }
    let mut rebuilt = Vec::new();
    for (name, up) in &new.upstreams {
        up.publish();
        if !kept(name, up) {
            rebuilt.push(name.clone());
        }
    }
    rebuilt
}

/// A refused reload's problems, one a line.
fn reload_problems(e: &ReloadError) -> Vec<String> {
    match e {
        ReloadError::Config(c) => c.problems.iter().map(|p| p.to_string()).collect(),
        other => vec![other.to_string()],
    }
}

impl Control for Live {
    async fn store_reachable(&self) -> bool {
        self.current().store_ping().await.is_ok()
    }

    fn status(&self) -> Status {
        let now = self.current.load();
        Status {
            limiter_backend: now.limiter.backend(),
            limiter_healthy: now.limiter.healthy(),
            limiter_nodes_down: now.limiter.nodes_down(),
            limiter_instances: now.limiter.instances(),
            routes: now.routes.len(),
            cache_entries: now.keys.entry_count(),
            cache_negative_entries: now.keys.negative_count(),
            stopping: self.stopping.load(std::sync::atomic::Ordering::Acquire),
        }
    }

    async fn reload(&self) -> Result<Reloaded, Vec<String>> {
        Live::reload(self).await.map_err(|e| reload_problems(&e))
    }

    fn configuration(&self) -> Configuration {
        let c = self.configuration.lock();
        c.unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    fn upstream_targets(&self) -> Vec<(String, Vec<crate::proxy::TargetView>)> {
        let now = self.current.load();
        (now.upstreams.iter())
            .map(|(name, up)| (name.clone(), up.targets()))
            .collect()
    }

    fn store_and_settings(&self) -> (crate::store::sql::SqlStore, Arc<Settings>) {
        let now = self.current.load();
        (now.store.clone(), now.settings.clone())
    }
}

impl Handler for Live {
    type Stamp = ReplyStamp;

    fn handle(
        &self,
        req: Request<RequestBody>,
        conn: Arc<ConnInfo>,
    ) -> impl std::future::Future<Output = Reply<ReplyStamp>> + Send {
        // One atomic load per request; the request finishes on this gateway.
        self.current.load_full().handle(req, conn)
    }

    fn refuse(&self, refusal: Refusal) -> Response<Body> {
        GatewayError::from(refusal).into_response()
    }
}

/// The names of the restart-only settings a reload found changed.
struct Changed(Vec<&'static str>);

// === impl Changed ===

impl Changed {
    /// Puts back `old` if the file changed it to `new`, and notes `name`.
    fn keep<T: PartialEq + Clone>(&mut self, name: &'static str, new: &mut T, old: &T) {
        if new != old {
            self.0.push(name);
            *new = old.clone();
        }
    }
}

/// Puts back the running value of every setting that needs a restart,
/// naming the ones the file changed.
fn keep_restart_only(new: &mut Settings, old: &Settings) -> Vec<&'static str> {
    let mut changed = Changed(Vec::new());
    let k = &mut changed;
    k.keep("server.listen", &mut new.server.listen, &old.server.listen);
    // The identity provider's key set is fetched by a task of its own,
    // which a reload keeps.
    k.keep("auth.oidc", &mut new.auth.oidc, &old.auth.oidc);
    // The server's TLS configuration is built at start; a reload swaps
    // only the certificate.
    k.keep(
        "server.tls.key_exchange",
        &mut new.server.key_exchange,
        &old.server.key_exchange,
    );
    k.keep(
        "server.workers",
        &mut new.server.workers,
        &old.server.workers,
    );
    if !same_tls_mode(new.server.tls.as_ref(), old.server.tls.as_ref()) {
        k.0.push("server.tls (mode)");
        new.server.tls = old.server.tls.clone();
    }
    let (nl, ol) = (&mut new.server.limits, &old.server.limits);
    // The listener sizes its HTTP/1.1 head buffer and HTTP/2's
    // SETTINGS_MAX_HEADER_LIST_SIZE from it at start: a reloaded value
    // would apply to HTTP/1.1 and not to HTTP/2.
    k.keep(
        "server.limits.max_header_bytes",
        &mut nl.max_header_bytes,
        &ol.max_header_bytes,
    );
    k.keep(
        "server.limits.header_read_timeout",
        &mut nl.header_read_timeout,
        &ol.header_read_timeout,
    );
    k.keep(
        "server.limits.idle_timeout",
        &mut nl.idle_timeout,
        &ol.idle_timeout,
    );
    k.keep(
        "server.limits.max_connections",
        &mut nl.max_connections,
        &ol.max_connections,
    );
    k.keep(
        "server.limits.shutdown_grace",
        &mut nl.shutdown_grace,
        &ol.shutdown_grace,
    );
    // The listener checks PROXY headers against the list it started with:
    // the pipeline reading the same list keeps the two in step.
    k.keep(
        "server.proxy_protocol",
        &mut new.server.proxy_protocol,
        &old.server.proxy_protocol,
    );
    k.keep(
        "server.client_ip",
        &mut new.server.client_ip,
        &old.server.client_ip,
    );
    k.keep("admin", &mut new.admin, &old.admin);
    k.keep("log", &mut new.log, &old.log);
    k.keep("store", &mut new.store, &old.store);
    changed.0
}

/// Whether the listener's TLS mode (none, self-signed, files) is the same:
/// a reload reloads certificate files, but cannot switch modes.
fn same_tls_mode(new: Option<&TlsSettings>, old: Option<&TlsSettings>) -> bool {
    matches!(
        (new, old),
        (None, None)
            | (Some(TlsSettings::SelfSigned), Some(TlsSettings::SelfSigned))
            | (
                Some(TlsSettings::Files { .. }),
                Some(TlsSettings::Files { .. })
            )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "[server]\ninsecure_http = true\n[upstreams.c]\ntargets = [\"http://127.0.0.1:9\"]\n[[routes]]\nmethod = \"GET\"\npath = \"/a\"\nauth = \"none\"\nupstream = \"c\"\n";

    #[test]
    fn restart_only_settings_keep_their_running_values() {
        let old = Settings::parse(BASE).unwrap();
        let text = BASE.replace("insecure_http = true", "insecure_http = true\nlisten = \"127.0.0.1:1\"")
            + "[store]\npath = \"other.db\"\n[rate_limit.policies.default]\nrequests = 7\nper = \"1s\"\n";
        let mut new = Settings::parse(&text).unwrap();
        let changed = keep_restart_only(&mut new, &old);
        assert_eq!(changed, vec!["server.listen", "store"]);
        assert_eq!(new.server.listen, old.server.listen);
        assert_eq!(new.store, old.store);
        // Reloadable settings keep the new value.
        assert_eq!(new.rate_limit.policies[0].quota.requests.get(), 7);
    }

    #[test]
    fn the_trusted_proxies_and_proxy_protocol_need_a_restart() {
        let old = Settings::parse(BASE).unwrap();
        let text = BASE.replace(
            "insecure_http = true",
            "insecure_http = true\nproxy_protocol = true\n[server.client_ip]\ntrusted_proxies = [\"10.0.0.0/8\"]",
        );
        let mut new = Settings::parse(&text).unwrap();
        let changed = keep_restart_only(&mut new, &old);
        assert_eq!(changed, vec!["server.proxy_protocol", "server.client_ip"]);
        assert!(!new.server.proxy_protocol);
        assert!(new.server.client_ip.trusted_proxies.is_empty());
    }
}
