//! Picking a target among the healthy ones not tried yet for this request:
//! round robin, or least outstanding requests (ties taken in turn, so equal
//! targets still share the load). An ejected target whose back-off is over
//! gets the request, as its probe, if this request claims it first.
use std::sync::atomic::{AtomicUsize, Ordering};

use super::health::{Availability, Targets};
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

    /// A target that is up at `now` and not in `skip` (or a half-open one
    /// whose probe this request claimed), or `None`.
    pub(crate) fn pick(&self, targets: &Targets, skip: &[usize], now: u64) -> Option<usize> {
        let n = targets.list.len();
        let start = self.cursor.fetch_add(1, Ordering::Relaxed) % n;
        let mut least: Option<(usize, usize)> = None;
        for i in (0..n).map(|k| (start + k) % n) {
            if skip.contains(&i) {
                continue;
            }
            match targets.availability(i, now) {
                Availability::Up => match self.policy {
                    Balance::RoundRobin => return Some(i),
                    Balance::LeastOutstanding => {
                        let load = targets.list[i].outstanding.load(Ordering::Relaxed);
                        if least.is_none_or(|(_, l)| load < l) {
                            least = Some((i, load));
                        }
                    }
                },
                Availability::Out => {}
                Availability::HalfOpen => {
                    if targets.claim_probe(i, now) {
                        return Some(i);
                    }
                }
            }
        }
        least.map(|(i, _)| i)
    }
}

#[cfg(test)]
mod tests;
