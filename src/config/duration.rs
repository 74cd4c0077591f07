//! Human durations as the config writes them: `"500ms"`, `"30s"`, `"5m"`, `"12h"`, `"30d"`.
use std::time::Duration;

/// Parses `<whole number><unit>` with unit `ms`, `s`, `m`, `h` or `d`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let bad = || {
        format!("invalid duration {text:?}: expected a whole number followed by ms, s, m, h or d (e.g. \"30s\")")
    };
    let n: u64 = number.parse().map_err(|_| bad())?;
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad()),
    };
    n.checked_mul(millis_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("duration {text:?} is too large"))
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
