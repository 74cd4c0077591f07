//! One request through an upstream: pick a healthy target (`balance`) and
//! take one of its connection permits, send to it (`transport`), count the
//! outcome for the target's health and answer the client, and retry a
//! connect failure on another target when that is safe. Bodies stream both
//! ways (see `stream`).
use http::{request, Method, Response};
use std::time::Instant;

use super::error::UpstreamError;
use super::headers::{sanitize_response, Added};
use super::stream::{ResponseBody, Slot, TakeOnPoll, TargetHold};
use super::upstream::Upstream;
use crate::h1::client::{Conn, Incoming};
use crate::http_core::body::Body;

/// RFC 9110 §9.2.2: methods whose repetition has the same effect as one request.
fn idempotent(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE | Method::TRACE
    )
}

/// The body to send, and the slot a retry takes it back from: only a
/// request that may be retried pays for the reclaimable body.
#[inline]
fn reclaimable(body: Body, may_retry: bool) -> (Option<Slot>, Option<Body>) {
    if may_retry {
        let (slot, b) = TakeOnPoll::slot(body);
        (Some(slot), Some(b))
    } else {
        (None, Some(body))
    }
}

/// The body of this attempt: the request's own the first time, then what a
/// retry takes back from `slot`.
#[inline]
fn attempt_body(body: &mut Option<Body>, slot: Option<&Slot>) -> Body {
    match (body.take(), slot) {
        (Some(b), _) => b,
        (None, Some(slot)) => TakeOnPoll::from_slot(slot),
        (None, None) => crate::http_core::body::empty(),
    }
}

// === impl Upstream ===

impl Upstream {
    /// A healthy target not in `tried`, with one of its connection permits.
    /// `None` when no untried target is up.
    async fn acquire(
        &self,
        tried: &[usize],
        now: Instant,
    ) -> Result<Option<TargetHold>, UpstreamError> {
        let now = self.targets.at(now);
        let mut full: Vec<usize> = Vec::new();
        loop {
            // The common case (no target full) allocates nothing.
            let skip: std::borrow::Cow<'_, [usize]> = if full.is_empty() {
                tried.into()
            } else {
                tried
                    .iter()
                    .chain(&full)
                    .copied()
                    .collect::<Vec<_>>()
                    .into()
            };
            let Some(i) = self.balancer.pick(&self.targets, &skip, now) else {
                break;
            };
            match self.targets.list[i].permits.clone().try_acquire_owned() {
                Ok(p) => return Ok(Some(TargetHold::new(self.targets.clone(), i, p))),
                Err(_) => full.push(i),
            }
        }
        let Some(&first) = full.first() else {
            return Ok(None);
        };
        // Every healthy target is at its limit: wait a little for a slot, then
        // 503. Boxed: the usual request's future carries no room for the wait.
        let permits = self.targets.list[first].permits.clone();
        let wait = tokio::time::timeout(self.connect_timeout, permits.acquire_owned());
        match Box::pin(wait).await {
            Ok(Ok(p)) => Ok(Some(TargetHold::new(self.targets.clone(), first, p))),
            _ => Err(UpstreamError::Saturated),
        }
    }

    /// Sends the request `parts` (headers already sanitized; only the path
    /// and query of its URI are used) with `body` to a healthy target,
    /// streaming the body both ways. The head is borrowed, so that a retry
    /// sends it again without a copy made in advance. A connect failure is
    /// retried on another target only for an idempotent method whose body
    /// was never polled: nothing of it can have reached a target.
    pub async fn forward(
        &self,
        parts: &mut request::Parts,
        body: Body,
        added: Option<&Added<'_>>,
    ) -> Result<Response<Body>, UpstreamError> {
        let started = crate::clock::now();
        let deadline = self.timeout.map(|t| started + t);
        let may_retry =
            self.retries > 0 && self.targets.list.len() > 1 && idempotent(&parts.method);
        let (slot, mut body) = reclaimable(body, may_retry);
        // Targets already tried, kept only when a retry may follow (so the usual
        // request allocates nothing here).
        let mut tried: Vec<usize> = Vec::new();
        let mut attempts: usize = 0;
        loop {
            // One clock read per attempt (the first attempt's is `started`).
            let now = match attempts {
                0 => started,
                _ => crate::clock::now(),
            };
            let hold = match self.acquire(&tried, now).await {
                Ok(Some(h)) => h,
                Ok(None) => {
                    let err = UpstreamError::Unavailable {
                        retry_after: self.targets.retry_after(self.targets.now()),
                    };
                    return Err(self.refuse(None, err));
                }
                Err(err) => return Err(self.refuse(None, err)),
            };
            let i = hold.index;
            attempts += 1;
            if may_retry {
                tried.push(i);
            }
            let target = &self.targets.list[i];
            crate::trace::upstream_attempt(|| {
                let port = target.authority.port_u16();
                let https = target.scheme == http::uri::Scheme::HTTPS;
                (
                    target.authority.host(),
                    port.unwrap_or(if https { 443 } else { 80 }),
                )
            });
            let attempts_left = may_retry && attempts <= self.retries as usize;
            let this_body = attempt_body(&mut body, slot.as_ref());
            let head_by = self.head_by(now, deadline);
            let sent =
                self.transport
                    .send(target, parts, this_body, !attempts_left, added, head_by);
            let err = match sent.await {
                Ok((res, conn)) => return Ok(self.relay(res, conn, hold, deadline)),
                Err(e) => e,
            };
            self.retry_or_refuse(err, hold, attempts_left, slot.as_ref(), &tried)?;
        }
    }

    /// When the response head of an attempt begun at `now` is due: within
    /// `request_timeout` of it, and never after the request's own deadline.
    #[inline]
    fn head_by(&self, now: Instant, deadline: Option<Instant>) -> Instant {
        let head_by = now + self.request_timeout;
        deadline.map_or(head_by, |d| d.min(head_by))
    }

    /// After an attempt failed with `err` on the target `hold` is for: `Ok`
    /// (counted and logged) when the request goes again to another target,
    /// else the error the client gets.
    #[inline]
    fn retry_or_refuse(
        &self,
        err: UpstreamError,
        hold: TargetHold,
        attempts_left: bool,
        slot: Option<&Slot>,
        tried: &[usize],
    ) -> Result<(), UpstreamError> {
        let i = hold.index;
        match &err {
            // The client's request body failed (too large, cut off,
            // malformed, stalled): the target is not to blame, or any
            // client could eject every target by aborting uploads.
            _ if err.is_client_side() => return Err(err),
            UpstreamError::Connect(_) => hold.failed(),
            _ => {
                hold.failed();
                return Err(self.refuse(Some(i), err));
            }
        }
        drop(hold);
        let untouched = slot.is_some_and(TakeOnPoll::untouched);
        if !(attempts_left && untouched) {
            return Err(self.refuse(Some(i), err));
        }
        if !(0..self.targets.list.len())
            .any(|j| !tried.contains(&j) && self.targets.is_up(j, self.targets.now()))
        {
            return Err(self.refuse(Some(i), err));
        }
        self.retry_counter.increment(1);
        crate::trace::upstream_retry(&err);
        let target = &self.targets.list[i];
        tracing::debug!(upstream = %self.name, target = %target.label, error = %err, "connect failed; retrying on another target");
        Ok(())
    }

    /// `err` is what the client gets for this request (from target `i`, if
    /// one was tried): counted in the upstream's incident, logged when a
    /// line is due. The failure path only: an answered request pays nothing.
    fn refuse(&self, i: Option<usize>, err: UpstreamError) -> UpstreamError {
        self.targets.refused(i, &err);
        err
    }

    /// The response as the client gets it: hop-by-hop headers removed, the
    /// body relayed as it arrives. A 5xx counts against the target at once;
    /// anything else counts for it once the body has ended.
    fn relay(
        &self,
        res: Response<Incoming>,
        conn: Option<Conn>,
        hold: TargetHold,
        deadline: Option<Instant>,
    ) -> Response<Body> {
        let server_error = res.status().is_server_error();
        if server_error {
            hold.failed();
        } else if http_body::Body::is_end_stream(res.body()) {
            self.targets.succeeded(hold.index);
        }
        // The response came whole: its connection serves the next request now.
        if let Some(c) = conn {
            self.targets.list[hold.index].pool.put(c);
        }
        let (mut parts, mut inner) = res.into_parts();
        sanitize_response(&mut parts.headers);
        let relayed = inner.take_relayed();
        let body = ResponseBody {
            inner,
            succeed_at_end: !server_error,
            hold: Some(hold),
            deadline: deadline.map(|d| Box::pin(tokio::time::sleep_until(d.into()))),
            stall_after: self.request_timeout,
            stall: None,
            stall_armed: false,
        };
        Response::from_parts(parts, Body::new(body).relaying(relayed))
    }
}
