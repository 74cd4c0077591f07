use super::*;
use http::uri::{Authority, Scheme};
use std::time::Duration;

fn targets(n: usize) -> Targets {
    let list = (0..n)
        .map(|i| {
            let a = format!("127.0.0.1:{}", 2000 + i);
            (Scheme::HTTP, Authority::try_from(a.clone()).unwrap(), a)
        })
        .collect();
    Targets::new(
        "b",
        list,
        4,
        1,
        Duration::from_secs(5),
        Duration::from_secs(60),
    )
}

#[test]
fn round_robin_takes_each_healthy_target_in_turn_and_skips_tried_ones() {
    let t = targets(3);
    let b = Balancer::new(Balance::RoundRobin);
    let picks: Vec<_> = (0..6).map(|_| b.pick(&t, &[], 1).unwrap()).collect();
    assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
    t.failed(1, 1);
    let picks: Vec<_> = (0..4).map(|_| b.pick(&t, &[], 2).unwrap()).collect();
    assert!(!picks.contains(&1), "{picks:?}");
    assert_eq!(b.pick(&t, &[0, 2], 2), None);
    // After its back-off, one request probes it; the others do not.
    assert_eq!(b.pick(&t, &[0, 2], 6_000), Some(1));
    assert_eq!(b.pick(&t, &[0, 2], 6_001), None);
    let picks: Vec<_> = (0..4).map(|_| b.pick(&t, &[], 6_002).unwrap()).collect();
    assert!(!picks.contains(&1), "{picks:?}");
    // The probe succeeded: back in rotation.
    t.succeeded(1);
    let picks: Vec<_> = (0..3).map(|_| b.pick(&t, &[], 6_003).unwrap()).collect();
    assert!(picks.contains(&1), "{picks:?}");
}

#[test]
fn a_half_open_target_is_probed_whatever_the_policy_and_only_once() {
    for policy in [Balance::RoundRobin, Balance::LeastOutstanding] {
        let t = targets(2);
        let b = Balancer::new(policy);
        t.failed(0, 1);
        // Busy or not, the other target does not hide the probe.
        t.list[1].outstanding.store(0, Ordering::Relaxed);
        let picks: Vec<_> = (0..4).map(|_| b.pick(&t, &[], 1_000).unwrap()).collect();
        assert_eq!(
            picks.iter().filter(|&&i| i == 0).count(),
            1,
            "{policy:?}: {picks:?}"
        );
    }
}

#[test]
fn least_outstanding_prefers_the_idle_target_and_rotates_ties() {
    let t = targets(3);
    let b = Balancer::new(Balance::LeastOutstanding);
    t.list[0].outstanding.store(5, Ordering::Relaxed);
    t.list[1].outstanding.store(1, Ordering::Relaxed);
    t.list[2].outstanding.store(1, Ordering::Relaxed);
    let picks: Vec<_> = (0..4).map(|_| b.pick(&t, &[], 1).unwrap()).collect();
    assert!(picks.iter().all(|&i| i != 0), "{picks:?}");
    assert!(picks.contains(&1) && picks.contains(&2), "{picks:?}");
    assert_eq!(b.pick(&t, &[1, 2], 1), Some(0));
}
