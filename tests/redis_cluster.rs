//! The shared limiter on a Redis Cluster (`redis+cluster://`): three primaries
//! the test starts on loopback, buckets spread over their slots, one limit
//! held by two gateway instances, and the script reloaded on every node after
//! `SCRIPT FLUSH` (EVALSHA answered NOSCRIPT); and a cluster speaking only TLS
//! (`rediss+cluster://` with `rate_limit.redis_ca_file`); and a primary that
//! dies, with only its own slots falling back until its replica takes over.
mod common;

use common::backends::RedisCluster;
use common::*;
use std::net::IpAddr;
use std::time::Duration;

/// Policy `ip`: 3 requests an hour per client IP on `/public/ping`, counted
/// in the cluster at `url`; refusing everything while Redis fails, so a
/// fallback cannot pass for the cluster.
fn config(up: &MockUpstream, url: &str) -> TestConfig {
    let mut cfg = TestConfig::new(up.addr);
    cfg.set("rate_limit.policies.ip.requests", 3);
    cfg.set("rate_limit.policies.ip.per", "1h");
    cfg.set("rate_limit.policies.ip.key", "client_ip");
    cfg.route("method = \"GET\"\npath = \"/public/ping\"\nauth = \"none\"\nupstream = \"clusters\"\nrate_limit = \"ip\"");
    cfg.set("rate_limit.backend", "redis");
    cfg.set("rate_limit.redis_url", url);
    cfg.set("rate_limit.redis_timeout", "2s");
    cfg.set("rate_limit.on_backend_error", "deny");
    cfg
}

/// A client sending from loopback address 127.0.0.`last` (its own bucket).
fn client_from(last: u8) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(IpAddr::from([127, 0, 0, last]))
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// Five requests from each of `clients`, alternating between the gateways.
async fn five_each(gws: &[Gateway; 2], clients: std::ops::Range<u8>) {
    for last in clients {
        let client = client_from(last);
        let mut seen = Vec::new();
        for i in 0..5 {
            let gw = &gws[(usize::from(last) + i) % 2];
            let res = client.get(gw.url("/public/ping")).send().await.unwrap();
            seen.push(res.status().as_u16());
        }
        // One bucket for both instances: three in all, then refusals.
        assert_eq!(seen, [200, 200, 200, 429, 429], "client 127.0.0.{last}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_spread_over_the_cluster_and_two_instances_hold_one_limit() {
    let cluster = RedisCluster::start(3);
    let up = MockUpstream::start().await;
    let cfg = config(&up, &cluster.url());
    let path = cfg.write();
    let (code, _, err) = cli(&path, &["check-config"]);
    assert_eq!(code, 0, "{err}");
    let gws = [Gateway::start(&path), Gateway::start(&path)];

    five_each(&gws, 10..34).await;
    // Every bucket is in the cluster, and every node holds some.
    let mut total = 0;
    for &port in &cluster.ports {
        let keys = cluster.keys_on(port, "mpg:rl:");
        assert!(!keys.is_empty(), "node {port} holds no bucket");
        total += keys.len();
    }
    assert_eq!(total, 24);

    // Every node forgets the script: the next calls load it again.
    for &port in &cluster.ports {
        assert_eq!(cluster.cli(port, &["SCRIPT", "FLUSH"]).trim(), "OK");
    }
    five_each(&gws, 40..52).await;
    for gw in &gws {
        let log = gw.log_text();
        assert!(!log.contains("rate-limit backend redis"), "{log}");
    }
}

/// Decisions for many buckets at once share a batch in each gateway, split by slot: every
/// client, all of its requests sent together to both instances, still gets exactly three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_decisions_over_many_slots_are_each_exact() {
    let cluster = RedisCluster::start(3);
    let up = MockUpstream::start().await;
    let cfg = config(&up, &cluster.url());
    let path = cfg.write();
    let gws = std::sync::Arc::new([Gateway::start(&path), Gateway::start(&path)]);
    let mut clients = Vec::new();
    for last in 60..90u8 {
        let gws = gws.clone();
        clients.push(tokio::spawn(async move {
            let client = client_from(last);
            let sent = (0..6).map(|i| {
                client
                    .get(gws[(usize::from(last) + i) % 2].url("/public/ping"))
                    .send()
            });
            let mut ok = 0;
            for res in futures_util::future::join_all(sent).await {
                let status = res.unwrap().status().as_u16();
                assert!(status == 200 || status == 429, "{status}");
                ok += usize::from(status == 200);
            }
            (last, ok)
        }));
    }
    for client in clients {
        let (last, ok) = client.await.unwrap();
        assert_eq!(ok, 3, "client 127.0.0.{last}");
    }
    for &port in &cluster.ports {
        assert!(!cluster.keys_on(port, "mpg:rl:").is_empty(), "node {port}");
    }
    for gw in gws.iter() {
        let log = gw.log_text();
        assert!(!log.contains("rate-limit backend redis"), "{log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_speaking_tls_is_reached_with_its_ca_file() {
    let cluster = RedisCluster::start_tls(3);
    let up = MockUpstream::start().await;
    let mut cfg = config(&up, &cluster.url());
    let ca = &cluster.pki.as_ref().unwrap().ca;
    cfg.set("rate_limit.redis_ca_file", ca.to_str().unwrap());
    let path = cfg.write();
    let gws = [Gateway::start(&path), Gateway::start(&path)];
    five_each(&gws, 10..22).await;
    let total: usize = cluster
        .ports
        .iter()
        .map(|&port| cluster.keys_on(port, "mpg:rl:").len())
        .sum();
    assert_eq!(total, 12);
}

#[tokio::test]
async fn check_config_reads_a_cluster_url_as_the_limiter_does() {
    let up = MockUpstream::start().await;
    let cfg = config(
        &up,
        "redis+cluster://:s3cret@127.0.0.1:7000,,127.0.0.1:7001",
    );
    let (code, _, err) = cli(&cfg.write(), &["check-config"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(
            ": 1 problem(s)\n  rate_limit.redis_url: invalid Redis settings: invalid Redis Cluster url"
        ),
        "{err}"
    );
    assert!(!err.contains("s3cret"), "{err}");
}

/// An authenticated route: each request's auth-failure guard (keyed by client address)
/// and its key's policy bucket are in the cluster, mostly in different slots, so the two
/// decisions go as two calls, the second only when the guard allows. Both instances hold
/// one guard and one bucket, and a guard refusal takes no token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_and_the_policy_hold_across_slots_and_instances() {
    let cluster = RedisCluster::start(3);
    let up = MockUpstream::start().await;
    let mut cfg = config(&up, &cluster.url());
    cfg.set("rate_limit.policies.default.requests", 100);
    cfg.set("rate_limit.policies.default.per", "1h");
    cfg.set("rate_limit.policies.default.key", "credential");
    cfg.set("rate_limit.auth_failures.requests", 2);
    cfg.set("rate_limit.auth_failures.per", "1h");
    let path = cfg.write();
    let seed = seed(&path, "acme", "alice", "owner", "clusters:read");
    let gws = [Gateway::start(&path), Gateway::start(&path)];
    let bad = format!("mpg_{}", "x".repeat(38));
    let target = "/api/v1/clusters?organization_id=acme";
    let mut admitted = 0;
    for last in 10..20u8 {
        let client = client_from(last);
        let mut seen = Vec::new();
        for (i, key) in [&seed.key, &bad, &seed.key, &bad, &seed.key, &bad]
            .into_iter()
            .enumerate()
        {
            let gw = &gws[(usize::from(last) + i) % 2];
            let res = client.get(gw.url(target)).bearer_auth(key).send().await;
            seen.push(res.unwrap().status().as_u16());
        }
        assert_eq!(
            seen,
            [200, 401, 200, 401, 429, 429],
            "client 127.0.0.{last}"
        );
        admitted += 2;
    }
    let res = client_from(30)
        .get(gws[1].url(target))
        .bearer_auth(&seed.key)
        .send()
        .await
        .unwrap();
    let remaining = res.headers()["x-ratelimit-remaining"].to_str().unwrap();
    assert_eq!(remaining, (100 - admitted - 1).to_string());
    for gw in &gws {
        let log = gw.log_text();
        assert!(!log.contains("rate-limit backend redis"), "{log}");
    }
}

/// `GET /public/ping` `n` times from `client`, alternating between `gws`: the statuses.
async fn statuses(client: &reqwest::Client, gws: &[Gateway; 2], n: usize) -> Vec<u16> {
    let mut seen = Vec::new();
    for i in 0..n {
        let res = client.get(gws[i % 2].url("/public/ping")).send().await;
        seen.push(res.map_or(0, |r| r.status().as_u16()));
    }
    seen
}

/// `/readyz`'s `rate_limiter.nodes_down` of `gw`.
async fn nodes_down(gw: &Gateway) -> Vec<String> {
    let ready = readyz(gw).await;
    serde_json::from_value(ready["rate_limiter"]["nodes_down"].clone()).unwrap()
}

/// One primary of three dies (each has a replica). The buckets on the other
/// primaries stay exact across two instances; only the dead primary's slots
/// fall back, counted by node and named by `/readyz`; and once its replica
/// is promoted the limiter follows the new topology without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_primary_loosens_only_its_own_slots_and_its_failover_is_followed() {
    let mut cluster = RedisCluster::start_with_replicas(3, 1);
    let up = MockUpstream::start().await;
    let mut cfg = config(&up, &cluster.url());
    cfg.set("rate_limit.on_backend_error", "local");
    cfg.set("rate_limit.redis_timeout", "500ms");
    cfg.set("admin.enabled", true);
    cfg.set("admin.listen", "127.0.0.1:0");
    let path = cfg.write();
    let gws = [Gateway::start(&path), Gateway::start(&path)];

    // One request from each client, so that each has a bucket: where it lives.
    for last in 100..160u8 {
        let res = client_from(last)
            .get(gws[0].url("/public/ping"))
            .send()
            .await;
        assert_eq!(res.unwrap().status(), 200);
    }
    let primaries = cluster.primaries(cluster.ports[0]);
    assert_eq!(primaries.len(), 3, "three primaries");
    let owner = |last: u8| {
        let suffix = format!(":127.0.0.{last}");
        primaries.iter().copied().find(|&p| {
            cluster
                .keys_on(p, "mpg:rl:")
                .iter()
                .any(|k| k.ends_with(&suffix))
        })
    };
    let owners: Vec<(u8, u16)> = (100..160u8).map(|l| (l, owner(l).unwrap())).collect();
    let dead = owners[0].1;
    let on_dead: Vec<u8> = owners.iter().filter(|o| o.1 == dead).map(|o| o.0).collect();
    let elsewhere: Vec<u8> = owners.iter().filter(|o| o.1 != dead).map(|o| o.0).collect();
    assert!(on_dead.len() >= 3 && elsewhere.len() >= 3, "{owners:?}");
    cluster.kill(dead);
    let node = format!("127.0.0.1:{dead}");

    // The dead primary's buckets fall back (answered, never a 5xx).
    for seen in statuses(&client_from(on_dead[1]), &gws, 4).await {
        assert!(seen == 200 || seen == 429, "{seen}");
    }
    assert!(nodes_down(&gws[0]).await.contains(&node));
    let metrics = common::scale::metrics(gws[0].admin.unwrap()).await;
    assert!(
        metrics.contains(&format!(
            "mpg_rate_limit_node_fallbacks_total{{node=\"{node}\"}}"
        )),
        "fallbacks counted by node"
    );
    // Meanwhile every other bucket is still one for both instances: 3 an hour,
    // one of them spent above.
    for &last in &elsewhere[..3] {
        let seen = statuses(&client_from(last), &gws, 6).await;
        assert_eq!(
            seen,
            [200, 200, 429, 429, 429, 429],
            "client 127.0.0.{last}"
        );
    }

    // Its replica takes over (as an operator or an orchestrator forces it);
    // traffic on the old slots finds it, and the node stops counting as down.
    let live = elsewhere_port(&primaries, dead);
    let replica = cluster
        .replica_of(live, dead)
        .expect("the dead primary's replica");
    let answer = cluster.cli(replica, &["CLUSTER", "FAILOVER", "TAKEOVER"]);
    assert_eq!(answer.trim(), "OK");
    let start = std::time::Instant::now();
    while !(cluster.primaries(live).contains(&replica)
        && cluster
            .cli(live, &["CLUSTER", "INFO"])
            .contains("cluster_state:ok"))
    {
        assert!(start.elapsed() < Duration::from_secs(30), "no failover");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let start = std::time::Instant::now();
    loop {
        statuses(&client_from(on_dead[1]), &gws, 2).await;
        if nodes_down(&gws[0]).await.is_empty() && nodes_down(&gws[1]).await.is_empty() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "still down after the failover: {}\n{}\n{:?}",
            cluster.cli(live, &["CLUSTER", "NODES"]),
            cluster.cli(live, &["CLUSTER", "SLOTS"]),
            nodes_down(&gws[0]).await
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // A bucket on the promoted replica: one for both instances again, at most
    // 3 an hour (the one spent before the kill may be lost, replication being
    // asynchronous); in-process fallback would give 3 per instance.
    let seen = statuses(&client_from(on_dead[2]), &gws, 8).await;
    let allowed = seen.iter().filter(|&&s| s == 200).count();
    assert!(allowed <= 3, "{seen:?}: decided in Redis");
    assert!(seen.iter().all(|&s| s == 200 || s == 429), "{seen:?}");
}

fn elsewhere_port(primaries: &[u16], dead: u16) -> u16 {
    *primaries.iter().find(|&&p| p != dead).unwrap()
}
