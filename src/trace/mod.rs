//! Distributed tracing: the W3C Trace Context a request brings is continued
//! (or a trace started), the upstream gets a `traceparent` whose parent is
//! the gateway's span for the call, and a sampled request's spans go to an
//! OpenTelemetry collector over OTLP.
//!
//! One server span per request, built when it ends ([`Tracer::finish`]),
//! with child spans for what it waited on: a store lookup on a cache miss,
//! a Redis decision, a key-set fetch ([`child`]) and the upstream call
//! ([`RequestTrace::open_upstream`]). The spans are plain records made at
//! the end, not live SDK spans: a sampled request pays for a few vectors
//! and a queue slot, an unsampled one for its ids.
mod context;
mod export;
mod recording;
mod sampler;

pub use context::TRACEPARENT;
pub use recording::{child, upstream_attempt, upstream_retry, ChildSpan, Recording};

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use std::sync::Arc;
use std::time::SystemTime;

use crate::config::TracingSettings;
use context::{format_traceparent, new_span_id, new_trace_id, parent_of, Incoming, TRACESTATE};
use export::Exporter;
use recording::Ended;
use sampler::Sampler;

/// The tracing of one configuration: its sampler and where its spans go.
#[derive(Debug)]
pub struct Tracer {
    sampler: Sampler,
    exporter: Arc<Exporter>,
    scope: InstrumentationScope,
}

/// What the server span says of the request, gathered by the pipeline.
#[derive(Debug, Default)]
pub struct ServerSpan<'a> {
    /// The method's bounded label.
    pub method: &'static str,
    /// The path without its query (already cleared of secrets).
    pub path: &'a str,
    /// The matched route's template.
    pub route: Option<opentelemetry::StringValue>,
    /// The status answered.
    pub status: u16,
    /// The organization the request was for.
    pub organization_id: Option<&'a str>,
    /// The API key that made it.
    pub key_id: Option<&'a str>,
    /// The stage that refused it, if one did.
    pub refused_by: Option<&'static str>,
    /// Why it was refused (the error's name), or why it failed.
    pub error: Option<&'a str>,
}

/// One request's trace: its ids, and its recording when it is sampled.
#[derive(Debug)]
pub struct RequestTrace {
    /// The trace the request belongs to: the caller's, or a new one.
    pub trace_id: [u8; 16],
    /// The gateway's server span.
    pub span_id: [u8; 8],
    /// The caller's span, when a valid `traceparent` named one.
    parent: Option<[u8; 8]>,
    /// The spans recorded while the request runs: `Some` exactly when the
    /// request is sampled.
    pub recording: Option<Arc<Recording>>,
}

// === impl Tracer ===

impl Tracer {
    /// The tracer for `s` (`None` when `otlp_endpoint` is unset: the gateway
    /// then takes no part in tracing, and `traceparent` passes through).
    /// The exporter of `previous` is kept when the endpoint, protocol and
    /// service name are the same; a changed `sample_ratio` needs no new one.
    pub fn new(s: &TracingSettings, previous: Option<&Tracer>) -> Result<Option<Tracer>, String> {
        let Some(endpoint) = &s.otlp_endpoint else {
            return Ok(None);
        };
        let kept = previous.map(|p| &p.exporter).filter(|e| {
            e.endpoint == *endpoint && e.protocol == s.protocol && e.service_name == s.service_name
        });
        let exporter = match kept {
            Some(e) => e.clone(),
            None => Arc::new(Exporter::start(s, endpoint)?),
        };
        Ok(Some(Tracer {
            sampler: Sampler::new(s.sample_ratio),
            exporter,
            scope: InstrumentationScope::builder("mpg-gateway")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        }))
    }

    /// Sends the spans queued now to the collector, waiting at most
    /// `limit` (at exit, after the drain).
    pub async fn flush(&self, limit: std::time::Duration) {
        let _ = tokio::time::timeout(limit, self.exporter.flush()).await;
    }

    /// The trace of a request with these header fields: the caller's
    /// `traceparent` continued when valid, else a new trace. The fields are
    /// taken out (the upstream gets the gateway's own `traceparent`), and an
    /// invalid one's `tracestate` with them.
    pub fn start(&self, headers: &mut http::HeaderMap) -> RequestTrace {
        let parent = match parent_of(headers) {
            Incoming::Absent => None,
            Incoming::Valid(p) => {
                headers.remove(TRACEPARENT);
                Some(p)
            }
            Incoming::Invalid => {
                headers.remove(TRACEPARENT);
                headers.remove(TRACESTATE);
                None
            }
        };
        let trace_id = parent.map_or_else(new_trace_id, |p| p.trace_id);
        let sampled = self.sampler.sampled(parent.as_ref(), &trace_id);
        RequestTrace {
            trace_id,
            span_id: new_span_id(),
            parent: parent.map(|p| p.span_id),
            recording: sampled.then(|| Arc::new(Recording::started_now())),
        }
    }

    /// Ends a request's trace: a sampled one's server span and the spans
    /// recorded under it go to the export queue.
    pub fn finish(&self, trace: RequestTrace, server: &ServerSpan<'_>) {
        let Some(recording) = &trace.recording else {
            return;
        };
        for child in recording.take_ended() {
            self.exporter
                .send(self.span_data(&trace, child, Some(trace.span_id)));
        }
        let span = Ended {
            name: "request",
            kind: SpanKind::Server,
            span_id: trace.span_id,
            start: recording.started,
            end: SystemTime::now(),
            attributes: server_attributes(server),
            events: Vec::new(),
            // A refusal or failure of the stages, or an upstream's 5xx.
            status: match server.error {
                Some(e) => Status::error(e.to_owned()),
                None if server.status >= 500 => {
                    Status::error(format!("answered {}", server.status))
                }
                None => Status::Unset,
            },
        };
        self.exporter
            .send(self.span_data(&trace, span, trace.parent));
    }

    fn span_data(&self, trace: &RequestTrace, span: Ended, parent: Option<[u8; 8]>) -> SpanData {
        let remote_parent = parent.is_some() && parent == trace.parent;
        let mut events = SpanEvents::default();
        events.events = span.events;
        SpanData {
            span_context: SpanContext::new(
                TraceId::from_bytes(trace.trace_id),
                SpanId::from_bytes(span.span_id),
                TraceFlags::SAMPLED,
                false,
                TraceState::NONE,
            ),
            parent_span_id: parent.map_or(SpanId::INVALID, SpanId::from_bytes),
            parent_span_is_remote: remote_parent,
            span_kind: span.kind,
            name: span.name.into(),
            start_time: span.start,
            end_time: span.end,
            attributes: span.attributes,
            dropped_attributes_count: 0,
            events,
            links: SpanLinks::default(),
            status: span.status,
            instrumentation_scope: self.scope.clone(),
        }
    }
}

fn server_attributes(s: &ServerSpan<'_>) -> Vec<KeyValue> {
    let mut a = Vec::with_capacity(8);
    a.push(KeyValue::new("http.request.method", s.method));
    a.push(KeyValue::new("url.path", s.path.to_owned()));
    if let Some(route) = &s.route {
        a.push(KeyValue::new("http.route", route.clone()));
    }
    a.push(KeyValue::new(
        "http.response.status_code",
        i64::from(s.status),
    ));
    if let Some(org) = s.organization_id {
        a.push(KeyValue::new("mpg.organization_id", org.to_owned()));
    }
    if let Some(key) = s.key_id {
        a.push(KeyValue::new("mpg.key_id", key.to_owned()));
    }
    if let Some(stage) = s.refused_by {
        a.push(KeyValue::new("mpg.refused_by", stage));
    }
    if let Some(e) = s.error {
        a.push(KeyValue::new("error.type", e.to_owned()));
    }
    a
}

// === impl RequestTrace ===

impl RequestTrace {
    /// Opens the upstream call's client span; its `traceparent` is what the
    /// upstream gets.
    pub fn open_upstream(&self, attributes: impl FnOnce() -> Vec<KeyValue>) -> [u8; 55] {
        let span_id = new_span_id();
        if let Some(r) = &self.recording {
            r.open_call(span_id, attributes());
        }
        format_traceparent(&self.trace_id, &span_id, self.sampled())
    }

    /// Whether the request's spans are recorded and exported.
    pub fn sampled(&self) -> bool {
        self.recording.is_some()
    }

    /// Ends the upstream call's span: the status the target answered, or
    /// why the request got none.
    pub fn end_upstream(&self, outcome: Result<u16, &str>) {
        if let Some(r) = &self.recording {
            r.end_call(outcome);
        }
    }
}

/// Bytes as lower-case hex, written where they are shown (the access log's
/// trace and span ids): nothing is made for a line that is not written.
pub struct Hex<'a>(pub &'a [u8]);

impl std::fmt::Display for Hex<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut buf = [0u8; 64];
        let n = self.0.len().min(32) * 2;
        ::hex::encode_to_slice(&self.0[..n / 2], &mut buf[..n]).expect("two digits a byte");
        f.write_str(std::str::from_utf8(&buf[..n]).expect("hex is ASCII"))
    }
}
