//! Picking a target among the healthy ones not tried yet for this request:
//! round robin, or least outstanding requests (ties taken in turn, so equal
//! targets still share the load).
use std::sync::atomic::{AtomicUsize, Ordering};

use super::health::Targets;
use crate::config::Balance;

/// The balancing state of one upstream.
pub(crate) struct Balancer {
    policy: Balance,
    cursor: AtomicUsize,
}

impl Balancer {
    pub(crate) fn new(policy: Balance) -> Self {
        Balancer {
            policy,
            cursor: AtomicUsize::new(0),
        }
    }

    /// A target that is up at `now` and not in `skip`, or `None`.
    pub(crate) fn pick(&self, targets: &Targets, skip: &[usize], now: u64) -> Option<usize> {
        let n = targets.list.len();
        let start = self.cursor.fetch_add(1, Ordering::Relaxed) % n;
        let eligible = (0..n)
            .map(|k| (start + k) % n)
            .filter(|i| !skip.contains(i) && targets.is_up(*i, now));
        match self.policy {
            Balance::RoundRobin => eligible.into_iter().next(),
            Balance::LeastOutstanding => {
                eligible.min_by_key(|&i| targets.list[i].outstanding.load(Ordering::Relaxed))
            }
        }
    }
}

#[cfg(test)]
mod tests {
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
        // After the cool-down it is back.
        assert_eq!(b.pick(&t, &[0, 2], 6_000), Some(1));
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
}
