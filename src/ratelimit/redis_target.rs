//! Where the shared limiter's Redis is and how to reach it: one server over
//! `redis://` or `rediss://` (TLS), or a Redis Cluster over
//! `redis+cluster://` or `rediss+cluster://` with its seed nodes listed
//! comma-separated. Either way the limiter holds one [`RedisConn`], which the
//! redis crate drives like any connection (scripts included).
//!
//! TLS verifies the server's certificate and name against the system's trust
//! store, or only against the CA certificates of a PEM file when one is given
//! (a private CA). There is no way to turn the check off.

use std::path::Path;
use std::time::Duration;

use ::redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::ClusterClient;
use ::redis::cluster_async::ClusterConnection;
use ::redis::io::tcp::TcpSettings;
use ::redis::{
    Client, Cmd, ConnectionAddr, ErrorKind, IntoConnectionInfo, Pipeline, RedisError, RedisFuture,
    RedisResult, TlsCertificates, Value,
};

use super::LimiterError;

/// A checked `rate_limit.redis_url` with its trust roots (cheap to clone;
/// its `Debug` never shows the url, which may hold a password).
#[derive(Clone)]
pub struct RedisTarget {
    kind: Kind,
    tls: bool,
}

#[derive(Clone)]
enum Kind {
    /// One server; the client knows its address and TLS settings.
    Single(Client),
    /// A cluster: its seed nodes (one url each) and the CA file's PEM text.
    Cluster {
        nodes: Vec<String>,
        ca_pem: Option<Vec<u8>>,
    },
}

impl RedisTarget {
    /// Parses `url` and, for TLS, reads `ca_file` (PEM: only these CAs are
    /// trusted then). A malformed url, a CA file with a non-TLS url or an
    /// unreadable CA file is an error; nothing is connected yet.
    pub fn new(url: &str, ca_file: Option<&Path>) -> Result<Self, LimiterError> {
        Self::parse(url, ca_file).map_err(|err| LimiterError::Config(err.into()))
    }

    fn parse(url: &str, ca_file: Option<&Path>) -> RedisResult<Self> {
        let ca_pem = match ca_file {
            Some(path) => Some(std::fs::read(path).map_err(|e| {
                config_error(
                    "cannot read the Redis CA file",
                    format!("{}: {e}", path.display()),
                )
            })?),
            None => None,
        };
        if let Some(nodes) = cluster_nodes(url) {
            let nodes = nodes?;
            let tls = nodes[0].starts_with("rediss://");
            if ca_pem.is_some() && !tls {
                return Err(no_tls_for_ca());
            }
            // Built once here so that a bad node url is a configuration error.
            cluster_client(&nodes, ca_pem.as_deref(), Duration::from_secs(1))?;
            return Ok(Self {
                kind: Kind::Cluster { nodes, ca_pem },
                tls,
            });
        }
        let info = url.into_connection_info()?.set_tcp_settings(tcp_settings());
        let tls = matches!(info.addr(), ConnectionAddr::TcpTls { .. });
        let client = match ca_pem {
            None => Client::open(info)?,
            Some(_) if !tls => return Err(no_tls_for_ca()),
            Some(pem) => Client::build_with_tls(info, certificates(pem))?,
        };
        Ok(Self {
            kind: Kind::Single(client),
            tls,
        })
    }

    /// Opens a connection that reconnects by itself; a connect gives up
    /// after `timeout`. Each call's caller bounds its answer with a deadline of
    /// its own, so a single server's connection sets no response timeout: a
    /// second timer per call would cost the runtime a wake-up (an eventfd
    /// write) on most calls, and redis-rs does not reconnect on its expiry.
    ///
    /// A failed connect is not retried here: the limiter's breaker already
    /// tries again once a second, and a retry's backoff (a second or more)
    /// would outlast the call's timeout and hide the cause (a refused
    /// connection, a certificate from an unknown CA) behind "timed out".
    pub(super) async fn connect(&self, timeout: Duration) -> RedisResult<RedisConn> {
        match &self.kind {
            Kind::Single(client) => {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(None)
                    .set_number_of_retries(0);
                let conn = ConnectionManager::new_with_config(client.clone(), config).await?;
                Ok(RedisConn::Single(conn))
            }
            Kind::Cluster { nodes, ca_pem } => {
                let client = cluster_client(nodes, ca_pem.as_deref(), timeout)?;
                Ok(RedisConn::Cluster(client.get_async_connection().await?))
            }
        }
    }
}

impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Single(_) => "single",
            Kind::Cluster { .. } => "cluster",
        };
        f.debug_struct("RedisTarget")
            .field("kind", &kind)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

/// The seed nodes of a `redis+cluster://[auth@]host:port,host:port[/0]`
/// url (`rediss+cluster://` for TLS), one `redis://` or `rediss://` url
/// each carrying the credentials; `None` for a url of another scheme.
fn cluster_nodes(url: &str) -> Option<RedisResult<Vec<String>>> {
    let (scheme, rest) = if let Some(rest) = url.strip_prefix("redis+cluster://") {
        ("redis", rest)
    } else {
        ("rediss", url.strip_prefix("rediss+cluster://")?)
    };
    let invalid = |what: &'static str| Some(Err(config_error("invalid Redis Cluster url", what)));
    let (auth, hosts) = match rest.rsplit_once('@') {
        Some((auth, hosts)) => (format!("{auth}@"), hosts),
        None => (String::new(), rest),
    };
    let (hosts, db) = hosts.split_once('/').unwrap_or((hosts, ""));
    if !matches!(db, "" | "0") {
        return invalid("a cluster has only database 0");
    }
    if hosts.contains(['?', '#']) {
        return invalid("no query or fragment after the node list");
    }
    let nodes: Vec<String> = hosts
        .split(',')
        .map(|node| format!("{scheme}://{auth}{node}"))
        .collect();
    if hosts.split(',').any(str::is_empty) {
        return invalid("expected host:port[,host:port…]");
    }
    Some(Ok(nodes))
}

fn cluster_client(
    nodes: &[String],
    ca_pem: Option<&[u8]>,
    timeout: Duration,
) -> RedisResult<ClusterClient> {
    // Retries follow MOVED and ASK redirects (immediately) after a
    // resharding or failover; waits between others stay well inside a
    // call's timeout (the crate's default starts at 1.28 s).
    let mut builder = ClusterClient::builder(nodes.iter().map(String::as_str))
        .connection_timeout(timeout)
        .response_timeout(timeout)
        .retries(3)
        .min_retry_wait(10)
        .max_retry_wait(100)
        .tcp_settings(tcp_settings());
    if let Some(pem) = ca_pem {
        builder = builder.certs(certificates(pem.to_vec()));
    }
    builder.build()
}

/// The limiter keeps several script calls on their way at once; with Nagle's
/// algorithm on, each would wait for the one before it to be acknowledged.
fn tcp_settings() -> TcpSettings {
    TcpSettings::default().set_nodelay(true)
}

fn certificates(root_pem: Vec<u8>) -> TlsCertificates {
    TlsCertificates {
        client_tls: None,
        root_cert: Some(root_pem),
    }
}

fn config_error(what: &'static str, detail: impl Into<String>) -> RedisError {
    RedisError::from((ErrorKind::InvalidClientConfig, what, detail.into()))
}

fn no_tls_for_ca() -> RedisError {
    RedisError::from((
        ErrorKind::InvalidClientConfig,
        "a Redis CA file applies only to rediss:// urls",
    ))
}

/// The limiter's connection: to one server, or to a cluster (which routes
/// each command by its key's slot and follows `MOVED`/`ASK`). Cheap to clone.
// Unboxed: made once per connect and cloned (no allocation) per call; a
// boxed manager would cost an allocation per clone.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
pub(super) enum RedisConn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl RedisConn {
    /// Whether this is a cluster connection (a script's keys must then share a slot).
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(conn) => conn.req_packed_command(cmd),
            Self::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(conn) => conn.req_packed_commands(cmd, offset, count),
            Self::Cluster(conn) => conn.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(conn) => conn.get_db(),
            Self::Cluster(conn) => conn.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_list_their_nodes_with_the_credentials() {
        let nodes = cluster_nodes("redis+cluster://:pw@10.0.0.1:7000,10.0.0.2:7001")
            .unwrap()
            .unwrap();
        assert_eq!(
            nodes,
            ["redis://:pw@10.0.0.1:7000", "redis://:pw@10.0.0.2:7001"]
        );
        let nodes = cluster_nodes("rediss+cluster://h1:1,h2:2/0")
            .unwrap()
            .unwrap();
        assert_eq!(nodes, ["rediss://h1:1", "rediss://h2:2"]);
        assert!(cluster_nodes("redis://h:1").is_none());
        for bad in [
            "redis+cluster://h:1/2",
            "redis+cluster://h:1,,h:2",
            "redis+cluster://",
            "redis+cluster://h:1?protocol=resp3",
        ] {
            assert!(cluster_nodes(bad).unwrap().is_err(), "{bad}");
        }
    }

    #[test]
    fn targets_check_the_url_and_the_ca_file() {
        let single = RedisTarget::new("rediss://:pw@127.0.0.1:6380/1", None).unwrap();
        let debug = format!("{single:?}");
        assert!(
            debug.contains("tls: true") && !debug.contains("pw"),
            "{debug}"
        );
        let cluster = RedisTarget::new("redis+cluster://:pw@127.0.0.1:1,127.0.0.1:2", None);
        assert!(format!("{:?}", cluster.unwrap()).contains("cluster"));
        assert!(matches!(
            RedisTarget::new("not a url", None),
            Err(LimiterError::Config(_))
        ));

        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        std::fs::write(&ca, cert.cert.pem()).unwrap();
        assert!(RedisTarget::new("rediss://127.0.0.1:6380", Some(&ca)).is_ok());
        assert!(RedisTarget::new("rediss+cluster://127.0.0.1:1", Some(&ca)).is_ok());
        for plain in ["redis://127.0.0.1:6379", "redis+cluster://127.0.0.1:1"] {
            let err = RedisTarget::new(plain, Some(&ca)).unwrap_err().to_string();
            assert!(err.contains("only to rediss://"), "{err}");
        }
        let missing = dir.path().join("missing.pem");
        let err = RedisTarget::new("rediss://127.0.0.1:6380", Some(&missing))
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing.pem"), "{err}");
    }
}
