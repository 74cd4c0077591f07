//! tracing setup: a human or JSON format on stderr, filtered by `[log] level`;
//! and [`Incident`], which turns a failure repeated on every request into a
//! few lines.
mod incident;

pub use incident::{now_ms, set_summary_interval, Chain, Incident, Line, Recovery};
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber (once per process; later calls are no-ops).
pub fn init(level: &str, format: LogFormat) {
    let filter = EnvFilter::try_new(level).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
}
