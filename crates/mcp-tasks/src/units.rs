//! The one syntax for durations and sizes on the command line and in configuration files.
//!
//! - A **duration** is a number (`15`, `1.5`) and a unit: `ms`, `s`, `m`, `h` or `d`
//!   (`250ms`, `10s`, `15m`, `1.5h`, `2d`). [`parse_duration`] requires the unit;
//!   [`parse_duration_or_seconds`] also takes a bare number as seconds, for the options that
//!   always took seconds (`--timeout 30`, `--header-read-timeout 10`).
//! - A **size** is a number of bytes, optionally with a unit: `B`, decimal `KB`, `MB`, `GB`,
//!   `TB` (powers of 1000) or binary `KiB`, `MiB`, `GiB`, `TiB` (powers of 1024); units are
//!   case-insensitive (`64MiB`, `4mib`, `512KB`, `4194304`). See [`parse_size`].
//!
//! A space may separate the number from its unit. Values too large for their type are refused
//! (never saturated).
//!
//! ```
//! use std::time::Duration;
//! use mcp_tasks::units::{parse_duration, parse_duration_or_seconds, parse_size};
//!
//! assert_eq!(parse_duration("15m").unwrap(), Duration::from_secs(900));
//! assert_eq!(parse_duration_or_seconds("2.5").unwrap(), Duration::from_millis(2500));
//! assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
//! assert_eq!(parse_size("4KB").unwrap(), 4000);
//! assert!(parse_duration("15").is_err()); // a unit is required here
//! ```

use std::time::Duration;

/// Why a duration or a size was refused; its message names the value and the accepted syntax.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UnitError {
    /// Not a number followed by an optional unit.
    #[error("`{0}` is not a {1}")]
    Malformed(String, &'static str),
    /// A duration without its unit where one is required.
    #[error("`{0}` needs a unit: ms, s, m, h or d (e.g. 10s, 15m)")]
    MissingUnit(String),
    /// A unit this syntax does not know.
    #[error("unknown unit `{unit}` in `{value}`: use {accepted}")]
    UnknownUnit {
        /// The whole value.
        value: String,
        /// The unit given.
        unit: String,
        /// The units accepted.
        accepted: &'static str,
    },
    /// A value beyond what the option can hold.
    #[error("`{0}` is too large")]
    TooLarge(String),
}

const DURATION: &str = "duration such as 250ms, 10s, 15m, 1h or 2d";
const SIZE: &str = "size such as 4194304, 512KB, 64MiB or 1GiB";
const DURATION_UNITS: &str = "ms, s, m, h or d";
const SIZE_UNITS: &str = "B, KB, MB, GB, TB, KiB, MiB, GiB or TiB";

/// A number with an optional fraction, and the rest of the text (the unit, trimmed).
struct Split<'a> {
    whole: u128,
    /// The fraction's digits as an integer, and 10 to the power of their count.
    fraction: (u128, u128),
    unit: &'a str,
}

fn split<'a>(s: &'a str, what: &'static str) -> Result<Split<'a>, UnitError> {
    let malformed = || UnitError::Malformed(s.to_owned(), what);
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(end);
    let (whole, fraction) = match number.split_once('.') {
        Some((w, f)) => (w, f),
        None => (number, ""),
    };
    if whole.is_empty() || fraction.contains('.') || number.ends_with('.') {
        return Err(malformed());
    }
    let too_large = || UnitError::TooLarge(s.to_owned());
    let whole: u128 = whole.parse().map_err(|_| too_large())?;
    // Digits beyond nanoseconds (or a byte) are dropped: they cannot change the result.
    let fraction = &fraction[..fraction.len().min(12)];
    let digits = if fraction.is_empty() {
        0
    } else {
        fraction.parse::<u128>().map_err(|_| malformed())?
    };
    let scale = 10u128.pow(fraction.len() as u32);
    Ok(Split {
        whole,
        fraction: (digits, scale),
        unit: unit.trim(),
    })
}

/// `whole.fraction × factor`, rounded down; `None` on overflow.
fn scaled(parts: &Split<'_>, factor: u128) -> Option<u128> {
    let (digits, scale) = parts.fraction;
    parts
        .whole
        .checked_mul(factor)?
        .checked_add(digits.checked_mul(factor)? / scale)
}

fn duration(s: &str, bare_seconds: bool) -> Result<Duration, UnitError> {
    let s = s.trim();
    let parts = split(s, DURATION)?;
    let nanos_per_unit: u128 = match parts.unit {
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60 * 1_000_000_000,
        "h" => 3_600 * 1_000_000_000,
        "d" => 86_400 * 1_000_000_000,
        "" if bare_seconds => 1_000_000_000,
        "" => return Err(UnitError::MissingUnit(s.to_owned())),
        other => {
            return Err(UnitError::UnknownUnit {
                value: s.to_owned(),
                unit: other.to_owned(),
                accepted: DURATION_UNITS,
            });
        }
    };
    let too_large = || UnitError::TooLarge(s.to_owned());
    let nanos = scaled(&parts, nanos_per_unit).ok_or_else(too_large)?;
    let secs = u64::try_from(nanos / 1_000_000_000).map_err(|_| too_large())?;
    Ok(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

/// A duration with its unit: `250ms`, `10s`, `15m`, `1.5h`, `2d`.
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    duration(s, false)
}

/// A duration with its unit, or a bare number of seconds (`30`, `0.5`): the syntax of the
/// options that always took seconds.
pub fn parse_duration_or_seconds(s: &str) -> Result<Duration, UnitError> {
    duration(s, true)
}

/// A size in bytes: a bare number of bytes, or a number with a unit (`B`, `KB`, `MB`, `GB`,
/// `TB`, `KiB`, `MiB`, `GiB`, `TiB`; case-insensitive). A fraction is rounded down to a byte.
pub fn parse_size(s: &str) -> Result<u64, UnitError> {
    let s = s.trim();
    let parts = split(s, SIZE)?;
    let factor: u128 = match parts.unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        _ => {
            return Err(UnitError::UnknownUnit {
                value: s.to_owned(),
                unit: parts.unit.to_owned(),
                accepted: SIZE_UNITS,
            });
        }
    };
    scaled(&parts, factor)
        .and_then(|n| u64::try_from(n).ok())
        .ok_or_else(|| UnitError::TooLarge(s.to_owned()))
}

/// [`parse_size`] for a `usize` (a size held in memory).
pub fn parse_size_usize(s: &str) -> Result<usize, UnitError> {
    let n = parse_size(s)?;
    usize::try_from(n).map_err(|_| UnitError::TooLarge(s.trim().to_owned()))
}

/// `url` with the credentials of its authority (`user:password@`), if any, replaced by
/// `***`: a URL is shown in errors and logs, its credentials never.
#[cfg(any(feature = "jwt", feature = "gateway"))]
pub(crate) fn without_userinfo(url: &str) -> std::borrow::Cow<'_, str> {
    let Some(scheme_end) = url.find("://") else {
        return url.into();
    };
    let authority_start = scheme_end + 3;
    let rest = &url[authority_start..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!(
            "{}***{}",
            &url[..authority_start],
            &url[authority_start + at..]
        )
        .into(),
        None => url.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_every_unit_and_fractions() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0.5ms"), Ok(Duration::from_micros(500)));
        assert_eq!(parse_duration(" 10 s "), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn a_bare_number_is_seconds_only_where_allowed() {
        assert_eq!(
            parse_duration("15"),
            Err(UnitError::MissingUnit("15".into()))
        );
        assert_eq!(parse_duration_or_seconds("15"), Ok(Duration::from_secs(15)));
        assert_eq!(
            parse_duration_or_seconds("0.25"),
            Ok(Duration::from_millis(250))
        );
        assert_eq!(
            parse_duration_or_seconds("250ms"),
            Ok(Duration::from_millis(250))
        );
    }

    #[test]
    fn bad_durations_are_refused_with_the_syntax() {
        for bad in ["", "m", "s10", "1..5s", "1.s", ".5s", "-1s", "1e3s", "ten"] {
            let e = parse_duration(bad).unwrap_err().to_string();
            assert!(
                e.contains("is not a duration") || e.contains("unknown unit"),
                "{bad}: {e}"
            );
        }
        let e = parse_duration("1w").unwrap_err().to_string();
        assert_eq!(e, "unknown unit `w` in `1w`: use ms, s, m, h or d");
        // Overflow is an error, never a saturated value.
        for huge in [
            "99999999999999999999d",
            "213503982334602d",
            "999999999999999999999999999999999999999999s",
        ] {
            assert!(
                matches!(parse_duration(huge), Err(UnitError::TooLarge(_))),
                "{huge}"
            );
        }
    }

    #[test]
    fn sizes_take_decimal_and_binary_units() {
        assert_eq!(parse_size("4194304"), Ok(4_194_304));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("64mib"), Ok(64 << 20));
        assert_eq!(parse_size("64KB"), Ok(64_000));
        assert_eq!(parse_size("1.5KiB"), Ok(1536));
        assert_eq!(parse_size("2 GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1TB"), Ok(1_000_000_000_000));
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("12B"), Ok(12));
        let e = parse_size("64MBs").unwrap_err().to_string();
        assert!(e.starts_with("unknown unit `MBs`"), "{e}");
        assert!(
            parse_size("MiB")
                .unwrap_err()
                .to_string()
                .contains("is not a size")
        );
        assert!(matches!(
            parse_size("99999999999TiB"),
            Err(UnitError::TooLarge(_))
        ));
    }
}
