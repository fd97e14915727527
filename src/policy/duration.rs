//! Durations as written in policies: `250ms`, `10s`, `5m`, `1h`, `1d`, and sums such
//! as `1m30s`, in microseconds.

use crate::algorithm::{Micros, SECOND};

/// Parses a duration; the error says what is wrong. Zero is refused.
pub(crate) fn parse(text: &str) -> Result<Micros, String> {
    const HINT: &str = "expected a duration such as 250ms, 10s, 5m, 1h or 1m30s";
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
        if number.is_empty() || unit.is_empty() {
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
        let part = scaled(number, scale)
            .ok_or_else(|| format!("'{text}' is not a duration of whole microseconds"))?;
        total = total
            .checked_add(part)
            .ok_or_else(|| format!("duration '{text}' is too long"))?;
        rest = after;
    }
    if total == 0 {
        return Err(format!("duration '{text}' must be longer than zero"));
    }
    Ok(total)
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
    }

    #[test]
    fn refuses_nonsense() {
        for bad in [
            "",
            "10",
            "s",
            "10x",
            "0s",
            "1.2.3s",
            "0.5us",
            "-1s",
            "1 s",
            "99999999999999999d",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
