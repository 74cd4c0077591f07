//! Proxy throughput and latency across 1, 2 and 4 targets: fast hyper
//! upstreams on 127.0.0.1, the gateway in-process (plain HTTP, a route with
//! no authentication or rate limit), and a bounded load of keep-alive
//! HTTP/1.1 clients. Prints requests per second and p50/p99 latency.
//!
//! Run with `cargo bench --bench forwarding`. Under `cargo test` (no
//! `--bench` argument) it only checks that it builds, and exits at once.
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};

/// Concurrent client connections.
const CLIENTS: usize = 32;
/// Measured time per target count (after a short warm-up).
const RUN: Duration = Duration::from_secs(4);
const WARMUP: Duration = Duration::from_millis(500);

async fn upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let svc = service_fn(|_req: Request<Incoming>| async {
                    Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(
                        b"{\"ok\":true}",
                    ))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

async fn gateway(targets: &[SocketAddr], dir: &std::path::Path) -> mpg_gateway::app::Running {
    let list: Vec<String> = targets.iter().map(|a| format!("\"http://{a}\"")).collect();
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\ninsecure_http = true\n[admin]\nenabled = false\n\
         [store]\npath = {:?}\n[upstreams.bench]\ntargets = [{}]\n\
         [[routes]]\nmethod = \"GET\"\npath = \"/bench/{{x}}\"\nauth = \"none\"\nupstream = \"bench\"\nrate_limit = \"none\"\n",
        dir.join(format!("gw{}.db", targets.len())).to_str().unwrap(),
        list.join(", ")
    );
    let settings = mpg_gateway::config::Settings::parse(&text).expect("bench config");
    mpg_gateway::app::start(settings, None)
        .await
        .expect("gateway starts")
}

/// One keep-alive client: requests back to back until `until`; latencies in µs.
async fn client(addr: SocketAddr, measure_from: Instant, until: Instant) -> Vec<u32> {
    let stream = TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut latencies = Vec::with_capacity(100_000);
    while Instant::now() < until {
        let req = Request::get("/bench/x")
            .header("host", addr.to_string())
            .body(Empty::<Bytes>::new())
            .unwrap();
        let started = Instant::now();
        let res = send.send_request(req).await.unwrap();
        assert!(res.status().is_success(), "{}", res.status());
        res.into_body().collect().await.unwrap();
        if started >= measure_from {
            latencies.push(started.elapsed().as_micros() as u32);
        }
    }
    latencies
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("forwarding bench: skipped (run `cargo bench --bench forwarding`)");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        println!("targets  clients  requests/s  p50 ms  p99 ms");
        for n in [1usize, 2, 4] {
            let mut targets = Vec::new();
            for _ in 0..n {
                targets.push(upstream().await);
            }
            let gw = gateway(&targets, dir.path()).await;
            let start = Instant::now();
            let measure_from = start + WARMUP;
            let until = measure_from + RUN;
            let tasks: Vec<_> = (0..CLIENTS)
                .map(|_| tokio::spawn(client(gw.addr, measure_from, until)))
                .collect();
            let mut all = Vec::new();
            for t in tasks {
                all.extend(t.await.unwrap());
            }
            all.sort_unstable();
            let rps = all.len() as f64 / RUN.as_secs_f64();
            println!(
                "{n:>7}  {CLIENTS:>7}  {rps:>10.0}  {:>6.2}  {:>6.2}",
                percentile(&all, 0.50),
                percentile(&all, 0.99)
            );
            gw.stop().await;
        }
    });
}
