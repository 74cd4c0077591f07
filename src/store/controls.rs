//! A key's controls beyond its scopes and limits ([`KeyControls`]): whether
//! it is enabled, the client addresses it works from, the metadata it
//! carries to upstreams, and its usage credits with their refill. Each value
//! is checked here, once, for the API and the command line alike; a problem
//! names its field ([`ControlProblem`]).
use std::time::Duration;

use ipnet::IpNet;

use crate::config::parse_duration;

/// Largest `meta`, as compact JSON text.
pub const MAX_META_BYTES: usize = 4096;
/// Most entries of an `ip_allow` list.
pub const MAX_IP_ALLOW: usize = 100;
/// Largest credit count (and refill amount): exact in a double, so Redis's
/// Lua keeps it exactly.
pub const MAX_CREDITS: u64 = 1 << 52;
/// Shortest refill interval.
pub const MIN_REFILL: Duration = Duration::from_secs(60);
/// Longest refill interval.
pub const MAX_REFILL: Duration = Duration::from_secs(366 * 86_400);

/// The controls of an API key. The default is what a key had before they
/// existed: enabled, from anywhere, no metadata, unlimited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyControls {
    /// False: the key is refused (401, `disabled`) until enabled again.
    pub enabled: bool,
    /// The networks the key works from; `None`: any.
    pub ip_allow: Option<Vec<IpNet>>,
    /// A JSON object (compact text, at most [`MAX_META_BYTES`]), or `None`.
    pub meta: Option<String>,
    /// Usage credits; `None`: unlimited.
    pub credits: Option<Credits>,
}

impl Default for KeyControls {
    fn default() -> Self {
        KeyControls {
            enabled: true,
            ip_allow: None,
            meta: None,
            credits: None,
        }
    }
}

/// A key's usage credits: what is left, and the refill if there is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Credits {
    /// Credits left at `period` (the refill period this count belongs to).
    pub remaining: u64,
    /// Sets the count to `amount` at every interval boundary, counted from
    /// the key's creation.
    pub refill: Option<Refill>,
    /// The refill period `remaining` was counted in (0 without a refill).
    pub period: i64,
    /// Bumped each time the credits are set (create, update): a count kept
    /// elsewhere (Redis, an instance's memory) for an older generation is
    /// replaced by this one.
    pub generation: i64,
}

/// `amount` credits every `interval`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refill {
    /// The count after each refill.
    pub amount: u64,
    /// Whole seconds, [`MIN_REFILL`] to [`MAX_REFILL`].
    pub interval: Duration,
}

/// Which field of a control is wrong, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlProblem {
    /// The field, as the API names it (`ip_allow`, `credits.refill.interval`).
    pub field: &'static str,
    /// What is expected.
    pub reason: String,
}

fn problem(field: &'static str, reason: impl Into<String>) -> ControlProblem {
    ControlProblem {
        field,
        reason: reason.into(),
    }
}

// === impl Credits ===

impl Credits {
    /// Fresh credits: `remaining` now, refilled as `refill` says, counted
    /// in the current period of a key created at `created_at`.
    pub fn new(remaining: u64, refill: Option<Refill>, created_at: i64, now: i64) -> Self {
        let mut credits = Credits {
            remaining,
            refill,
            period: 0,
            generation: 0,
        };
        credits.period = credits.period_at(created_at, now);
        credits
    }

    /// The refill period at `now` of a key created at `created_at` (0
    /// without a refill).
    pub fn period_at(&self, created_at: i64, now: i64) -> i64 {
        match self.refill {
            Some(r) => (now - created_at).max(0) / r.interval.as_secs().max(1) as i64,
            None => 0,
        }
    }

    /// The credits left at `now`: `remaining`, or the refill's amount once a
    /// boundary has passed since it was counted.
    pub fn remaining_at(&self, created_at: i64, now: i64) -> u64 {
        match self.refill {
            Some(r) if self.period_at(created_at, now) > self.period => r.amount,
            _ => self.remaining,
        }
    }

    /// Unix seconds of the next refill after `now`, if there is one.
    pub fn next_refill(&self, created_at: i64, now: i64) -> Option<i64> {
        let r = self.refill?;
        let secs = r.interval.as_secs().max(1) as i64;
        Some(created_at + (self.period_at(created_at, now) + 1) * secs)
    }
}

/// A credit count: 0 to [`MAX_CREDITS`].
pub fn credit_count(field: &'static str, n: i128) -> Result<u64, ControlProblem> {
    u64::try_from(n)
        .ok()
        .filter(|n| *n <= MAX_CREDITS)
        .ok_or_else(|| {
            problem(
                field,
                format!("must be a whole number from 0 to {MAX_CREDITS}"),
            )
        })
}

/// A refill interval such as `"1d"`: whole seconds, 1 minute to 366 days.
pub fn refill_interval(text: &str) -> Result<Duration, ControlProblem> {
    let field = "credits.refill.interval";
    let d = parse_duration(text).map_err(|e| problem(field, e.to_string()))?;
    if d < MIN_REFILL || d > MAX_REFILL || d.subsec_nanos() != 0 {
        return Err(problem(
            field,
            "must be whole seconds from 1 minute to 366 days, such as \"1d\"",
        ));
    }
    Ok(d)
}

/// A refill as the command line writes it: `N/1d`.
pub fn parse_refill(text: &str) -> Result<Refill, ControlProblem> {
    let (amount, interval) = text.split_once('/').ok_or_else(|| {
        problem(
            "credits.refill",
            "must be an amount and an interval, such as 1000/1d",
        )
    })?;
    let amount = amount
        .trim()
        .parse::<i128>()
        .map_err(|_| problem("credits.refill.amount", "must be a whole number"))?;
    Ok(Refill {
        amount: credit_count("credits.refill.amount", amount)?,
        interval: refill_interval(interval.trim())?,
    })
}

/// One `ip_allow` entry: a network in CIDR form with no host bits set, or a
/// bare address (one host). `10.0.0.1/8` is refused: it reads as one host
/// and means sixteen million.
pub fn parse_cidr(text: &str) -> Result<IpNet, ControlProblem> {
    let net = match text.parse::<IpNet>() {
        Ok(net) => net,
        Err(_) => match text.parse::<std::net::IpAddr>() {
            Ok(ip) => IpNet::from(ip),
            Err(_) => {
                return Err(problem(
                    "ip_allow",
                    format!("{text:?} is not an address or a CIDR such as 203.0.113.0/24"),
                ))
            }
        },
    };
    if net.trunc() != net {
        return Err(problem(
            "ip_allow",
            format!("{text:?} has host bits set; the network is {}", net.trunc()),
        ));
    }
    Ok(net)
}

/// An `ip_allow` list: 1 to [`MAX_IP_ALLOW`] entries, each [`parse_cidr`].
pub fn parse_ip_allow<'a>(
    entries: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<IpNet>, ControlProblem> {
    let nets = entries
        .into_iter()
        .map(parse_cidr)
        .collect::<Result<Vec<_>, _>>()?;
    if nets.is_empty() || nets.len() > MAX_IP_ALLOW {
        return Err(problem(
            "ip_allow",
            format!("must list 1 to {MAX_IP_ALLOW} networks, or be null"),
        ));
    }
    Ok(nets)
}

/// `meta`: a JSON object, at most [`MAX_META_BYTES`] as compact text, which
/// is what is kept.
pub fn meta_text(value: &serde_json::Value) -> Result<String, ControlProblem> {
    if !value.is_object() {
        return Err(problem("meta", "must be a JSON object, or null"));
    }
    let text = value.to_string();
    if text.len() > MAX_META_BYTES {
        return Err(problem(
            "meta",
            format!(
                "is {} bytes as compact JSON; at most {MAX_META_BYTES}",
                text.len()
            ),
        ));
    }
    Ok(text)
}

/// Whether `ip` is in one of `nets`; an IPv4-mapped IPv6 address
/// (`::ffff:a.b.c.d`) is its IPv4 address.
pub fn ip_allowed(nets: &[IpNet], ip: std::net::IpAddr) -> bool {
    let ip = match ip {
        std::net::IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4),
        v4 => v4,
    };
    nets.iter().any(|net| net.contains(&ip))
}

/// The list as stored: entries one comma apart.
pub fn ip_allow_text(nets: &[IpNet]) -> String {
    nets.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_with_host_bits_are_refused_and_bare_addresses_are_hosts() {
        assert_eq!(
            parse_cidr("10.0.0.0/8").map(|n| n.to_string()),
            Ok("10.0.0.0/8".into())
        );
        assert_eq!(
            parse_cidr("203.0.113.7").map(|n| n.to_string()),
            Ok("203.0.113.7/32".into())
        );
        assert_eq!(
            parse_cidr("2001:db8::/32").map(|n| n.to_string()),
            Ok("2001:db8::/32".into())
        );
        for bad in ["10.0.0.1/8", "2001:db8::1/32", "10.0.0.0/33", "nope", ""] {
            let e = parse_cidr(bad).unwrap_err();
            assert_eq!(e.field, "ip_allow", "{bad}");
        }
        assert!(parse_cidr("10.0.0.1/8")
            .unwrap_err()
            .reason
            .contains("10.0.0.0/8"));
        assert!(parse_ip_allow([]).is_err());
    }

    #[test]
    fn a_mapped_ipv6_address_matches_its_ipv4_entry() {
        let nets = parse_ip_allow(["203.0.113.0/24", "2001:db8::/32"]).unwrap();
        let ok = |s: &str| ip_allowed(&nets, s.parse().unwrap());
        assert!(ok("203.0.113.9"));
        assert!(ok("::ffff:203.0.113.9"));
        assert!(ok("2001:db8::5"));
        assert!(!ok("203.0.114.1"));
        assert!(!ok("::ffff:203.0.114.1"));
        assert!(!ok("2001:db9::1"));
    }

    #[test]
    fn meta_is_an_object_of_at_most_4_kib() {
        let big = serde_json::json!({ "x": "a".repeat(MAX_META_BYTES) });
        assert_eq!(meta_text(&big).unwrap_err().field, "meta");
        assert_eq!(
            meta_text(&serde_json::json!([1])).unwrap_err().field,
            "meta"
        );
        assert_eq!(
            meta_text(&serde_json::json!({ "plan": "pro" })).unwrap(),
            r#"{"plan":"pro"}"#
        );
        let edge = serde_json::json!({ "x": "a".repeat(MAX_META_BYTES - 8) });
        assert_eq!(meta_text(&edge).map(|t| t.len()), Ok(MAX_META_BYTES));
    }

    #[test]
    fn refills_are_a_minute_or_more_and_counts_are_not_negative() {
        assert_eq!(
            parse_refill("1000/1d"),
            Ok(Refill {
                amount: 1000,
                interval: Duration::from_secs(86_400)
            })
        );
        for (bad, field) in [
            ("10/59s", "credits.refill.interval"),
            ("10/1500ms", "credits.refill.interval"),
            ("-1/1d", "credits.refill.amount"),
            ("x/1d", "credits.refill.amount"),
            ("10", "credits.refill"),
        ] {
            assert_eq!(parse_refill(bad).unwrap_err().field, field, "{bad}");
        }
        assert!(credit_count("credits.remaining", -1).is_err());
        assert!(credit_count("credits.remaining", (MAX_CREDITS + 1).into()).is_err());
    }

    #[test]
    fn a_refill_sets_the_amount_at_each_boundary_from_creation() {
        let day = Refill {
            amount: 1000,
            interval: Duration::from_secs(86_400),
        };
        let mut c = Credits::new(5, Some(day), 100, 100 + 3600);
        assert_eq!(c.period, 0);
        assert_eq!(c.remaining_at(100, 100 + 86_399), 5);
        assert_eq!(c.remaining_at(100, 100 + 86_400), 1000);
        assert_eq!(c.next_refill(100, 100 + 10), Some(100 + 86_400));
        c.refill = None;
        assert_eq!(c.remaining_at(100, i64::MAX / 2), 5);
        assert_eq!(c.next_refill(100, 100), None);
    }
}
