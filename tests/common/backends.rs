//! Servers a test starts for itself on free loopback ports and stops on drop,
//! also when the test fails: a Redis speaking only TLS, a three-node Redis
//! Cluster, and a private PostgreSQL that accepts only TLS connections; and
//! the certificates they present (a CA, a server certificate it signed for
//! 127.0.0.1 and localhost, and an unrelated CA for "wrong CA" cases).
//!
//! Every wait is bounded; a server that does not come up fails the test with
//! its log.

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A port nobody listens on now, for a server a test starts itself: taken
/// below the kernel's ephemeral range (32768 and up), where no outgoing
/// connection can take it between this check and the server's bind, and
/// never the same twice in one test binary (a Redis Cluster node takes two).
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    // Each binary starts at its own place in the range.
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id() % SPAN,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..SPAN {
        let port = (FIRST + NEXT.fetch_add(1, Ordering::Relaxed) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {FIRST}..{}", FIRST + SPAN);
}

/// Runs `cmd` to completion within `limit` (killed past it); its output.
pub fn run_bounded(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{cmd:?} still running after {limit:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Polls `ready` every 50 ms until it holds; panics with `what` and `log()` after `limit`.
fn wait_for(
    what: &str,
    limit: Duration,
    mut ready: impl FnMut() -> bool,
    log: impl Fn() -> String,
) {
    let deadline = Instant::now() + limit;
    while !ready() {
        assert!(
            Instant::now() < deadline,
            "{what} not ready within {limit:?}:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn read_log(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

// === Certificates ===

/// A CA and a server certificate it signed (SAN 127.0.0.1 and localhost),
/// plus an unrelated CA, as PEM files in a temp dir.
pub struct Pki {
    pub dir: tempfile::TempDir,
    pub ca: PathBuf,
    pub other_ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Pki {
    pub fn new() -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
        let ca = |name: &str| {
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.distinguished_name.push(DnType::CommonName, name);
            CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
        };
        let ca_cert = ca("mpg test CA");
        let other_cert = ca("mpg unrelated CA");
        let server_key = KeyPair::generate().unwrap();
        let server = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .unwrap()
            .signed_by(&server_key, &ca_cert)
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: String| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        Pki {
            ca: write("ca.pem", ca_cert.pem()),
            other_ca: write("other-ca.pem", other_cert.pem()),
            cert: write("server.pem", server.pem()),
            key: write("server.key", server_key.serialize_pem()),
            dir,
        }
    }
}

/// Child processes killed and reaped on drop.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

// === Redis over TLS ===

/// A `redis-server` listening only with TLS (no plain port), presenting
/// `pki`'s server certificate and not asking clients for one.
pub struct TlsRedis {
    pub port: u16,
    /// Before `pki`: fields drop in order, the server before its directory.
    children: Children,
    pub pki: Pki,
}

impl TlsRedis {
    pub fn start() -> TlsRedis {
        let pki = Pki::new();
        let port = free_port();
        let dir = pki.dir.path();
        let log = dir.join("redis.log");
        let child = Command::new("redis-server")
            .args(["--port", "0", "--bind", "127.0.0.1"])
            .args(["--tls-port", &port.to_string()])
            .arg("--tls-cert-file")
            .arg(&pki.cert)
            .arg("--tls-key-file")
            .arg(&pki.key)
            .arg("--tls-ca-cert-file")
            .arg(&pki.ca)
            .args(["--tls-auth-clients", "no"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(&log)
            .stdin(Stdio::null())
            .spawn()
            .expect("redis-server (built with TLS) must be on PATH");
        let redis = TlsRedis {
            port,
            pki,
            children: Children(vec![child]),
        };
        wait_for(
            "redis-server --tls-port",
            Duration::from_secs(15),
            || redis.cli(&["PING"]).trim() == "PONG",
            || read_log(&log),
        );
        redis
    }

    /// `rediss://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }

    /// Runs one command with `redis-cli` over TLS; its stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = run_bounded(
            Command::new("redis-cli")
                .args(["--tls", "--cacert"])
                .arg(&self.pki.ca)
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
                .args(args),
            Duration::from_secs(10),
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Stops the server now (also done on drop).
    pub fn stop(&mut self) {
        self.children.0.iter_mut().for_each(|c| {
            let _ = c.kill();
            let _ = c.wait();
        });
    }
}

// === Redis Cluster ===

/// A Redis Cluster of `n` primaries on loopback (and, with
/// [`RedisCluster::start_with_replicas`], replicas), its slots spread over
/// the primaries; with TLS, clients and the cluster bus speak only TLS, with
/// `pki`'s server certificate.
pub struct RedisCluster {
    pub ports: Vec<u16>,
    /// Before `dir`: fields drop in order, the servers before their directory.
    children: Children,
    dir: tempfile::TempDir,
    pub pki: Option<Pki>,
}

impl RedisCluster {
    pub fn start(n: usize) -> RedisCluster {
        Self::start_with(n, 0, None)
    }

    pub fn start_tls(n: usize) -> RedisCluster {
        Self::start_with(n, 0, Some(Pki::new()))
    }

    /// `primaries` primaries with `replicas` replicas each; a primary that stops
    /// answering for 5 s is marked failed.
    pub fn start_with_replicas(primaries: usize, replicas: usize) -> RedisCluster {
        Self::start_with(primaries, replicas, None)
    }

    fn start_with(primaries: usize, replicas: usize, pki: Option<Pki>) -> RedisCluster {
        let n = primaries * (1 + replicas);
        let dir = tempfile::tempdir().unwrap();
        let mut cluster = RedisCluster {
            ports: Vec::new(),
            children: Children(Vec::new()),
            dir,
            pki,
        };
        for _ in 0..n {
            let (port, bus) = (free_port(), free_port());
            let d = cluster.dir.path();
            let mut cmd = Command::new("redis-server");
            match &cluster.pki {
                None => cmd.args(["--port", &port.to_string()]),
                Some(pki) => cmd
                    .args(["--port", "0", "--tls-port", &port.to_string()])
                    .arg("--tls-cert-file")
                    .arg(&pki.cert)
                    .arg("--tls-key-file")
                    .arg(&pki.key)
                    .arg("--tls-ca-cert-file")
                    .arg(&pki.ca)
                    .args(["--tls-auth-clients", "no", "--tls-cluster", "yes"]),
            };
            let child = cmd
                .args(["--bind", "127.0.0.1"])
                .args(["--cluster-enabled", "yes"])
                // With replicas, a dead primary is noticed in 5 s (not 15).
                .args([
                    "--cluster-node-timeout",
                    if replicas > 0 { "5000" } else { "15000" },
                ])
                .args(["--cluster-port", &bus.to_string()])
                .arg("--cluster-config-file")
                .arg(d.join(format!("nodes-{port}.conf")))
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(d)
                .arg("--logfile")
                .arg(d.join(format!("redis-{port}.log")))
                .stdin(Stdio::null())
                .spawn()
                .expect("redis-server must be on PATH");
            cluster.children.0.push(child);
            cluster.ports.push(port);
        }
        for &port in &cluster.ports {
            wait_for(
                "a cluster node",
                Duration::from_secs(15),
                || cluster.cli(port, &["PING"]).trim() == "PONG",
                || cluster.logs(),
            );
        }
        let nodes: Vec<String> = cluster
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let out = run_bounded(
            cluster
                .redis_cli()
                .args(["--cluster", "create"])
                .args(&nodes)
                .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"]),
            Duration::from_secs(60),
        );
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        for &port in &cluster.ports {
            wait_for(
                "cluster_state:ok",
                Duration::from_secs(30),
                || {
                    cluster
                        .cli(port, &["CLUSTER", "INFO"])
                        .contains("cluster_state:ok")
                },
                || cluster.logs(),
            );
        }
        cluster
    }

    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,…` (`rediss+cluster://` with TLS).
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let scheme = if self.pki.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}+cluster://{}", nodes.join(","))
    }

    /// `redis-cli`, over TLS trusting the test CA when the cluster uses TLS.
    fn redis_cli(&self) -> Command {
        let mut cmd = Command::new("redis-cli");
        if let Some(pki) = &self.pki {
            cmd.args(["--tls", "--cacert"]).arg(&pki.ca);
        }
        cmd
    }

    /// The ports of the primaries serving slots now (as the node at `asked` sees it).
    pub fn primaries(&self, asked: u16) -> Vec<u16> {
        self.cli(asked, &["CLUSTER", "NODES"])
            .lines()
            .filter_map(|l| {
                // id addr@bus flags master ping pong epoch link-state slot…
                let fields: Vec<&str> = l.split_whitespace().collect();
                let flags = fields.get(2)?;
                let serving =
                    flags.contains("master") && !flags.contains("fail") && fields.len() > 8;
                serving.then_some(())?;
                fields[1].split(['@', ':']).nth(1)?.parse().ok()
            })
            .collect()
    }

    /// The port of a replica of the primary at `primary` (as the node at `asked` sees it).
    pub fn replica_of(&self, asked: u16, primary: u16) -> Option<u16> {
        let nodes = self.cli(asked, &["CLUSTER", "NODES"]);
        let port_of = |addr: &str| addr.split(['@', ':']).nth(1)?.parse::<u16>().ok();
        let id = nodes.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (port_of(f.get(1)?)? == primary).then(|| f[0].to_string())
        })?;
        nodes.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(3)? == &id.as_str()).then(|| port_of(f[1]))?
        })
    }

    /// Kills the node at `port` (SIGKILL: no goodbye to the others).
    pub fn kill(&mut self, port: u16) {
        let i = self.ports.iter().position(|&p| p == port).unwrap();
        let _ = self.children.0[i].kill();
        let _ = self.children.0[i].wait();
    }

    /// Runs one command on the node at `port` (no redirects followed).
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        let out = run_bounded(
            self.redis_cli()
                .args(["-h", "127.0.0.1", "-p", &port.to_string()])
                .args(args),
            Duration::from_secs(10),
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The keys the node at `port` holds under `prefix`.
    pub fn keys_on(&self, port: u16, prefix: &str) -> Vec<String> {
        self.cli(port, &["--scan", "--pattern", &format!("{prefix}*")])
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect()
    }

    fn logs(&self) -> String {
        self.ports
            .iter()
            .map(|p| read_log(&self.dir.path().join(format!("redis-{p}.log"))))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

// === PostgreSQL with TLS ===

/// The directory of `initdb` and `pg_ctl` (`MPG_TEST_PG_BINDIR`, else the
/// newest under /usr/lib/postgresql).
fn pg_bindir() -> PathBuf {
    if let Ok(dir) = std::env::var("MPG_TEST_PG_BINDIR") {
        return dir.into();
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| {
            d.filter_map(|e| Some(e.ok()?.path().join("bin")))
                .filter(|b| b.join("initdb").exists())
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
        .pop()
        .expect("PostgreSQL server binaries (initdb, pg_ctl) under /usr/lib/postgresql")
}

/// Runs a PostgreSQL binary as the `postgres` user (the server refuses root).
fn as_postgres(bin: &Path) -> Command {
    let mut cmd = Command::new("runuser");
    cmd.args(["-u", "postgres", "--"]).arg(bin);
    cmd
}

fn chown_postgres(path: &Path) {
    let out = run_bounded(
        Command::new("chown").arg("postgres:postgres").arg(path),
        Duration::from_secs(5),
    );
    assert!(out.status.success(), "chown postgres {}", path.display());
}

/// A PostgreSQL cluster of its own (initdb in a temp dir), on a free
/// loopback port: with TLS on (`pki`'s server certificate) and every TCP
/// connection required to use it (`hostssl` only in pg_hba.conf), or plain.
/// Needs root (to become `postgres`); stopped and deleted on drop.
pub struct OwnPostgres {
    pub port: u16,
    pub pki: Pki,
    tls: bool,
    bindir: PathBuf,
    data: PathBuf,
}

/// The TLS-only [`OwnPostgres`], started.
pub type TlsPostgres = OwnPostgres;

impl OwnPostgres {
    /// A TLS-only cluster, started.
    pub fn start() -> OwnPostgres {
        let pg = Self::init(true);
        pg.run();
        pg
    }

    /// A cluster made but not started: its port refuses connections until
    /// [`OwnPostgres::run`].
    pub fn init(tls: bool) -> OwnPostgres {
        let pki = Pki::new();
        let dir = pki.dir.path().to_path_buf();
        let bindir = pg_bindir();
        let data = dir.join("data");
        chown_postgres(&dir);
        for file in [&pki.cert, &pki.key, &pki.ca] {
            chown_postgres(file);
        }
        std::fs::set_permissions(&pki.key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let out = run_bounded(
            as_postgres(&bindir.join("initdb"))
                .arg("-D")
                .arg(&data)
                .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"]),
            Duration::from_secs(120),
        );
        assert!(
            out.status.success(),
            "initdb: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // Local socket for nobody but the test's own checks; TCP with TLS only when asked.
        let tcp = if tls { "hostssl" } else { "host" };
        std::fs::write(
            data.join("pg_hba.conf"),
            format!("local all all trust\n{tcp} all all 127.0.0.1/32 trust\n"),
        )
        .unwrap();
        OwnPostgres {
            port: free_port(),
            pki,
            tls,
            bindir,
            data,
        }
    }

    /// Starts the server (again, after [`OwnPostgres::halt`]).
    pub fn run(&self) {
        let dir = self.pki.dir.path();
        let tls = if self.tls {
            format!(
                "-c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
                self.pki.cert.display(),
                self.pki.key.display()
            )
        } else {
            String::new()
        };
        let options = format!(
            "-c port={port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={dir} {tls} \
             -c fsync=off -c shared_buffers=16MB -c max_connections=40",
            port = self.port,
            dir = dir.display(),
        );
        let out = run_bounded(
            as_postgres(&self.bindir.join("pg_ctl"))
                .arg("-D")
                .arg(&self.data)
                .arg("-l")
                .arg(dir.join("postgres.log"))
                .args(["-w", "-t", "60", "-o", &options, "start"]),
            Duration::from_secs(90),
        );
        assert!(
            out.status.success(),
            "pg_ctl start: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            read_log(&dir.join("postgres.log"))
        );
    }

    /// Stops the server at once (connections are cut); true if it stopped.
    pub fn halt(&self) -> bool {
        as_postgres(&self.bindir.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "-t", "20", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// `postgres://postgres@127.0.0.1:PORT/DB?QUERY`.
    pub fn url(&self, db: &str, query: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}?{query}", self.port)
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        if !self.halt() {
            // The first line of postmaster.pid is the server's pid.
            if let Some(pid) = std::fs::read_to_string(self.data.join("postmaster.pid"))
                .ok()
                .and_then(|t| t.lines().next().map(str::to_string))
            {
                let _ = Command::new("kill").args(["-KILL", &pid]).status();
            }
        }
    }
}
