//! `[log] level`: a tracing filter, parsed the one way both the config check
//! and the logger use.
use tracing_subscriber::filter::ParseError;
use tracing_subscriber::EnvFilter;

/// Parses a level or filter such as `"info,access=off"`. Span field values
/// (`[span{field=value}]`) match their text literally, never as a regular
/// expression: the filter's regex engine builds a DFA whose size can grow
/// exponentially with the pattern, so a short value could hold the process
/// for seconds at start and at every reload.
///
/// Each comma-separated directive is trimmed first: tracing-subscriber
/// (0.3.23) walks a directive's trimmed text but slices the untrimmed one,
/// so a directive with a leading space and a non-ASCII character panicked
/// (`"info, ams\u{4a0}=debug"`). It splits on commas itself, so splitting
/// here the same way changes no filter.
pub fn log_filter(level: &str) -> Result<EnvFilter, ParseError> {
    let trimmed: Vec<&str> = level.split(',').map(str::trim).collect();
    EnvFilter::builder()
        .with_regex(false)
        .parse(trimmed.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn levels_and_targets_parse() {
        assert!(log_filter("info").is_ok());
        assert!(log_filter("info,access=off,mpg_gateway=debug").is_ok());
        assert!(log_filter("[request{path=\"/v1\"}]=debug").is_ok());
        assert!(log_filter("info,=").is_err());
    }

    #[test]
    fn a_spaced_directive_with_a_non_ascii_character_is_refused_not_a_panic() {
        assert!(log_filter("    t, ams\u{4a0}=:rw").is_err());
        assert!(log_filter(" info , mpg_gateway=debug ").is_ok());
    }

    /// A field value that would make a regex DFA blow up is taken as text,
    /// at once. (With regex on, this input took over 10 s.)
    #[test]
    fn a_field_value_is_never_compiled_as_a_regex() {
        let level = concat!(
            "[stl_ti[meoiDfogkse{yti[meoiDaaaaaaaaaaaaa00000aaaaaahasslmode=veys",
            "....................................................................",
            "...................../va'gggggggggggggggrate_leys/va'ggggid}"
        );
        let start = Instant::now();
        let _ = log_filter(level);
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "{:?}",
            start.elapsed()
        );
    }
}
