//! tracing setup: a human or JSON format on stderr, filtered by `[log] level`;
//! and [`Incident`], which turns a failure repeated on every request into a
//! few lines.
mod absent;
mod incident;

pub use incident::{now_ms, set_summary_interval, Chain, Incident, Line, Recovery};
use std::io::IsTerminal;
use tracing_subscriber::fmt::format::JsonFields;
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;
use absent::{Style, WithAbsent};

/// A dependency's log target that prints a store url's parameter values
/// (sqlx-postgres logs each parameter it ignores, value and all): off
/// whatever `[log] level` says, so that no password in a url reaches the log.
const QUIET_DEPENDENCY_TARGETS: &str = "sqlx_postgres::options=off";

/// PostgreSQL's notices (`relation "schema_migrations" already exists,
/// skipping` at every start) are logged by sqlx at INFO; only warnings and
/// worse are worth a line.
const POSTGRES_NOTICES: &str = "sqlx::postgres::notice=warn";

/// Installs the global subscriber (once per process; later calls are no-ops).
/// Text is coloured only on a terminal: a file or a log collector would get
/// the escape codes as text.
pub fn init(level: &str, format: LogFormat) {
    let filter = crate::config::log_filter(level)
        .unwrap_or_else(|_| EnvFilter::new("info"))
        .add_directive(QUIET_DEPENDENCY_TARGETS.parse().expect("a valid directive"))
        .add_directive(POSTGRES_NOTICES.parse().expect("a valid directive"));
    let ansi = std::io::stderr().is_terminal();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let _ = match format {
        LogFormat::Text => builder
            .event_format(WithAbsent {
                inner: tracing_subscriber::fmt::format().with_ansi(ansi),
                style: Style::Text,
            })
            .try_init(),
        LogFormat::Json => builder
            .fmt_fields(JsonFields::new())
            .event_format(WithAbsent {
                inner: tracing_subscriber::fmt::format()
                    .json()
                    .flatten_event(true)
                    .with_current_span(false),
                style: Style::Json,
            })
            .try_init(),
    };
}
