//! The load generator of the load suite's TLS connection scenarios: a new TLS
//! connection per request, with a full handshake or resuming a TLS 1.3 session.
//!
//! wrk and `openssl s_time` spend more CPU on a handshake than a server does
//! (OpenSSL checks the server's signature on every one), so on a machine where
//! the generator has one core they measure their own limit, and the servers
//! come out alike. This client does the least a TLS 1.3 client can: key
//! shares for the hybrid X25519MLKEM768 and for X25519 (as browsers send
//! them; `--classical`: X25519 only), no certificate or signature check, one request with `Connection: close`,
//! the answer read to its end. Every server in the suite gets the same client,
//! so the rates compare the servers' handshake costs.
//!
//! ```sh
//! cargo bench --bench tls_connect -- --url https://127.0.0.1:8443/path \
//!     -H 'Authorization: Bearer mpg_…' -c 50 -d 10 [--resume] [--classical]
//! ```
//!
//! Prints one line, `WRKJSON {…}`, with the fields `benches/load/run.sh` records
//! for wrk: requests, duration_us, errors, non_2xx, p50_us, p99_us, p999_us,
//! and `resumed`, the connections whose handshake resumed a session. Without
//! `--bench` (as under `cargo test --all-targets`) it does nothing.
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, HandshakeKind, SignatureScheme};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// Accepts any server: the generator measures servers, it does not trust them.
#[derive(Debug)]
struct AnyServer(Vec<SignatureScheme>);

impl ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.clone()
    }
}

struct Args {
    addr: SocketAddr,
    request: Vec<u8>,
    conns: usize,
    duration: Duration,
    resume: bool,
    classical: bool,
}

fn usage(why: &str) -> ! {
    eprintln!("tls_connect: {why}");
    eprintln!(
        "usage: tls_connect --bench --url https://127.0.0.1:PORT/PATH [-H 'Name: value']... [-c CONNS] [-d SECONDS] [--resume] [--classical]"
    );
    std::process::exit(2)
}

fn parse_args(args: Vec<String>) -> Args {
    let (mut url, mut headers) = (None, Vec::new());
    let (mut conns, mut secs, mut resume, mut classical) = (50usize, 10f64, false, false);
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .unwrap_or_else(|| usage(&format!("{name} needs a value")))
        };
        match arg.as_str() {
            "--bench" => {}
            "--url" => url = Some(value("--url")),
            "-H" => headers.push(value("-H")),
            "-c" => {
                conns = value("-c")
                    .parse()
                    .unwrap_or_else(|_| usage("-c takes a number"))
            }
            "-d" => {
                secs = value("-d")
                    .parse()
                    .unwrap_or_else(|_| usage("-d takes seconds"))
            }
            "--resume" => resume = true,
            "--classical" => classical = true,
            other => usage(&format!("unknown argument {other}")),
        }
    }
    let url = url.unwrap_or_else(|| usage("--url is required"));
    let rest = url
        .strip_prefix("https://")
        .unwrap_or_else(|| usage("--url must start with https://"));
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let addr: SocketAddr = authority
        .parse()
        .unwrap_or_else(|_| usage("--url must name IP:PORT"));
    if !addr.ip().is_loopback() {
        usage("--url must be a loopback address");
    }
    if conns == 0 || !(secs > 0.0 && secs <= 600.0) {
        usage("-c must be at least 1 and -d between 0 and 600 seconds");
    }
    let path = if path.is_empty() { "/" } else { path };
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n");
    for h in &headers {
        request.push_str(h);
        request.push_str("\r\n");
    }
    request.push_str("\r\n");
    Args {
        addr,
        request: request.into_bytes(),
        conns,
        duration: Duration::from_secs_f64(secs),
        resume,
        classical,
    }
}

fn client_config(resume: bool, classical: bool) -> Arc<ClientConfig> {
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    use rustls::crypto::aws_lc_rs::kx_group;
    provider.kx_groups = match classical {
        true => vec![kx_group::X25519],
        false => vec![kx_group::X25519MLKEM768, kx_group::X25519],
    };
    let schemes = provider
        .signature_verification_algorithms
        .supported_schemes();
    let mut config = ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3 is supported")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(schemes)))
        .with_no_client_auth();
    if !resume {
        config.resumption = rustls::client::Resumption::disabled();
    }
    Arc::new(config)
}

/// What one connection came to.
enum Outcome {
    Ok { status_2xx: bool, resumed: bool },
    Failed,
}

/// One connection: connect, handshake, the request, the answer to its end.
async fn once(
    addr: SocketAddr,
    connector: &TlsConnector,
    request: &[u8],
    buf: &mut Vec<u8>,
) -> Outcome {
    let Ok(tcp) = TcpStream::connect(addr).await else {
        return Outcome::Failed;
    };
    let _ = tcp.set_nodelay(true);
    let name = ServerName::IpAddress(addr.ip().into());
    let Ok(mut tls) = connector.connect(name, tcp).await else {
        return Outcome::Failed;
    };
    let resumed = tls.get_ref().1.handshake_kind() == Some(HandshakeKind::Resumed);
    if tls.write_all(request).await.is_err() {
        return Outcome::Failed;
    }
    buf.clear();
    // To the end: the server closes after its answer (`Connection: close`). A
    // close without close_notify still ends a complete answer.
    let read = tls.read_to_end(buf).await;
    let complete = match read {
        Ok(_) => true,
        Err(e) => e.kind() == std::io::ErrorKind::UnexpectedEof && !buf.is_empty(),
    };
    if !complete || !buf.starts_with(b"HTTP/1.1 ") || buf.len() < 12 {
        return Outcome::Failed;
    }
    Outcome::Ok {
        status_2xx: buf[9] == b'2',
        resumed,
    }
}

#[derive(Default)]
struct Tally {
    latencies_us: Vec<u32>,
    errors: u64,
    non_2xx: u64,
    resumed: u64,
}

async fn run(args: Args) {
    // One client configuration per connection loop when resuming: a client
    // keeps only a few TLS 1.3 tickets per server, and each loop resumes from
    // the tickets of its own previous connection.
    let shared = TlsConnector::from(client_config(args.resume, args.classical));
    let args = Arc::new(args);
    let started = Instant::now();
    let deadline = started + args.duration;
    let tasks: Vec<_> = (0..args.conns)
        .map(|_| {
            let args = args.clone();
            let connector = if args.resume {
                TlsConnector::from(client_config(true, args.classical))
            } else {
                shared.clone()
            };
            tokio::spawn(async move {
                let mut tally = Tally::default();
                let mut buf = Vec::with_capacity(4096);
                while Instant::now() < deadline {
                    let t0 = Instant::now();
                    match once(args.addr, &connector, &args.request, &mut buf).await {
                        Outcome::Ok {
                            status_2xx,
                            resumed,
                        } => {
                            let us = t0.elapsed().as_micros().min(u32::MAX as u128) as u32;
                            tally.latencies_us.push(us);
                            tally.non_2xx += u64::from(!status_2xx);
                            tally.resumed += u64::from(resumed);
                        }
                        Outcome::Failed => tally.errors += 1,
                    }
                }
                tally
            })
        })
        .collect();
    let mut all = Tally::default();
    for task in tasks {
        let t = task.await.expect("a connection task panicked");
        all.latencies_us.extend(t.latencies_us);
        all.errors += t.errors;
        all.non_2xx += t.non_2xx;
        all.resumed += t.resumed;
    }
    let elapsed = started.elapsed();
    all.latencies_us.sort_unstable();
    let pct = |p: f64| -> u32 {
        let n = all.latencies_us.len();
        if n == 0 {
            return 0;
        }
        all.latencies_us[((n as f64 * p / 100.0).ceil() as usize).clamp(1, n) - 1]
    };
    println!(
        "WRKJSON {{\"requests\":{},\"duration_us\":{},\"errors\":{},\"non_2xx\":{},\"p50_us\":{},\"p99_us\":{},\"p999_us\":{},\"resumed\":{}}}",
        all.latencies_us.len(),
        elapsed.as_micros(),
        all.errors,
        all.non_2xx,
        pct(50.0),
        pct(99.0),
        pct(99.9),
        all.resumed
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        return;
    }
    let args = parse_args(args);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(run(args));
}
