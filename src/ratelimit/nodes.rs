//! On a Redis Cluster, which primary serves each slot (`CLUSTER SLOTS`), and
//! which primaries are failing now: a failed call puts its slot's node in
//! fallback for a second, and only the keys of that node's slots fall back,
//! so the decisions of keys on live primaries stay exact. The map is read at
//! connect and again after a failure (at most once a second), so after a
//! failover the promoted replica's slots go back to Redis.
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ::redis::Value;
use arc_swap::ArcSwap;

/// The slots of a Redis Cluster.
const SLOTS: usize = 16_384;

/// The cluster slot of `key`: CRC16 (XMODEM) of its hash tag (the text between
/// its first `{` and the next `}`, if not empty) or else of the whole key,
/// modulo 16384, as Redis Cluster computes it. The redis crate routes each
/// command by the same function, but keeps its slot number private.
pub(crate) fn slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|b| *b == b'{')
        .and_then(|open| {
            let tag = &key[open + 1..];
            tag.iter()
                .position(|b| *b == b'}')
                .map(|close| &tag[..close])
        })
        .filter(|tag| !tag.is_empty())
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(hashed) % SLOTS as u16
}
/// The slot map is read again at most this often (after failures).
const REFRESH_EVERY_NANOS: u64 = 1_000_000_000;

/// The primary serving each slot, as `host:port`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct SlotMap {
    /// Per slot, an index into `nodes`; `u16::MAX` for a slot no node serves.
    owners: Vec<u16>,
    nodes: Vec<String>,
}

impl SlotMap {
    /// The map of a `CLUSTER SLOTS` reply: `[start, end, [host, port, …], replicas…]`
    /// per range. `None` if the reply is not one.
    pub(crate) fn parse(reply: &Value) -> Option<SlotMap> {
        let Value::Array(ranges) = reply else {
            return None;
        };
        let mut map = SlotMap {
            owners: vec![u16::MAX; SLOTS],
            nodes: Vec::new(),
        };
        for range in ranges {
            let Value::Array(fields) = range else {
                return None;
            };
            let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(primary))) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                return None;
            };
            let host = match primary.first()? {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                Value::SimpleString(s) => s.clone(),
                _ => return None,
            };
            let Some(Value::Int(port)) = primary.get(1) else {
                return None;
            };
            let name = format!("{host}:{port}");
            let index = match map.nodes.iter().position(|n| *n == name) {
                Some(i) => i,
                None => {
                    map.nodes.push(name);
                    map.nodes.len() - 1
                }
            };
            let index = u16::try_from(index).ok()?;
            let (start, end) = (usize::try_from(*start).ok()?, usize::try_from(*end).ok()?);
            for owner in map.owners.get_mut(start..=end)? {
                *owner = index;
            }
        }
        Some(map)
    }

    /// The node serving `slot`, if the map knows one.
    pub(crate) fn node(&self, slot: u16) -> Option<&str> {
        let index = *self.owners.get(usize::from(slot))?;
        self.nodes.get(usize::from(index)).map(String::as_str)
    }
}

/// The failing primaries of a cluster, by name, each with the clock time
/// before which its slots are not tried.
#[derive(Default)]
pub(super) struct NodeHealth {
    map: ArcSwap<SlotMap>,
    down: Mutex<HashMap<String, u64>>,
    /// Whether `down` holds any node: the one load a decision makes while
    /// every node answers.
    any_down: AtomicBool,
    /// When the map was last asked for (0: never).
    refreshed_at: AtomicU64,
}

impl NodeHealth {
    pub(super) fn new() -> Arc<NodeHealth> {
        Arc::default()
    }

    /// Puts `map` in use; a failing node it no longer names (its slots moved
    /// to a promoted replica) stops counting as down.
    pub(super) fn set_map(&self, map: SlotMap) {
        let mut down = lock(&self.down);
        down.retain(|node, _| map.nodes.iter().any(|n| n == node));
        self.any_down.store(!down.is_empty(), Ordering::Release);
        self.map.store(Arc::new(map));
    }

    /// True once per [`REFRESH_EVERY_NANOS`]: the caller reads the map again.
    pub(super) fn refresh_due(&self, now: u64) -> bool {
        let last = self.refreshed_at.load(Ordering::Acquire);
        (last == 0 || now >= last.saturating_add(REFRESH_EVERY_NANOS))
            && self
                .refreshed_at
                .compare_exchange(last, now.max(1), Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }

    /// Whether any node is failing now.
    pub(super) fn any_down(&self) -> bool {
        self.any_down.load(Ordering::Acquire)
    }

    /// The node serving `slot` ("" when the map does not know it: then all
    /// such slots share one breaker, as a single server's decisions do).
    pub(super) fn node_of(&self, slot: u16) -> String {
        self.map.load().node(slot).unwrap_or_default().to_owned()
    }

    /// Whether a decision for `slot` may go to Redis at `now`: its node is not
    /// failing, or its retry time has come (then this caller is the one probe
    /// until `probe_at`).
    pub(super) fn may_try(&self, slot: u16, now: u64, probe_at: u64) -> bool {
        if !self.any_down() {
            return true;
        }
        let node = self.node_of(slot);
        let mut down = lock(&self.down);
        match down.get_mut(&node) {
            None => true,
            Some(until) if now >= *until => {
                *until = probe_at;
                true
            }
            Some(_) => false,
        }
    }

    /// `slot`'s node failed: its slots fall back until `until`. Returns the node.
    pub(super) fn failed(&self, slot: u16, until: u64) -> String {
        let node = self.node_of(slot);
        lock(&self.down).insert(node.clone(), until);
        self.any_down.store(true, Ordering::Release);
        node
    }

    /// `slot`'s node answered: `Some(node)` if it was failing.
    pub(super) fn answered(&self, slot: u16) -> Option<String> {
        if !self.any_down() {
            return None;
        }
        let node = self.node_of(slot);
        let mut down = lock(&self.down);
        let was = down.remove(&node).map(|_| node);
        self.any_down.store(!down.is_empty(), Ordering::Release);
        was
    }

    /// The failing nodes, by name.
    pub(super) fn down(&self) -> Vec<String> {
        let mut nodes: Vec<String> = lock(&self.down).keys().cloned().collect();
        nodes.sort();
        nodes
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(start: i64, end: i64, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ]),
        ])
    }

    #[test]
    fn slots_are_redis_clusters_and_the_redis_crates() {
        // `CLUSTER KEYSLOT`'s examples in the Redis documentation.
        assert_eq!(slot(b"somekey"), 11058);
        assert_eq!(slot(b"foo{hash_tag}"), 2515);
        // A hash tag picks the slot; an empty one does not.
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_ne!(slot(b"{}x"), slot(b"x"));
        // The crate routes by the same slots (its number shows only in Debug).
        for key in [
            &b"mpg:rl:0:key_1"[..],
            b"{a}b",
            b"{}x",
            b"x{y}{z}",
            b"",
            b"}{",
        ] {
            let theirs = format!("{:?}", ::redis::cluster_routing::Slot::for_key(key));
            assert_eq!(theirs, format!("Slot({})", slot(key)), "{key:?}");
        }
    }

    #[test]
    fn a_cluster_slots_reply_maps_each_slot_to_its_primary() {
        let reply = Value::Array(vec![range(0, 5460, 7000), range(5461, 16383, 7001)]);
        let map = SlotMap::parse(&reply).unwrap();
        assert_eq!(map.node(0), Some("127.0.0.1:7000"));
        assert_eq!(map.node(5460), Some("127.0.0.1:7000"));
        assert_eq!(map.node(5461), Some("127.0.0.1:7001"));
        assert_eq!(map.node(16383), Some("127.0.0.1:7001"));
        assert_eq!(SlotMap::parse(&Value::Int(1)), None);
        assert_eq!(
            SlotMap::parse(&Value::Array(vec![range(0, 20000, 1)])),
            None
        );
    }

    #[test]
    fn only_the_failed_nodes_slots_fall_back_until_a_probe_succeeds() {
        let health = NodeHealth::new();
        let reply = Value::Array(vec![range(0, 99, 7000), range(100, 16383, 7001)]);
        health.set_map(SlotMap::parse(&reply).unwrap());
        assert!(health.may_try(5, 0, 10));
        assert_eq!(health.failed(5, 1_000), "127.0.0.1:7000");
        assert!(!health.may_try(99, 500, 1_500), "a slot of the same node");
        assert!(health.may_try(100, 500, 1_500), "a slot of a live node");
        assert!(
            health.may_try(7, 1_000, 2_000),
            "the probe, once its time came"
        );
        assert!(!health.may_try(8, 1_100, 2_100), "one probe at a time");
        assert_eq!(health.answered(7).as_deref(), Some("127.0.0.1:7000"));
        assert!(!health.any_down());
        assert!(health.may_try(8, 1_200, 2_200));
    }
}
