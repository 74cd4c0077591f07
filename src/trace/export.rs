//! Sending finished spans to the collector: a bounded queue that a request
//! never waits on, and one task per exporter that batches the queue and
//! hands each batch to OpenTelemetry's OTLP exporter. The SDK's batch
//! processor does the same but cannot say how many spans it dropped; this
//! one counts them in `mpg_trace_spans_dropped_total`.
use futures_util::FutureExt;
use opentelemetry_otlp::{Protocol as OtlpProtocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{SpanData, SpanExporter as _};
use opentelemetry_sdk::Resource;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

use crate::config::{OtlpProtocol as Protocol, TracingSettings};
use crate::logging::Incident;
use crate::metrics::names;

/// Spans held for export at most; a span finished while the queue is full
/// is dropped and counted.
pub(super) const QUEUE: usize = 2048;
/// Spans sent in one export call at most.
const BATCH: usize = 512;
/// How long a span waits for its batch to fill before the batch is sent.
const LINGER: Duration = Duration::from_millis(500);
/// How long one export may take before it is abandoned (and its spans
/// counted as dropped).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the spans of one tracing configuration go.
#[derive(Debug)]
pub(super) struct Exporter {
    queue: mpsc::Sender<SpanData>,
    /// Asks the task to send what is queued now, and to say when it has.
    flushes: mpsc::UnboundedSender<oneshot::Sender<()>>,
    dropped: metrics::Counter,
    /// What it was started with: a reload that changes none of it keeps it.
    pub(super) endpoint: String,
    pub(super) protocol: Protocol,
    pub(super) service_name: String,
}

// === impl Exporter ===

impl Exporter {
    /// Builds the OTLP exporter for `s` and starts its task on the current
    /// runtime. Nothing connects yet: a collector that is down is met (and
    /// logged) at the first export.
    pub(super) fn start(s: &TracingSettings, endpoint: &str) -> Result<Exporter, String> {
        let mut otlp = otlp_exporter(s.protocol, endpoint)?;
        let resource = Resource::builder()
            .with_service_name(s.service_name.clone())
            .with_attribute(opentelemetry::KeyValue::new(
                "service.version",
                env!("CARGO_PKG_VERSION"),
            ))
            .build();
        otlp.set_resource(&resource);
        let (queue, spans) = mpsc::channel(QUEUE);
        let (flushes, flush_requests) = mpsc::unbounded_channel();
        let dropped = metrics::counter!(names::TRACE_SPANS_DROPPED);
        let out = Outlet {
            otlp,
            dropped: dropped.clone(),
            endpoint: endpoint.to_owned(),
            incident: Incident::new(),
        };
        tokio::spawn(run(spans, flush_requests, out));
        Ok(Exporter {
            queue,
            flushes,
            dropped,
            endpoint: endpoint.to_owned(),
            protocol: s.protocol,
            service_name: s.service_name.clone(),
        })
    }

    /// Sends what is queued now; returns once it is sent (or lost).
    pub(super) async fn flush(&self) {
        let (done, sent) = oneshot::channel();
        if self.flushes.send(done).is_ok() {
            let _ = sent.await;
        }
    }

    /// Queues `span`, or drops and counts it if the queue is full.
    pub(super) fn send(&self, span: SpanData) {
        if self.queue.try_send(span).is_err() {
            self.dropped.increment(1);
        }
    }
}

/// The OTLP exporter for `protocol`. Over HTTP the spans go to
/// `{endpoint}/v1/traces` (unless the endpoint already ends so), through
/// hyper with TLS for `https://`; over gRPC to the endpoint itself.
fn otlp_exporter(
    protocol: Protocol,
    endpoint: &str,
) -> Result<opentelemetry_otlp::SpanExporter, String> {
    let built = match protocol {
        Protocol::HttpProtobuf | Protocol::HttpJson => {
            let wire = match protocol {
                Protocol::HttpJson => OtlpProtocol::HttpJson,
                _ => OtlpProtocol::HttpBinary,
            };
            opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(wire)
                .with_endpoint(traces_url(endpoint))
                .with_timeout(EXPORT_TIMEOUT)
                .with_http_client(opentelemetry_http::hyper::HyperClient::new(
                    crate::tls::client::https_connector(None, Duration::from_secs(5))?,
                    EXPORT_TIMEOUT,
                    None,
                ))
                .build()
        }
        Protocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_protocol(OtlpProtocol::Grpc)
            .with_endpoint(endpoint)
            .with_timeout(EXPORT_TIMEOUT)
            .build(),
    };
    built.map_err(|e| e.to_string())
}

/// The OTLP/HTTP traces address for a collector's base `endpoint`.
pub(super) fn traces_url(endpoint: &str) -> String {
    let base = endpoint.trim_end_matches('/');
    if base.ends_with("/v1/traces") {
        base.to_owned()
    } else {
        format!("{base}/v1/traces")
    }
}

/// The exporter's task: batches of up to [`BATCH`] spans, each sent once
/// it is full or its first span has waited [`LINGER`]. A failed or slow
/// export loses its batch (counted), never the queue behind it. A flush
/// request sends everything queued at once, then answers. Ends, after
/// sending what is queued, once every sender is gone (a reload replaced the
/// configuration, or the gateway stopped).
async fn run(
    mut spans: mpsc::Receiver<SpanData>,
    mut flushes: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
    out: Outlet,
) {
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        let flush = tokio::select! {
            n = spans.recv_many(&mut batch, BATCH) => {
                if n == 0 {
                    break;
                }
                None
            }
            Some(done) = flushes.recv() => Some(done),
        };
        let flush = match flush {
            Some(done) => Some(done),
            None => linger(&mut spans, &mut flushes, &mut batch).await,
        };
        out.send(std::mem::replace(&mut batch, Vec::with_capacity(BATCH)))
            .await;
        if let Some(done) = flush {
            while spans
                .recv_many(&mut batch, BATCH)
                .now_or_never()
                .unwrap_or(0)
                > 0
            {
                out.send(std::mem::replace(&mut batch, Vec::with_capacity(BATCH)))
                    .await;
            }
            let _ = done.send(());
        }
    }
    let _ = out.otlp.shutdown();
}

/// Fills `batch` until it is full or [`LINGER`] has passed, or a flush is
/// asked for (returned).
async fn linger(
    spans: &mut mpsc::Receiver<SpanData>,
    flushes: &mut mpsc::UnboundedReceiver<oneshot::Sender<()>>,
    batch: &mut Vec<SpanData>,
) -> Option<oneshot::Sender<()>> {
    let linger = tokio::time::sleep(LINGER);
    tokio::pin!(linger);
    while batch.len() < BATCH {
        let room = BATCH - batch.len();
        tokio::select! {
            n = spans.recv_many(batch, room) => if n == 0 { break },
            Some(done) = flushes.recv() => return Some(done),
            () = &mut linger => break,
        }
    }
    None
}

/// Where batches go: the OTLP exporter, with the count of spans lost and
/// the collector's incident.
struct Outlet {
    otlp: opentelemetry_otlp::SpanExporter,
    dropped: metrics::Counter,
    endpoint: String,
    incident: Incident,
}

impl Outlet {
    /// Exports `batch` (if any); a failure or timeout counts its spans as
    /// dropped and is logged as the collector's incident.
    async fn send(&self, batch: Vec<SpanData>) {
        if batch.is_empty() {
            return;
        }
        let n = batch.len() as u64;
        let result = match tokio::time::timeout(EXPORT_TIMEOUT, self.otlp.export(batch)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer in {} s", EXPORT_TIMEOUT.as_secs())),
        };
        let now = crate::logging::now_ms();
        let subject = Collector(&self.endpoint);
        match result {
            Ok(()) => {
                if let Some(recovery) = self.incident.recovered(now) {
                    recovery.log(tracing::Level::INFO, &subject, "span batches lost");
                }
            }
            Err(cause) => {
                self.dropped.increment(n);
                if let Some(line) = self.incident.failed(now) {
                    line.log(tracing::Level::WARN, &subject, "span batches lost", &cause);
                }
            }
        }
    }
}

/// The subject of the exporter's incident lines.
struct Collector<'a>(&'a str);

impl std::fmt::Display for Collector<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "trace collector {}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_path_is_added_once() {
        assert_eq!(traces_url("http://c:4318"), "http://c:4318/v1/traces");
        assert_eq!(traces_url("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(
            traces_url("http://c:4318/v1/traces"),
            "http://c:4318/v1/traces"
        );
        assert_eq!(traces_url("https://c/otlp"), "https://c/otlp/v1/traces");
    }
}
