//! Absent fields, written out: a field an event declares but gives no value
//! (an `Option` that is `None`, such as the access log's `key_id` on an
//! unauthenticated request) is `null` in JSON and `-` in text, so every line
//! of one event has the same keys. The stock formatters leave such a field out.
use std::cell::RefCell;
use std::fmt::{self, Write as _};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// How an absent field is written.
#[derive(Debug, Clone, Copy)]
pub(super) enum Style {
    /// ` name=-` after the other fields.
    Text,
    /// `"name":null` as the last members of the object.
    Json,
}

/// Wraps a stock event formatter and adds the fields it left out.
pub(super) struct WithAbsent<F> {
    pub(super) inner: F,
    pub(super) style: Style,
}

thread_local! {
    /// A line is formatted here first when it has absent fields to add.
    static LINE: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Which of an event's declared fields were given a value (one bit per field
/// index; events have far fewer than 64 fields).
struct Recorded(u64);

impl Visit for Recorded {
    fn record_debug(&mut self, field: &Field, _: &dyn fmt::Debug) {
        if field.index() < 64 {
            self.0 |= 1 << field.index();
        }
    }
}

impl<S, N, F> FormatEvent<S, N> for WithAbsent<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut recorded = Recorded(0);
        event.record(&mut recorded);
        // `log.*` are the fields of a `log` record bridged to tracing, not the event's own.
        let mut absent = event.metadata().fields().iter().filter(|f| {
            f.index() < 64 && recorded.0 & (1 << f.index()) == 0 && !f.name().starts_with("log.")
        });
        let Some(first) = absent.next() else {
            return self.inner.format_event(ctx, writer, event);
        };
        let write = |line: &mut String| -> fmt::Result {
            line.clear();
            self.inner.format_event(ctx, Writer::new(line), event)?;
            let end = line.trim_end().len();
            line.truncate(end);
            match self.style {
                Style::Text => {
                    for f in std::iter::once(first).chain(absent) {
                        write!(line, " {}=-", f.name())?;
                    }
                }
                Style::Json => {
                    // The stock formatter wrote one object: reopen it.
                    if line.pop() != Some('}') {
                        return Err(fmt::Error);
                    }
                    for f in std::iter::once(first).chain(absent) {
                        if !line.ends_with('{') {
                            line.push(',');
                        }
                        let name = serde_json::to_string(f.name()).map_err(|_| fmt::Error)?;
                        write!(line, "{name}:null")?;
                    }
                    line.push('}');
                }
            }
            writeln!(writer, "{line}")
        };
        // A line formatted while another is (a formatter that logs) gets a buffer of its own.
        LINE.with(|buf| match buf.try_borrow_mut() {
            Ok(mut line) => write(&mut line),
            Err(_) => write(&mut String::new()),
        })
    }
}
