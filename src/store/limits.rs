//! Rate limits held in the store: a key's own limit ([`LimitSpec`] on its
//! record) and an organization's override of a policy's quota
//! ([`OrgLimit`]). Both travel with the cached key or session, so the
//! pipeline reads them without a lookup and a change reaches every instance
//! within `cache_ttl`.
use std::num::NonZeroU32;
use std::time::Duration;

use crate::config::parse_duration;

/// Largest `requests` a stored limit accepts.
pub const MAX_LIMIT_REQUESTS: u32 = 1_000_000_000;
/// Longest `per` a stored limit accepts (the limiter's arithmetic holds
/// about 104 days exactly).
pub const MAX_LIMIT_PER: Duration = Duration::from_secs(30 * 86_400);

/// `requests` per `per`: a bucket of `requests` that refills in `per`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitSpec {
    /// Bucket capacity (`X-RateLimit-Limit`), 1 to [`MAX_LIMIT_REQUESTS`].
    pub requests: NonZeroU32,
    /// Time to refill the whole bucket, 1 ms to [`MAX_LIMIT_PER`], whole ms.
    pub per: Duration,
}

/// Which part of a limit is wrong, and why (for a message naming the field).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitProblem {
    /// `"requests"` or `"per"`.
    pub field: &'static str,
    /// What is expected.
    pub reason: String,
}

impl LimitSpec {
    /// A limit of `requests` per `per`, if both are in bounds.
    pub fn new(requests: u64, per: Duration) -> Result<Self, LimitProblem> {
        let requests = u32::try_from(requests)
            .ok()
            .filter(|n| *n <= MAX_LIMIT_REQUESTS)
            .and_then(NonZeroU32::new)
            .ok_or_else(|| LimitProblem {
                field: "requests",
                reason: format!("must be a whole number from 1 to {MAX_LIMIT_REQUESTS}"),
            })?;
        let per_problem = || LimitProblem {
            field: "per",
            reason: "must be a duration such as \"1m\", from 1ms to 30d".into(),
        };
        if per.is_zero() || per > MAX_LIMIT_PER || !per.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(per_problem());
        }
        Ok(Self { requests, per })
    }

    /// [`LimitSpec::new`] from a duration string such as `"1m"`.
    pub fn parse(requests: u64, per: &str) -> Result<Self, LimitProblem> {
        let per = parse_duration(per).map_err(|e| LimitProblem {
            field: "per",
            reason: format!("{e}; from 1ms to 30d"),
        })?;
        Self::new(requests, per)
    }

    /// `N/DURATION` as the command line writes it, e.g. `100/1m`.
    pub fn parse_slash(text: &str) -> Result<Self, LimitProblem> {
        let (n, per) = text.split_once('/').ok_or_else(|| LimitProblem {
            field: "requests",
            reason: "expected REQUESTS/DURATION, e.g. 100/1m".into(),
        })?;
        let n = n.trim().parse::<u64>().map_err(|_| LimitProblem {
            field: "requests",
            reason: format!("must be a whole number from 1 to {MAX_LIMIT_REQUESTS}"),
        })?;
        Self::parse(n, per.trim())
    }

    /// `per` in whole milliseconds, as stored.
    pub fn per_millis(&self) -> i64 {
        i64::try_from(self.per.as_millis()).unwrap_or(i64::MAX)
    }

    /// The stored columns back as a limit; `None` when either is null or out
    /// of bounds (a row written by hand), so the key falls back to its policy.
    pub fn from_columns(requests: Option<i64>, per_millis: Option<i64>) -> Option<Self> {
        let requests = u64::try_from(requests?).ok()?;
        let per = Duration::from_millis(u64::try_from(per_millis?).ok()?);
        Self::new(requests, per).ok()
    }
}

/// An organization's own quota for one named policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrgLimit {
    /// The organization whose requests get it.
    pub organization_id: String,
    /// The `[rate_limit.policies.NAME]` it overrides.
    pub policy: String,
    /// The quota used instead of the policy's.
    pub limit: LimitSpec,
}

/// The override `limits` hold for `org` under `policy`, if any.
pub fn org_limit<'a>(limits: &'a [OrgLimit], org: &str, policy: &str) -> Option<&'a LimitSpec> {
    limits
        .iter()
        .find(|l| l.policy == policy && l.organization_id == org)
        .map(|l| &l.limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_name_the_field() {
        let ok = LimitSpec::parse(100, "1m").unwrap();
        assert_eq!(ok.requests.get(), 100);
        assert_eq!(ok.per, Duration::from_secs(60));
        assert_eq!(LimitSpec::parse(0, "1m").unwrap_err().field, "requests");
        assert_eq!(
            LimitSpec::parse(u64::from(MAX_LIMIT_REQUESTS) + 1, "1m")
                .unwrap_err()
                .field,
            "requests"
        );
        for bad in ["0s", "31d", "1 minute", "", "-1s"] {
            assert_eq!(LimitSpec::parse(1, bad).unwrap_err().field, "per", "{bad}");
        }
        assert_eq!(LimitSpec::parse(1, "30d").unwrap().per, MAX_LIMIT_PER);
    }

    #[test]
    fn slash_form_and_columns_round_trip() {
        let l = LimitSpec::parse_slash("5/90s").unwrap();
        assert_eq!((l.requests.get(), l.per), (5, Duration::from_secs(90)));
        assert_eq!(
            LimitSpec::from_columns(Some(5), Some(l.per_millis())),
            Some(l)
        );
        assert_eq!(LimitSpec::from_columns(None, Some(1000)), None);
        assert_eq!(LimitSpec::from_columns(Some(0), Some(1000)), None);
        for bad in ["5", "x/1m", "5/", "/1m", "5/1y"] {
            assert!(LimitSpec::parse_slash(bad).is_err(), "{bad}");
        }
        assert_eq!(LimitSpec::parse_slash("5").unwrap_err().field, "requests");
        assert_eq!(LimitSpec::parse_slash("5/1y").unwrap_err().field, "per");
    }

    #[test]
    fn org_limit_matches_org_and_policy() {
        let limits = vec![OrgLimit {
            organization_id: "acme".into(),
            policy: "default".into(),
            limit: LimitSpec::parse(7, "1s").unwrap(),
        }];
        assert_eq!(
            org_limit(&limits, "acme", "default").map(|l| l.requests.get()),
            Some(7)
        );
        assert_eq!(org_limit(&limits, "acme", "other"), None);
        assert_eq!(org_limit(&limits, "globex", "default"), None);
    }
}
