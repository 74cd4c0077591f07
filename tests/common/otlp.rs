//! An OTLP receiver for the tracing tests: it decodes what the gateway
//! exports (protobuf with the `opentelemetry-proto` types, OTLP JSON, or
//! OTLP over gRPC) into [`Span`]s.
use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message;
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;

use super::scale::within;

/// One span as the collector received it.
#[derive(Debug, Clone, Default)]
pub struct Span {
    pub trace_id: String,
    pub span_id: String,
    pub parent: String,
    pub name: String,
    /// OTLP's `SpanKind`: 2 server, 3 client.
    pub kind: i32,
    pub attributes: BTreeMap<String, String>,
    /// OTLP's status code: 0 unset, 1 ok, 2 error.
    pub status: i32,
    pub status_message: String,
    pub events: Vec<(String, BTreeMap<String, String>)>,
    pub service: String,
}

/// An OTLP receiver on 127.0.0.1:0: HTTP/1.1 and HTTP/2 (gRPC), protobuf
/// or JSON bodies.
pub struct Collector {
    pub addr: SocketAddr,
    pub spans: Arc<Mutex<Vec<Span>>>,
    /// What each export arrived as: `protobuf`, `json` or `grpc`.
    pub encodings: Arc<Mutex<Vec<&'static str>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Collector {
    pub async fn start() -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
        let encodings: Arc<Mutex<Vec<&'static str>>> = Arc::default();
        let (s, e) = (spans.clone(), encodings.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (s, e) = (s.clone(), e.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let (s, e) = (s.clone(), e.clone());
                        async move { Ok::<_, std::convert::Infallible>(receive(req, s, e).await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Collector {
            addr,
            spans,
            encodings,
            task,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }

    /// The spans of `trace_id`, once `n` of them have arrived (10 s at most).
    pub async fn trace(&self, trace_id: &str, n: usize) -> Vec<Span> {
        let of = || -> Vec<Span> {
            self.spans()
                .into_iter()
                .filter(|s| s.trace_id == trace_id)
                .collect()
        };
        let arrived = within(Duration::from_secs(10), || async { of().len() >= n }).await;
        assert!(
            arrived.is_some(),
            "trace {trace_id}: {} spans arrived, not {n}: {:#?}",
            of().len(),
            self.spans()
        );
        of()
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Reply = Response<http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>>;

async fn receive(
    req: Request<Incoming>,
    spans: Arc<Mutex<Vec<Span>>>,
    encodings: Arc<Mutex<Vec<&'static str>>>,
) -> Reply {
    let path = req.uri().path().to_owned();
    let content_type = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let (encoding, got) = if content_type.starts_with("application/grpc") {
        assert_eq!(
            path,
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
        );
        // One gRPC message: a flag byte, a 4-byte length, the protobuf.
        let message = ExportTraceServiceRequest::decode(&body[5..]).unwrap();
        ("grpc", from_proto(message))
    } else if content_type == "application/json" {
        assert_eq!(path, "/v1/traces");
        ("json", from_json(&serde_json::from_slice(&body).unwrap()))
    } else {
        assert_eq!(path, "/v1/traces");
        assert_eq!(content_type, "application/x-protobuf");
        let message = ExportTraceServiceRequest::decode(&body[..]).unwrap();
        ("protobuf", from_proto(message))
    };
    encodings.lock().unwrap().push(encoding);
    spans.lock().unwrap().extend(got);
    if encoding == "grpc" {
        // An empty ExportTraceServiceResponse, then `grpc-status: 0`.
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        let frames = vec![
            Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from_static(&[0, 0, 0, 0, 0]))),
            Ok(Frame::trailers(trailers)),
        ];
        let body = StreamBody::new(futures_util::stream::iter(frames));
        return Response::builder()
            .header("content-type", "application/grpc")
            .body(BodyExt::boxed(body))
            .unwrap();
    }
    Response::builder()
        .header("content-type", content_type)
        .body(BodyExt::boxed(Full::new(Bytes::new())))
        .unwrap()
}

fn from_proto(message: ExportTraceServiceRequest) -> Vec<Span> {
    let text = |v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>| match v
        .as_ref()
        .and_then(|v| v.value.as_ref())
    {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(AnyValue::BoolValue(b)) => b.to_string(),
        other => format!("{other:?}"),
    };
    let map = |kvs: &[opentelemetry_proto::tonic::common::v1::KeyValue]| {
        kvs.iter()
            .map(|kv| (kv.key.clone(), text(&kv.value)))
            .collect::<BTreeMap<_, _>>()
    };
    let mut out = Vec::new();
    for rs in message.resource_spans {
        let service = rs
            .resource
            .as_ref()
            .map(|r| map(&r.attributes))
            .and_then(|a| a.get("service.name").cloned())
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                let status = s.status.clone().unwrap_or_default();
                out.push(Span {
                    trace_id: hex::encode(&s.trace_id),
                    span_id: hex::encode(&s.span_id),
                    parent: hex::encode(&s.parent_span_id),
                    name: s.name.clone(),
                    kind: s.kind,
                    attributes: map(&s.attributes),
                    status: status.code,
                    status_message: status.message,
                    events: s
                        .events
                        .iter()
                        .map(|e| (e.name.clone(), map(&e.attributes)))
                        .collect(),
                    service: service.clone(),
                });
            }
        }
    }
    out
}

/// OTLP/JSON: ids in hex, names in lowerCamelCase, enums as numbers.
fn from_json(v: &Value) -> Vec<Span> {
    let map = |kvs: &Value| {
        kvs.as_array()
            .into_iter()
            .flatten()
            .map(|kv| {
                let value = &kv["value"];
                let text = value["stringValue"]
                    .as_str()
                    .map(str::to_owned)
                    .or_else(|| value["intValue"].as_str().map(str::to_owned))
                    .or_else(|| value["intValue"].as_i64().map(|i| i.to_string()))
                    .or_else(|| value["boolValue"].as_bool().map(|b| b.to_string()))
                    .unwrap_or_else(|| value.to_string());
                (kv["key"].as_str().unwrap().to_owned(), text)
            })
            .collect::<BTreeMap<_, _>>()
    };
    let mut out = Vec::new();
    for rs in v["resourceSpans"].as_array().unwrap() {
        let service = map(&rs["resource"]["attributes"])
            .get("service.name")
            .cloned()
            .unwrap_or_default();
        for ss in rs["scopeSpans"].as_array().unwrap() {
            for s in ss["spans"].as_array().unwrap() {
                out.push(Span {
                    trace_id: s["traceId"].as_str().unwrap().to_lowercase(),
                    span_id: s["spanId"].as_str().unwrap().to_lowercase(),
                    parent: s["parentSpanId"].as_str().unwrap_or("").to_lowercase(),
                    name: s["name"].as_str().unwrap().to_owned(),
                    kind: s["kind"].as_i64().unwrap_or(0) as i32,
                    attributes: map(&s["attributes"]),
                    status: s["status"]["code"].as_i64().unwrap_or(0) as i32,
                    status_message: s["status"]["message"].as_str().unwrap_or("").to_owned(),
                    events: s["events"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|e| {
                            (
                                e["name"].as_str().unwrap().to_owned(),
                                map(&e["attributes"]),
                            )
                        })
                        .collect(),
                    service: service.clone(),
                });
            }
        }
    }
    out
}
