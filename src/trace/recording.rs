//! The spans of one sampled request, gathered while it runs. The request's
//! future carries its [`Recording`] as a task-local, so the stages below
//! the pipeline (a store lookup, a Redis call, a key-set fetch, the
//! upstream's targets) add their spans without a parameter for it; a
//! request that is not sampled has none, and each of those places pays one
//! thread-local read.
use opentelemetry::trace::{Event, SpanKind, Status};
use opentelemetry::{KeyValue, Value};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

tokio::task_local! {
    static CURRENT: Arc<Recording>;
}

/// A span that ended, as [`super::Tracer::finish`] exports it.
#[derive(Debug)]
pub(super) struct Ended {
    pub(super) name: &'static str,
    pub(super) kind: SpanKind,
    pub(super) span_id: [u8; 8],
    pub(super) start: SystemTime,
    pub(super) end: SystemTime,
    pub(super) attributes: Vec<KeyValue>,
    pub(super) events: Vec<Event>,
    pub(super) status: Status,
}

impl Ended {
    /// A span that starts now; its end is set when it ends.
    fn open(
        name: &'static str,
        kind: SpanKind,
        span_id: [u8; 8],
        attributes: Vec<KeyValue>,
    ) -> Self {
        let start = SystemTime::now();
        Ended {
            name,
            kind,
            span_id,
            start,
            end: start,
            attributes,
            events: Vec::new(),
            status: Status::Unset,
        }
    }
}

/// What a sampled request has recorded so far.
#[derive(Debug)]
pub struct Recording {
    /// When the request's server span began.
    pub(super) started: SystemTime,
    ended: Mutex<Vec<Ended>>,
    /// The upstream call's client span while it is open: its id is in the
    /// `traceparent` the targets get; the proxy notes each target tried.
    call: Mutex<Option<Ended>>,
}

// === impl Recording ===

impl Recording {
    /// A recording whose server span begins now.
    pub(super) fn started_now() -> Recording {
        Recording {
            started: SystemTime::now(),
            ended: Mutex::default(),
            call: Mutex::default(),
        }
    }

    /// Runs `fut` with this recording as the current one.
    pub fn scope<F: Future>(self: Arc<Self>, fut: F) -> impl Future<Output = F::Output> {
        CURRENT.scope(self, fut)
    }

    pub(super) fn take_ended(&self) -> Vec<Ended> {
        std::mem::take(&mut *lock(&self.ended))
    }

    /// Opens the upstream call's client span.
    pub(super) fn open_call(&self, span_id: [u8; 8], attributes: Vec<KeyValue>) {
        *lock(&self.call) = Some(Ended::open(
            "upstream",
            SpanKind::Client,
            span_id,
            attributes,
        ));
    }

    /// Ends the upstream call's client span with the status the target
    /// answered, or the error the request got instead.
    pub(super) fn end_call(&self, outcome: Result<u16, &str>) {
        let Some(mut call) = lock(&self.call).take() else {
            return;
        };
        call.end = SystemTime::now();
        match outcome {
            Ok(status) => {
                call.attributes.push(KeyValue::new(
                    "http.response.status_code",
                    i64::from(status),
                ));
                if status >= 500 {
                    call.status = Status::error(format!("the upstream answered {status}"));
                }
            }
            Err(why) => call.status = Status::error(why.to_owned()),
        }
        lock(&self.ended).push(call);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The current request's recording, if it is sampled.
fn current() -> Option<Arc<Recording>> {
    CURRENT.try_with(Arc::clone).ok()
}

/// A child span of the current request's server span, ended (and kept for
/// export) when dropped; `None` when the request is not sampled.
pub fn child(name: &'static str, kind: SpanKind) -> Option<ChildSpan> {
    let recording = current()?;
    let span_id = super::context::new_span_id();
    Some(ChildSpan {
        recording,
        span: Some(Ended::open(name, kind, span_id, Vec::new())),
    })
}

/// An open child span; see [`child`].
#[derive(Debug)]
pub struct ChildSpan {
    recording: Arc<Recording>,
    /// `Some` until dropped.
    span: Option<Ended>,
}

impl ChildSpan {
    /// Sets an attribute.
    pub fn set(&mut self, key: &'static str, value: impl Into<Value>) {
        if let Some(span) = &mut self.span {
            span.attributes.push(KeyValue::new(key, value));
        }
    }

    /// Marks the span failed, saying why.
    pub fn fail(&mut self, why: impl std::fmt::Display) {
        if let Some(span) = &mut self.span {
            span.status = Status::error(why.to_string());
        }
    }
}

impl Drop for ChildSpan {
    fn drop(&mut self) {
        if let Some(mut span) = self.span.take() {
            span.end = SystemTime::now();
            lock(&self.recording.ended).push(span);
        }
    }
}

/// On the open upstream call: the target an attempt goes to, as the
/// span's `server.address` and `server.port` (the last target's, after a
/// retry).
pub fn upstream_attempt<'a>(target: impl FnOnce() -> (&'a str, u16)) {
    with_call(|span| {
        let (host, port) = target();
        span.attributes
            .retain(|kv| !matches!(kv.key.as_str(), "server.address" | "server.port"));
        span.attributes
            .push(KeyValue::new("server.address", host.to_owned()));
        span.attributes
            .push(KeyValue::new("server.port", i64::from(port)));
    });
}

/// On the open upstream call: the last attempt failed with `why` and the
/// request goes to another target: a `retry` event naming the target that
/// failed.
pub fn upstream_retry(why: &dyn std::fmt::Display) {
    with_call(|span| {
        let mut attributes: Vec<KeyValue> = span
            .attributes
            .iter()
            .filter(|kv| matches!(kv.key.as_str(), "server.address" | "server.port"))
            .cloned()
            .collect();
        attributes.push(KeyValue::new("error.message", why.to_string()));
        span.events
            .push(Event::new("retry", SystemTime::now(), attributes, 0));
    });
}

fn with_call(f: impl FnOnce(&mut Ended)) {
    let Some(recording) = current() else {
        return;
    };
    let mut call = lock(&recording.call);
    if let Some(call) = call.as_mut() {
        f(call);
    }
}
