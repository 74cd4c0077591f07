//! The idle HTTP/1.1 connections of each target (see `client`), kept
//! newest-first and closed after `idle_timeout`. A connection is checked
//! when taken: one the target closed while it sat idle is dropped, which
//! costs no system call unless its socket has become readable.
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::h1::client::Conn;

/// The idle connections of one target.
pub(crate) struct Pool {
    idle: Mutex<VecDeque<(Instant, Conn)>>,
    max_idle: usize,
    idle_timeout: Duration,
}

impl Pool {
    /// A pool keeping at most `max_idle` connections, each for `idle_timeout`.
    pub(crate) fn new(max_idle: usize, idle_timeout: Duration) -> Self {
        Pool {
            idle: Mutex::new(VecDeque::new()),
            max_idle,
            idle_timeout,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(Instant, Conn)>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The most recently used idle connection that has not timed out and
    /// that the target has not closed.
    pub(crate) fn take(&self) -> Option<Conn> {
        let now = crate::clock::now();
        let mut idle = self.lock();
        Self::expire(&mut idle, now, self.idle_timeout);
        while let Some((_, mut c)) = idle.pop_back() {
            if c.is_usable() {
                return Some(c);
            }
        }
        None
    }

    /// Keeps `conn` (which has just finished an exchange) for the next
    /// request, unless the pool is full.
    pub(crate) fn put(&self, conn: Conn) {
        if self.max_idle == 0 {
            return;
        }
        let now = crate::clock::now();
        let mut idle = self.lock();
        Self::expire(&mut idle, now, self.idle_timeout);
        if idle.len() >= self.max_idle {
            idle.pop_front();
        }
        idle.push_back((now, conn));
    }

    /// Closes connections idle for longer than `idle_timeout`, and those
    /// the target has closed.
    pub(crate) fn prune(&self) {
        let mut idle = self.lock();
        Self::expire(&mut idle, crate::clock::now(), self.idle_timeout);
        idle.retain_mut(|(_, c)| c.is_usable());
    }

    /// How many connections are idle.
    #[cfg(test)]
    pub(crate) fn idle(&self) -> usize {
        self.lock().len()
    }

    fn expire(idle: &mut VecDeque<(Instant, Conn)>, now: Instant, timeout: Duration) {
        // Oldest first: stop at the first one still fresh.
        while idle
            .front()
            .is_some_and(|(since, _)| now.saturating_duration_since(*since) >= timeout)
        {
            idle.pop_front();
        }
    }
}
