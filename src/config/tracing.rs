//! `[tracing]`: OpenTelemetry export of the request spans. Without an
//! `otlp_endpoint` nothing is exported and the gateway takes no part in
//! tracing (a client's `traceparent` passes through as it came).
use serde::Deserialize;

use super::problems::Problems;

/// `[tracing] protocol`: how spans travel to the collector.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum OtlpProtocol {
    /// OTLP/HTTP with protobuf bodies (port 4318 by convention).
    #[default]
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    /// OTLP/HTTP with JSON bodies.
    #[serde(rename = "http/json")]
    HttpJson,
    /// OTLP/gRPC (port 4317 by convention).
    #[serde(rename = "grpc")]
    Grpc,
}

/// `[tracing]`
#[derive(Debug, Clone, PartialEq)]
pub struct TracingSettings {
    /// The collector's base URL; `None`: no export.
    pub otlp_endpoint: Option<String>,
    /// How spans travel.
    pub protocol: OtlpProtocol,
    /// The share of new traces recorded (0 to 1); a caller's sampled
    /// `traceparent` is always followed.
    pub sample_ratio: f64,
    /// The `service.name` of the spans.
    pub service_name: String,
}

impl Default for TracingSettings {
    fn default() -> Self {
        TracingSettings {
            otlp_endpoint: None,
            protocol: OtlpProtocol::HttpProtobuf,
            sample_ratio: 0.05,
            service_name: "mpg-gateway".into(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RawTracing {
    otlp_endpoint: Option<String>,
    protocol: OtlpProtocol,
    sample_ratio: f64,
    service_name: String,
}

impl Default for RawTracing {
    fn default() -> Self {
        let d = TracingSettings::default();
        RawTracing {
            otlp_endpoint: d.otlp_endpoint,
            protocol: d.protocol,
            sample_ratio: d.sample_ratio,
            service_name: d.service_name,
        }
    }
}

/// `[tracing]`: an endpoint that is an `http://` or `https://` URL with a
/// host, a ratio from 0 to 1, a service name.
pub(super) fn tracing_settings(p: &mut Problems, raw: RawTracing) -> TracingSettings {
    if let Some(url) = &raw.otlp_endpoint {
        if let Some(problem) = endpoint_problem(url) {
            p.add("tracing.otlp_endpoint", problem);
        }
    }
    if !(0.0..=1.0).contains(&raw.sample_ratio) {
        p.add(
            "tracing.sample_ratio",
            format!("{} is outside 0 to 1", raw.sample_ratio),
        );
    }
    if raw.service_name.trim().is_empty() {
        p.add("tracing.service_name", "must not be empty");
    }
    TracingSettings {
        otlp_endpoint: raw.otlp_endpoint,
        protocol: raw.protocol,
        sample_ratio: raw.sample_ratio,
        service_name: raw.service_name,
    }
}

fn endpoint_problem(url: &str) -> Option<String> {
    let uri: http::Uri = match url.parse() {
        Ok(u) => u,
        Err(e) => return Some(format!("{url:?} is not a URL ({e})")),
    };
    match (uri.scheme_str(), uri.host()) {
        (Some("http" | "https"), Some(h)) if !h.is_empty() => {
            if uri.query().is_some() {
                return Some(format!("{url:?}: a collector's address takes no query"));
            }
            None
        }
        (Some("http" | "https"), _) => Some(format!("{url:?} names no host")),
        _ => Some(format!(
            "{url:?} is not an http:// or https:// URL (e.g. \"http://127.0.0.1:4318\")"
        )),
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Settings;

    use crate::config::tests::MINIMAL as BASE;

    fn problems(tracing: &str) -> String {
        match Settings::parse(&format!("{BASE}\n[tracing]\n{tracing}")) {
            Ok(_) => String::new(),
            Err(e) => e.iter().map(|p| format!("{p}\n")).collect(),
        }
    }

    #[test]
    fn defaults_export_nothing_and_sample_five_percent() {
        let s = Settings::parse(BASE).unwrap();
        assert_eq!(s.tracing.otlp_endpoint, None);
        assert_eq!(s.tracing.sample_ratio, 0.05);
        assert_eq!(s.tracing.service_name, "mpg-gateway");
    }

    #[test]
    fn each_bad_key_is_named() {
        for (toml, path, words) in [
            (
                "otlp_endpoint = \"127.0.0.1:4318\"",
                "tracing.otlp_endpoint",
                "http://",
            ),
            (
                "otlp_endpoint = \"ftp://c:21\"",
                "tracing.otlp_endpoint",
                "http://",
            ),
            (
                "otlp_endpoint = \"http://\"",
                "tracing.otlp_endpoint",
                "not a URL",
            ),
            (
                "otlp_endpoint = \"not a url\"",
                "tracing.otlp_endpoint",
                "not a URL",
            ),
            (
                "sample_ratio = 1.5",
                "tracing.sample_ratio",
                "outside 0 to 1",
            ),
            (
                "sample_ratio = -0.1",
                "tracing.sample_ratio",
                "outside 0 to 1",
            ),
            (
                "sample_ratio = nan",
                "tracing.sample_ratio",
                "outside 0 to 1",
            ),
            ("protocol = \"thrift\"", "tracing.protocol", "http/protobuf"),
            ("service_name = \"\"", "tracing.service_name", "empty"),
            ("endpoint = \"http://c\"", "tracing", "endpoint"),
        ] {
            let got = problems(toml);
            assert!(got.contains(path) && got.contains(words), "{toml}: {got}");
        }
    }

    #[test]
    fn the_three_protocols_parse() {
        for (name, want) in [
            ("http/protobuf", super::OtlpProtocol::HttpProtobuf),
            ("http/json", super::OtlpProtocol::HttpJson),
            ("grpc", super::OtlpProtocol::Grpc),
        ] {
            let toml = format!(
                "{BASE}\n[tracing]\notlp_endpoint = \"http://127.0.0.1:4318\"\nprotocol = \"{name}\"\nsample_ratio = 1.0"
            );
            let s = Settings::parse(&toml).unwrap();
            assert_eq!(s.tracing.protocol, want);
            assert_eq!(
                s.tracing.otlp_endpoint.as_deref(),
                Some("http://127.0.0.1:4318")
            );
        }
    }
}
