//! Durations, one syntax for policies and flags alike: a number and a unit (`us`
//! or `µs`, `ms`, `s`, `m`, `h`, `d`), the number a whole or a decimal (`1.5s`),
//! several such parts summed (`1m30s`), in whole microseconds.
//!
//! The command line parses its duration flags here too, so a
//! value that works in a policy works in a flag. It lives in the policy module
//! because the core may not depend on the command line, only the other way round.

use crate::algorithm::{Micros, SECOND};

const HINT: &str = "expected a duration such as 250ms, 10s, 5m, 1h, 1.5s or 1m30s";

/// Parses a duration, zero included (`--drain-delay 0s` waits for nothing); the
/// error says what is wrong.
pub fn parse(text: &str) -> Result<Micros, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err(format!("empty duration: {HINT}"));
    }
    let mut total: Micros = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let digits = number.chars().any(|c| c.is_ascii_digit());
        if !digits || unit.is_empty() || number.matches('.').count() > 1 {
            return Err(format!("'{text}' is not a duration: {HINT}"));
        }
        let scale: Micros = match unit {
            "us" | "µs" => 1,
            "ms" => 1_000,
            "s" => SECOND,
            "m" => 60 * SECOND,
            "h" => 3_600 * SECOND,
            "d" => 86_400 * SECOND,
            _ => return Err(format!("unknown unit '{unit}' in '{text}': {HINT}")),
        };
        let part = scaled(number, scale).ok_or_else(|| {
            // Either the number does not fit in microseconds, or its fraction does not
            // come to whole ones.
            let huge = number
                .parse::<f64>()
                .is_ok_and(|n| n * scale as f64 >= Micros::MAX as f64);
            if huge {
                format!("duration '{text}' is too long")
            } else {
                format!("'{text}' is not a duration of whole microseconds")
            }
        })?;
        total = total
            .checked_add(part)
            .ok_or_else(|| format!("duration '{text}' is too long"))?;
        rest = after;
    }
    Ok(total)
}

/// The longest duration of a policy (and of an operator's block): 2^50 µs, about 35
/// years, the largest number the Redis scripts are given. Longer ones would be cut
/// short there, and overflow the sums of times that add them to the clock.
pub const MAX: Micros = 1 << 50;

/// Parses a duration longer than zero and at most [`MAX`], as every duration of a
/// policy is (a zero window or lease would mean nothing).
pub fn parse_positive(text: &str) -> Result<Micros, String> {
    match parse(text)? {
        0 => Err(format!(
            "duration '{}' must be longer than zero",
            text.trim()
        )),
        d if d > MAX => Err(format!(
            "duration '{}' is longer than the longest allowed, {MAX}us (about 35 years)",
            text.trim()
        )),
        d => Ok(d),
    }
}

/// `number` (digits, optionally with a fraction) times `scale`, when exact.
fn scaled(number: &str, scale: Micros) -> Option<Micros> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
        return None;
    }
    let whole: Micros = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut micros = whole.checked_mul(scale)?;
    if !fraction.is_empty() {
        let digits = u32::try_from(fraction.len()).ok()?;
        let denominator = 10u128.checked_pow(digits)?;
        let numerator = u128::from(fraction.parse::<u64>().ok()?) * u128::from(scale);
        if numerator % denominator != 0 {
            return None;
        }
        micros = micros.checked_add(Micros::try_from(numerator / denominator).ok()?)?;
    }
    Some(micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_forms() {
        assert_eq!(parse("250ms"), Ok(250_000));
        assert_eq!(parse("10s"), Ok(10 * SECOND));
        assert_eq!(parse("5m"), Ok(300 * SECOND));
        assert_eq!(parse("1h"), Ok(3_600 * SECOND));
        assert_eq!(parse("1m30s"), Ok(90 * SECOND));
        assert_eq!(parse("1.5s"), Ok(1_500_000));
        assert_eq!(parse("2d"), Ok(172_800 * SECOND));
        assert_eq!(parse("100us"), Ok(100));
        assert_eq!(parse("100µs"), Ok(100));
        assert_eq!(parse(" 15ms "), Ok(15_000));
    }

    #[test]
    fn zero_is_a_duration_but_not_a_positive_one() {
        assert_eq!(parse("0s"), Ok(0));
        assert_eq!(parse("0ms0s"), Ok(0));
        assert_eq!(
            parse_positive("0s"),
            Err("duration '0s' must be longer than zero".to_string())
        );
        assert_eq!(parse_positive("1.5s"), Ok(1_500_000));
    }

    #[test]
    fn a_policy_duration_is_at_most_about_35_years() {
        assert_eq!(parse_positive("13031d"), Ok(13_031 * 86_400 * SECOND));
        assert_eq!(parse_positive("1125899906842624us"), Ok(MAX));
        for long in ["1125899906842625us", "13032d", "213503982d"] {
            let err = parse_positive(long).unwrap_err();
            assert!(
                err.contains("is longer than the longest allowed, 1125899906842624us"),
                "{err}"
            );
        }
        // Flags are not policies: the plain parse still takes them.
        assert_eq!(parse("13032d"), Ok(13_032 * 86_400 * SECOND));
    }

    #[test]
    fn refuses_nonsense_and_says_why() {
        for (bad, why) in [
            ("", "empty duration"),
            ("10", "'10' is not a duration"),
            ("s", "'s' is not a duration"),
            ("10x", "unknown unit 'x' in '10x'"),
            ("10 s", "unknown unit ' s' in '10 s'"),
            ("-1s", "'-1s' is not a duration"),
            ("1.2.3s", "'1.2.3s' is not a duration: expected"),
            ("1.5.5s", "'1.5.5s' is not a duration: expected"),
            (".s", "'.s' is not a duration: expected"),
            ("0.5us", "not a duration of whole microseconds"),
            ("99999999999999999d", "is too long"),
            ("99999999999d", "is too long"),
            ("99999999999999999999999us", "is too long"),
            ("18446744073709.551616s", "is too long"),
            ("213503982d1d", "is too long"),
        ] {
            let err = parse(bad).expect_err(bad);
            assert!(err.contains(why), "{bad:?}: {err}");
        }
        assert!(parse("10x").unwrap_err().contains(HINT));
    }
}
