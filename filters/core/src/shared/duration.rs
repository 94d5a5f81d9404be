//! Durations written as strings with a unit: `"250ms"`, `"3s"`, `"1m"`, `"1h"`,
//! and sums of them such as `"1m30s"`. Fractions are allowed (`"1.5s"`), signs and
//! bare numbers are not: a missing unit is almost always a mistake (`"5"`: 5 what?).

use std::fmt;
use std::time::Duration;

/// The longest duration any field accepts: nothing in a shutdown sequence
/// sensibly lasts longer, and the bound keeps arithmetic in microseconds far
/// from overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// `d` in whole microseconds (saturating: the clocks and expiries here are
/// µs on the host's monotonic clock).
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Why a duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DurationError(String);

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The units a duration is written in, each with its length in
/// microseconds, for the schema's patterns (the parser's match names them
/// too; a test holds the two together).
#[cfg(feature = "schema")]
const UNITS: [(&str, u128); 4] = [
    ("ms", 1_000),
    ("s", 1_000_000),
    ("m", 60_000_000),
    ("h", 3_600_000_000),
];

/// Most digits on either side of a number's decimal point.
const MAX_DIGITS: usize = 12;

/// Parses `"250ms"`, `"3s"`, `"1m30s"`, `"0.5s"`, `"0s"`. Units: `ms`, `s`, `m`, `h`.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let err = |why: &str| {
        DurationError(format!(
            "invalid duration {text:?}: {why} (write a number with a unit: \"250ms\", \"3s\", \"1m\")"
        ))
    };
    if text.is_empty() {
        return Err(err("empty"));
    }
    let bytes = text.as_bytes();
    let mut pos = 0;
    let mut total_us: u128 = 0;
    while pos < bytes.len() {
        let start = pos;
        while pos < bytes.len() && (bytes[pos].is_ascii_digit() || bytes[pos] == b'.') {
            pos += 1;
        }
        let number = &text[start..pos];
        if number.is_empty() {
            return Err(err("expected a number"));
        }
        let unit_start = pos;
        while pos < bytes.len() && bytes[pos].is_ascii_alphabetic() {
            pos += 1;
        }
        let unit_us: u128 = match &text[unit_start..pos] {
            "ms" => 1_000,
            "s" => 1_000_000,
            "m" => 60_000_000,
            "h" => 3_600_000_000,
            "" => return Err(err("missing unit")),
            _ => return Err(err("unknown unit")),
        };
        total_us = total_us
            .checked_add(scaled(number, unit_us).ok_or_else(|| err("bad number"))?)
            .ok_or_else(|| err("too large"))?;
        if total_us > MAX_DURATION.as_micros() {
            return Err(err("longer than 24h"));
        }
    }
    // Bounded by MAX_DURATION above, so the cast cannot truncate.
    Ok(Duration::from_micros(total_us as u64))
}

/// `number * unit_us`, where number may carry a fraction; digits past
/// microsecond precision are dropped. None on malformed numbers or overflow.
fn scaled(number: &str, unit_us: u128) -> Option<u128> {
    let (whole, frac) = match number.split_once('.') {
        Some((w, f)) => (w, f),
        None => (number, ""),
    };
    if whole.is_empty() || (number.contains('.') && frac.is_empty()) || frac.contains('.') {
        return None;
    }
    if whole.len() > MAX_DIGITS || frac.len() > MAX_DIGITS {
        return None;
    }
    let whole: u128 = whole.parse().ok()?;
    let mut value = whole.checked_mul(unit_us)?;
    let mut scale = unit_us;
    for digit in frac.bytes() {
        scale /= 10;
        value += u128::from(digit - b'0') * scale;
    }
    Some(value)
}

/// [`parse_duration`]'s grammar as a JSON Schema pattern: one or more
/// numbers, each with a unit. The 24h bound is a sum, which a pattern cannot
/// weigh: the schema leaves it to the parser.
#[cfg(feature = "schema")]
pub(crate) fn duration_pattern() -> String {
    let units: Vec<&str> = UNITS.iter().map(|(name, _)| *name).collect();
    format!(
        "^([0-9]{{1,{MAX_DIGITS}}}(\\.[0-9]{{1,{MAX_DIGITS}}})?({}))+$",
        units.join("|")
    )
}

/// The durations [`parse_duration`] reads as zero, as a JSON Schema
/// pattern: every number zero down to the microsecond, the precision
/// [`scaled`] keeps (its digits past that are dropped, so "0.0001ms" is 0).
#[cfg(feature = "schema")]
pub(crate) fn zero_duration_pattern() -> String {
    let terms: Vec<String> = UNITS
        .iter()
        .map(|(name, unit_us)| {
            // Fraction digits that still weigh a microsecond or more.
            let kept = (1..=MAX_DIGITS)
                .take_while(|i| unit_us / 10u128.pow(*i as u32) >= 1)
                .count();
            // Those all zero, the rest anything (no unit weighs 10^12 us).
            let fraction = format!("0{{1,{kept}}}|0{{{kept}}}[0-9]{{1,{}}}", MAX_DIGITS - kept);
            format!("0{{1,{MAX_DIGITS}}}(\\.({fraction}))?{name}")
        })
        .collect();
    format!("^({})+$", terms.join("|"))
}

/// A default duration as the contract writes it: whole seconds (`"60s"`),
/// else milliseconds (`"500ms"`).
#[cfg(feature = "schema")]
pub(crate) fn contract_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Formats a duration the way [`parse_duration`] reads it, in the largest
/// unit that keeps it whole: `3s`, `250ms`, `1m`.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".to_string();
    }
    if ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The schema's units are the parser's: each reads as its length.
    #[cfg(feature = "schema")]
    #[test]
    fn the_schemas_units_are_the_parsers() {
        for (name, us) in UNITS {
            let micros = u64::try_from(us).unwrap();
            assert_eq!(
                parse_duration(&format!("1{name}")),
                Ok(Duration::from_micros(micros)),
                "{name}"
            );
        }
    }

    #[test]
    fn parse_accepts_each_unit() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("3s"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0ms"), Ok(Duration::ZERO));
    }

    #[test]
    fn parse_accepts_sums_and_fractions() {
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0.25s"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1s500ms"), Ok(Duration::from_millis(1500)));
    }

    #[test]
    fn parse_refuses_malformed_input() {
        for bad in [
            "",
            "5",
            "s",
            "-1s",
            "+1s",
            "1 s",
            " 1s",
            "1s ",
            "1.s",
            ".5s",
            "1..5s",
            "1d",
            "1sec",
            "ms",
            "1S",
            "1e3ms",
            "25h",
            "99999999999999999999s",
            "1µs",
            "1.2.3s",
        ] {
            let got = parse_duration(bad);
            assert!(got.is_err(), "{bad:?} parsed as {got:?}");
            let msg = got.unwrap_err().to_string();
            assert!(
                msg.contains(&format!("{bad:?}")),
                "message {msg:?} should quote the input"
            );
        }
    }

    #[test]
    fn parse_accepts_the_bound_and_refuses_past_it() {
        assert_eq!(parse_duration("24h"), Ok(MAX_DURATION));
        assert!(parse_duration("23h60m1s").is_err());
    }

    #[test]
    fn format_round_trips() {
        for text in ["0s", "250ms", "3s", "1m", "90s", "2h", "1500ms"] {
            let d = parse_duration(text).unwrap();
            assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }
        assert_eq!(format_duration(Duration::from_secs(90)), "90s");
        assert_eq!(format_duration(Duration::from_secs(120)), "2m");
    }
}
