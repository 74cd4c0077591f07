//! The limiter's side of usage credits: a key's credits spent with its
//! rate-limit token (in the same Redis call), or alone, given back, and
//! looked at; the counts themselves are the [`CreditBook`]'s.
use std::sync::Arc;

use super::super::credits::{self, CreditBook, CreditSpend, Spent};
use super::super::gcra::{self, Gcra, Op};
use super::super::{Decision, OnBackendError, PolicyId, Quota};
use super::{RateLimiter, Remote};

impl RateLimiter {
    /// [`Self::check`] (with `quota`: [`Self::check_with`]), then, only if its token is
    /// taken, `credit`'s spend, as [`Self::guarded_spend`] makes it.
    pub async fn check_spending(
        &self,
        policy: PolicyId,
        key: &str,
        quota: Option<&Quota>,
        credit: Option<(&CreditSpend<'_>, i64)>,
    ) -> (Decision, Option<Spent>) {
        let known = match quota {
            None => policy.0 < self.auth_policy.0,
            Some(_) => policy != self.auth_policy && policy.0 < self.gcras.len(),
        };
        if !known {
            return (gcra::unknown_policy_decision(self.now()), None);
        }
        let gcra = quota.map(Gcra::new);
        let Some(remote) = &self.remote else {
            let decision = self.local_op(policy, key, Op::Check, gcra.as_ref());
            return (decision, self.local_spend(decision.allowed, credit));
        };
        Box::pin(self.spend_remote(remote, policy, key, gcra.as_ref(), credit)).await
    }

    /// A credit spend in process, made only after an allowed decision.
    pub(super) fn local_spend(
        &self,
        allowed: bool,
        credit: Option<(&CreditSpend<'_>, i64)>,
    ) -> Option<Spent> {
        let (spend, now) = credit.filter(|_| allowed)?;
        Some(self.credits.spend(spend, now))
    }

    /// [`Self::check_spending`] with Redis: one call, or the fallback's decision and,
    /// with `on_backend_error = "local"`, its spend in process.
    pub(super) async fn spend_remote(
        &self,
        remote: &Remote,
        policy: PolicyId,
        key: &str,
        quota: Option<&Gcra>,
        credit: Option<(&CreditSpend<'_>, i64)>,
    ) -> (Decision, Option<Spent>) {
        let Some(gcra) = quota.or_else(|| self.gcras.get(policy.0)).copied() else {
            return (gcra::unknown_policy_decision(self.now()), None);
        };
        let now = self.now();
        if remote.may_try(now, &[(policy, key)]) {
            let answer = remote
                .call("check", |l| async move {
                    l.decide_spending(policy, key, gcra, Op::Check, credit)
                        .await
                })
                .await;
            match answer {
                Ok((decision, credited)) => {
                    remote.mark_up(now, &[(policy, key)]);
                    return (decision, self.redis_spent(credited, credit));
                }
                Err(failed) => remote.mark_down(now, &failed),
            }
        }
        let decision = match remote.on_error {
            OnBackendError::Local => self.local_op(policy, key, Op::Check, quota),
            OnBackendError::Deny => gcra.deny_decision(now),
            OnBackendError::Allow => gcra.allow_decision(now),
        };
        (
            decision,
            self.fallback_spend(remote, decision.allowed, credit),
        )
    }

    /// What Redis's credit step answered, noted in the book.
    pub(super) fn redis_spent(
        &self,
        credited: Option<credits::Credited>,
        credit: Option<(&CreditSpend<'_>, i64)>,
    ) -> Option<Spent> {
        let (spend, now) = credit?;
        Some(credits::credited(&self.credits, spend, credited?, now))
    }

    /// A credit spend while Redis fails: `local` spends from this instance's
    /// share of the last count it saw; `allow` spends nothing; `deny` refused the decision already.
    pub(super) fn fallback_spend(
        &self,
        remote: &Remote,
        allowed: bool,
        credit: Option<(&CreditSpend<'_>, i64)>,
    ) -> Option<Spent> {
        let (spend, now) = credit.filter(|_| allowed)?;
        Some(match remote.on_error {
            OnBackendError::Local => self.credits.spend_share(spend, now, remote.instances.get()),
            _ => Spent::Spent(self.credits.peek(spend, now)),
        })
    }

    /// Spends `spend`'s cost from its key's credits at `now` (unix seconds):
    /// in this process on the local backend; in Redis otherwise, in one
    /// script call, and while Redis fails as `on_backend_error` says
    /// (`local`: from this instance's share of the last count it saw).
    pub async fn spend_credits(&self, spend: &CreditSpend<'_>, now: i64) -> Spent {
        let Some(remote) = &self.remote else {
            return self.credits.spend(spend, now);
        };
        Box::pin(self.spend_credits_remote(remote, spend, now)).await
    }

    pub(super) async fn spend_credits_remote(
        &self,
        remote: &Remote,
        spend: &CreditSpend<'_>,
        now: i64,
    ) -> Spent {
        let at = self.now();
        if remote.may_try(at, &[]) {
            let answer = remote
                .call(
                    "credits",
                    |l| async move { l.spend_credits(spend, now).await },
                )
                .await;
            match answer {
                Ok(reply) => {
                    remote.mark_up(at, &[]);
                    return credits::answered(&self.credits, spend, reply);
                }
                Err(failed) => remote.mark_down(at, &failed),
            }
        }
        match remote.on_error {
            OnBackendError::Local => self.credits.spend_share(spend, now, remote.instances.get()),
            OnBackendError::Deny => Spent::Unavailable,
            OnBackendError::Allow => Spent::Spent(self.credits.peek(spend, now)),
        }
    }

    /// This limiter with `book`'s credit counts (a reload's new limiter
    /// keeps the counts of the one it replaces).
    pub fn with_credit_book(mut self, book: Arc<CreditBook>) -> Self {
        self.credits = book;
        self
    }

    /// The credit counts, for the task that writes them to the store.
    pub fn credit_book(&self) -> Arc<CreditBook> {
        self.credits.clone()
    }

    /// Gives back what `spend` spent (a later stage refused its request): in
    /// process, or in Redis in a call of its own. A refund Redis cannot take
    /// is lost (the key has spent it), never retried.
    pub async fn refund_credits(&self, spend: &CreditSpend<'_>, now: i64) {
        let remote = self.remote.as_ref().filter(|r| r.may_try(self.now(), &[]));
        let Some(remote) = remote else {
            self.credits.refund(spend, now);
            return;
        };
        let refunded = remote
            .call("credits_refund", |l| async move {
                l.refund_credits(spend, now).await
            })
            .await;
        match refunded {
            Ok(reply) => {
                credits::answered(&self.credits, spend, reply);
            }
            Err(failed) => tracing::debug!(error = %failed.error, "a credit refund was lost"),
        }
    }

    /// With Redis, the gateway instances that share it, as last counted
    /// (this one included), which divide a count while Redis fails; 1 on
    /// the local backend.
    pub fn instances(&self) -> u64 {
        self.remote
            .as_ref()
            .map_or(1, |remote| remote.instances.get())
    }

    /// The credits `spend`'s key has left as this instance last knew them,
    /// spending nothing (for the header of a request refused before it spent).
    pub fn peek_credits(&self, spend: &CreditSpend<'_>, now: i64) -> u64 {
        self.credits.peek(spend, now)
    }
}
