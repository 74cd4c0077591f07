//! The application: builds the gateway from its settings, serves it, and
//! swaps in a new configuration on reload.
mod build;
mod reload;

pub use build::{build, open_store};
pub use reload::{Live, ReloadError};

use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use crate::config::{Settings, TlsSettings};
use crate::http_core::service::stopped;
use crate::server::{serve, serve_behind, ListenerLimits, Proxies};
use crate::tls::CertResolver;

/// Why the gateway could not start; each names the config part involved.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The key store could not be opened or migrated.
    #[error("store ({what}): {}", cause.explain())]
    Store {
        /// The store, with any password hidden.
        what: String,
        /// The cause, explained in the message (so not a `source` as well,
        /// which would repeat it in a chain of causes).
        cause: crate::store::StoreError,
    },
    /// The rate limiter backend could not be set up.
    #[error("rate_limit: {0}")]
    Limiter(#[from] crate::ratelimit::LimiterError),
    /// The route table (its upstreams, its routes) could not be compiled.
    #[error(transparent)]
    Table(#[from] crate::pipeline::TableError),
    /// TLS setup failed.
    #[error("server.tls: {0}")]
    Tls(#[from] crate::tls::TlsError),
    /// The admin listener's TLS setup failed.
    #[error("admin.tls: {0}")]
    AdminTls(crate::tls::TlsError),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr} ({setting}): {source}")]
    Bind {
        /// The setting that names it: `server.listen` or `admin.listen`.
        setting: &'static str,
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// A gateway serving on a bound address; dropping the handle does not stop it.
pub struct Running {
    /// The address actually bound (useful with port 0).
    pub addr: SocketAddr,
    /// The admin listener's address, when enabled.
    pub admin_addr: Option<SocketAddr>,
    /// The serving gateway (for reloads).
    pub live: Arc<Live>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

// === impl Running ===

impl Running {
    /// Stops accepting, drains in-flight requests (up to `shutdown_grace`),
    /// waits, then sends the spans still queued (5 s at most).
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
        if let Some(tracer) = &self.live.current().tracer {
            tracer.flush(std::time::Duration::from_secs(5)).await;
        }
    }
}

/// Builds the gateway, binds `server.listen` (and `admin.listen`) and serves
/// in the background. `config_path` is what a reload re-reads.
pub async fn start(
    settings: Settings,
    config_path: Option<std::path::PathBuf>,
) -> Result<Running, StartError> {
    // The recorder first: handles made while building (route, upstream and
    // target metrics) are no-ops if made before it exists. With the admin
    // listener off (a restart-only setting) nothing can ever read a metric,
    // so none is recorded: every handle stays a no-op.
    if settings.admin.listen.is_some() {
        crate::metrics::metrics_handle();
    }
    crate::logging::set_summary_interval(settings.log.summary_interval);
    let groups = &settings.server.key_exchange;
    let (tls, resolver) = gateway_tls(settings.server.tls.as_ref(), groups)?;
    let listen = settings.server.listen;
    let limits = ListenerLimits::gateway(&settings.server.limits);
    let proxies = Proxies::gateway(&settings.server);
    let admin_listen = settings.admin.listen;
    let admin_hosts = settings.admin.allowed_hosts.clone();
    if let Some(warning) = settings.admin.exposure_warning() {
        tracing::warn!("{warning}");
    }
    let admin_tls = admin_tls(settings.admin.tls.as_ref(), groups)?;
    let gateway = build(settings).await?;
    let (store_display, limiter_backend) = (
        gateway.settings.store.display.clone(),
        gateway.limiter.backend(),
    );
    let usage = gateway.usage.clone();
    let credits = (gateway.store.clone(), gateway.limiter.credit_book());
    let live = Arc::new(Live::new(gateway, config_path, resolver));
    let (listener, addr) = bind(listen, "server.listen").await?;
    let (tx, rx) = watch::channel(false);
    let mut tasks = Vec::new();
    let mut admin_addr = None;
    if let Some(listen) = admin_listen {
        let (admin, bound) = bind(listen, "admin.listen").await?;
        tracing::info!(addr = %bound, tls = admin_tls.is_some(), "admin listening");
        admin_addr = Some(bound);
        let hosts = crate::admin::AllowedHosts::new(listen, admin_hosts);
        let handler = Arc::new(crate::admin::Admin::new(live.clone(), hosts));
        let admin_limits = ListenerLimits {
            name: "admin",
            max_connections: 64,
            ..limits.clone()
        };
        tasks.push(tokio::spawn(serve(
            admin,
            admin_tls,
            admin_limits,
            handler,
            stopped(rx.clone()),
        )));
    }
    tracing::info!(%addr, tls = tls.is_some(), store = %store_display, limiter = limiter_backend, "listening");
    let handler = live.clone();
    tasks.push(tokio::spawn(async move {
        serve_behind(listener, tls, limits, proxies, handler, stopped(rx)).await;
        usage.flush().await;
        // What keys spent since the last write: at most a second's worth.
        crate::ratelimit::credits::write_credits(&credits.0, &credits.1).await;
    }));
    Ok(Running {
        addr,
        admin_addr,
        live,
        shutdown: tx,
        tasks,
    })
}

/// The gateway listener's TLS acceptor for `server.tls`, if any, and the
/// resolver a reload swaps its certificate in.
fn gateway_tls(
    tls: Option<&TlsSettings>,
    groups: &[crate::tls::KeyExchange],
) -> Result<(Option<TlsAcceptor>, Option<Arc<CertResolver>>), StartError> {
    Ok(match tls {
        Some(t) => {
            if *t == TlsSettings::SelfSigned {
                tracing::warn!(
                    "serving a self-signed certificate generated in memory: for development only"
                );
            }
            let (config, resolver) = crate::tls::server_config(load_certified_key(t)?, groups)?;
            (Some(TlsAcceptor::from(config)), Some(resolver))
        }
        None => (None, None),
    })
}

/// The admin listener's TLS acceptor for `admin.tls`, if any, offering
/// `groups`. Loaded at start only: a new admin certificate takes a restart.
fn admin_tls(
    tls: Option<&TlsSettings>,
    groups: &[crate::tls::KeyExchange],
) -> Result<Option<TlsAcceptor>, StartError> {
    Ok(match tls {
        Some(t) => {
            let key = load_certified_key(t).map_err(StartError::AdminTls)?;
            let (config, _) =
                crate::tls::server_config(key, groups).map_err(StartError::AdminTls)?;
            Some(TlsAcceptor::from(config))
        }
        None => None,
    })
}

/// Binds `listen`, which `setting` names, and says the address bound.
async fn bind(
    listen: SocketAddr,
    setting: &'static str,
) -> Result<(TcpListener, SocketAddr), StartError> {
    let bind_error = |source| StartError::Bind {
        setting,
        addr: listen,
        source,
    };
    let listener = TcpListener::bind(listen).await.map_err(bind_error)?;
    let addr = listener.local_addr().map_err(bind_error)?;
    Ok((listener, addr))
}

/// Loads the certificate the settings name (or generates one).
pub fn load_certified_key(
    tls: &TlsSettings,
) -> Result<rustls::sign::CertifiedKey, crate::tls::TlsError> {
    match tls {
        TlsSettings::Files { cert, key } => crate::tls::load_pem(cert, key),
        TlsSettings::SelfSigned => crate::tls::self_signed(),
    }
}
