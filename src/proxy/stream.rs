//! Bodies on the way through, streamed frame by frame (never collected):
//! the request body kept reclaimable until its first poll (so a request
//! whose connect failed can go to another target), and the response body
//! that keeps the request's hold on its target ([`TargetHold`]) until it
//! ends, tells the health state how the exchange ended (a body cut off
//! mid-stream is a failure, even after a 200), and enforces the
//! whole-request `timeout` and the bound on each wait for more of it.
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Sleep;

use super::health::Targets;
use crate::h1::client::Incoming;
use crate::http_core::body::{Body, BoxError};

/// Where the request body waits until the connection to a target polls it.
pub(crate) type Slot = Arc<Mutex<Option<Body>>>;

/// A request body that leaves its [`Slot`] only when first polled: if the
/// slot still holds it after a failed attempt, not one byte of it was sent.
pub(crate) struct TakeOnPoll {
    slot: Slot,
    body: Option<Body>,
    hint: SizeHint,
    end: bool,
}

impl TakeOnPoll {
    /// Puts `body` in a new slot; returns the slot and the body to send.
    pub(crate) fn slot(body: Body) -> (Slot, Body) {
        let slot = Arc::new(Mutex::new(Some(body)));
        (slot.clone(), Self::from_slot(&slot))
    }

    /// Another sendable view of the body still in `slot` (for the next attempt).
    pub(crate) fn from_slot(slot: &Slot) -> Body {
        let guard = slot.lock().unwrap_or_else(|e| e.into_inner());
        let (hint, end) = guard
            .as_ref()
            .map(|b| (b.size_hint(), b.is_end_stream()))
            .unwrap_or((SizeHint::with_exact(0), true));
        drop(guard);
        Body::new(TakeOnPoll {
            slot: slot.clone(),
            body: None,
            hint,
            end,
        })
    }

    /// Whether the body is still untouched in `slot`.
    pub(crate) fn untouched(slot: &Slot) -> bool {
        slot.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }
}

impl HttpBody for TakeOnPoll {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.body.is_none() {
            this.body = this.slot.lock().unwrap_or_else(|e| e.into_inner()).take();
        }
        match this.body.as_mut() {
            Some(b) => Pin::new(b).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.body {
            Some(b) => b.is_end_stream(),
            None => self.end,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.body {
            Some(b) => b.size_hint(),
            None => self.hint,
        }
    }
}

/// A request's hold on a target: counted as outstanding, holding one of its
/// connection permits; both released when dropped.
pub(crate) struct TargetHold {
    pub(crate) targets: Arc<Targets>,
    pub(crate) index: usize,
    _permit: OwnedSemaphorePermit,
}

impl TargetHold {
    pub(crate) fn new(targets: Arc<Targets>, index: usize, permit: OwnedSemaphorePermit) -> Self {
        targets.list[index]
            .outstanding
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        TargetHold {
            targets,
            index,
            _permit: permit,
        }
    }

    pub(crate) fn failed(&self) {
        self.targets.failed(self.index, self.targets.now());
    }
}

impl Drop for TargetHold {
    fn drop(&mut self) {
        self.targets.list[self.index]
            .outstanding
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The whole-request `timeout` ran out while the response body streamed.
#[derive(Debug, thiserror::Error)]
#[error("the upstream response did not finish within the request timeout")]
pub(crate) struct BodyTimeout;

/// The upstream sent none of its response body for `request_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("the upstream response body stalled past request_timeout")]
pub(crate) struct BodyStalled;

/// The upstream's response body, relayed frame by frame.
pub(crate) struct ResponseBody {
    /// The body, and the HTTP/1.1 connection it arrives on: back in its
    /// target's pool once the body has ended, closed if it does not.
    pub(crate) inner: Incoming,
    pub(crate) hold: Option<TargetHold>,
    /// Count the target's success when the body ends (not for a 5xx, already a failure).
    pub(crate) succeed_at_end: bool,
    pub(crate) deadline: Option<Pin<Box<Sleep>>>,
    /// How long a wait for more of the body may last (the upstream's
    /// `request_timeout`, nginx's `proxy_read_timeout`): a target that
    /// stops sending mid-body cannot hold the client's connection.
    pub(crate) stall_after: Duration,
    /// Armed only when a poll has to wait (a body that came with its head
    /// never reads the clock for it), re-armed after each frame.
    pub(crate) stall: Option<Pin<Box<Sleep>>>,
    pub(crate) stall_armed: bool,
}

impl ResponseBody {
    /// The body ended normally: release the target, count its success.
    fn finish(&mut self) {
        if let Some(h) = self.hold.take() {
            if let Some(conn) = self.inner.take_conn() {
                h.targets.list[h.index].pool.put(conn);
            }
            if self.succeed_at_end {
                h.targets.succeeded(h.index);
            }
        }
        self.deadline = None;
        self.stall = None;
    }

    /// The body failed mid-stream: it ends here, against the target.
    fn fail(&mut self, e: BoxError) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.deadline = None;
        self.stall = None;
        self.inner.cut_off();
        if let Some(h) = self.hold.take() {
            h.failed();
        }
        Poll::Ready(Some(Err(e)))
    }
}

impl HttpBody for ResponseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(d) = this.deadline.as_mut() {
            if d.as_mut().poll(cx).is_ready() {
                return this.fail(Box::new(BodyTimeout));
            }
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(None) => {
                this.finish();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Ok(frame))) => {
                this.stall_armed = false;
                // hyper stops polling a body that says it has ended.
                if this.inner.is_end_stream() {
                    this.finish();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            // Reset or cut off mid-response: counts against the target.
            Poll::Ready(Some(Err(e))) => this.fail(e),
            Poll::Pending => {
                if !this.stall_armed {
                    let at = tokio::time::Instant::now() + this.stall_after;
                    match this.stall.as_mut() {
                        Some(t) => t.as_mut().reset(at),
                        None => this.stall = Some(Box::pin(tokio::time::sleep_until(at))),
                    }
                    this.stall_armed = true;
                }
                match this.stall.as_mut().map(|t| t.as_mut().poll(cx)) {
                    Some(Poll::Ready(())) => this.fail(Box::new(BodyStalled)),
                    _ => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
