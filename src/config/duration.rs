//! Human durations as the config writes them: `"500ms"`, `"30s"`, `"5m"`, `"12h"`, `"30d"`,
//! or several parts written together: `"1h30m"`.
//!
//! Written here rather than with `humantime`, which would also read `"1M"` as a month
//! (beside `"1m"`, a minute), fractions, spaces and units the store's whole milliseconds
//! cannot keep: the five units below are the whole grammar (what humantime reads instead is
//! in docs/architecture.md).
use std::time::Duration;

/// The units, each with its length in milliseconds.
const UNITS: [(&str, u64); 5] = [
    ("ms", 1),
    ("s", 1_000),
    ("m", 60_000),
    ("h", 3_600_000),
    ("d", 86_400_000),
];

/// Parses one or more `<whole number><unit>` parts written together (`"30s"`, `"1h30m"`),
/// unit `ms`, `s`, `m`, `h` or `d`; the parts add up.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let bad = || {
        format!("invalid duration {text:?}: expected a whole number followed by ms, s, m, h or d (e.g. \"30s\", \"1h30m\")")
    };
    let too_large = || format!("duration {text:?} is too large");
    if text.is_empty() {
        return Err(bad());
    }
    let mut rest = text;
    let mut millis: u64 = 0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(digits);
        let letters = tail
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(letters);
        let per = UNITS
            .iter()
            .find(|(name, _)| *name == unit)
            .map(|(_, per)| *per)
            .ok_or_else(bad)?;
        if number.is_empty() {
            return Err(bad());
        }
        // Only digits: a number that fails to parse is too large for u64.
        let n: u64 = number.parse().map_err(|_| too_large())?;
        millis = n
            .checked_mul(per)
            .and_then(|part| millis.checked_add(part))
            .ok_or_else(too_large)?;
        rest = tail;
    }
    Ok(Duration::from_millis(millis))
}

/// Formats a duration back the way the config writes it (largest exact unit).
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, size) in [
        ("d", 86_400_000u128),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// serde adapter so raw config structs can hold a `Duration` parsed from a string.
pub(crate) mod serde_str {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        super::parse_duration(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("12h").unwrap(), Duration::from_secs(43_200));
        assert_eq!(
            parse_duration("30d").unwrap(),
            Duration::from_secs(2_592_000)
        );
    }

    #[test]
    fn parts_written_together_add_up() {
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5_400));
        assert_eq!(
            parse_duration("2d12h").unwrap(),
            Duration::from_secs(216_000)
        );
        assert_eq!(
            parse_duration("1m30s250ms").unwrap(),
            Duration::from_millis(90_250)
        );
        // The same unit twice adds up too, as humantime's reading does.
        assert_eq!(parse_duration("1m1m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration(" 1h ").unwrap(), Duration::from_secs(3_600));
    }

    #[test]
    fn refuses_garbage_with_a_message() {
        for bad in [
            "",
            "30",
            "s",
            "1.5s",
            "-1s",
            "10 sec",
            "5x",
            "99999999999999999999d",
            "1h 30m",
            "1h30",
            "h30m",
            "1h+30m",
            // humantime's units the config does not take: a month ("1M", not
            // "1m"), a year, a week, micro- and nanoseconds, spelled-out units.
            "1M",
            "1y",
            "1w",
            "100us",
            "100ns",
            "5min",
            "2days",
            "213503982334601d",
            "213503982334d1d",
        ] {
            let err = parse_duration(bad).unwrap_err();
            assert!(err.contains("duration"), "{bad}: {err}");
        }
    }

    #[test]
    fn formats_round_trip() {
        for text in ["500ms", "30s", "5m", "12h", "30d", "1500ms"] {
            assert_eq!(format_duration(parse_duration(text).unwrap()), text);
        }
    }
}
