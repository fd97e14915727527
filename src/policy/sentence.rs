//! What a `rate_limit` does besides denying over its limit: `shed` (soft shedding
//! below it) and `penalty` (a `ban` or a `tighten`, and a `block` for chronic
//! offenders), read into the model's `Shed` and `Penalty`.

use super::fields::{integer, Ctx, Field, Fields};
use super::node::Value;
use super::rate_limit::{duration_field, max_count};
use super::{Block, Penalty, Sentence, Shed};

/// `shed: {from: 0.9}`: `from` a share of the limit strictly between 0 and 1.
pub(super) fn shed(ctx: &mut Ctx, field: Field<'_>) -> Option<Shed> {
    let mut f = Fields::open_field(ctx, field, "shed")?;
    let from = f.get(ctx, "from");
    let line = f.line;
    f.finish(ctx, "shed");
    let Some(from) = from else {
        ctx.error(
            line,
            "'shed' needs 'from' (the share of the limit where shedding starts, such as 0.9)",
        );
        return None;
    };
    let value = match from.node.value {
        Value::Float(v, _) => v,
        Value::Int(v, _) => v as f64,
        _ => {
            ctx.error(
                from.line(),
                format!(
                    "'from' must be a number between 0 and 1, found {}",
                    from.node.describe()
                ),
            );
            return None;
        }
    };
    if !(value > 0.0 && value < 1.0) {
        ctx.error(
            from.line(),
            format!("'from' must be above 0 and below 1 (a share of the limit), found {value}"),
        );
        return None;
    }
    Some(Shed { from: value })
}

pub(super) fn penalty(ctx: &mut Ctx, field: Field<'_>) -> Option<Penalty> {
    let mut f = Fields::open_field(ctx, field, "penalty")?;
    let violations = f.get(ctx, "violations");
    let within = f.get(ctx, "within");
    let ban = f.get(ctx, "ban");
    let tighten_field = f.get(ctx, "tighten");
    let block_field = f.get(ctx, "block");
    let line = f.line;
    f.finish(ctx, "penalty");
    for (present, name) in [(violations, "violations"), (within, "within")] {
        if present.is_none() {
            ctx.error(line, format!("'penalty' needs '{name}'"));
        }
    }
    let violations = violations
        .and_then(|v| integer(ctx, v, 1, max_count(ctx)))
        .and_then(|v| u64::try_from(v).ok());
    let within = within.and_then(|w| duration_field(ctx, w));
    let sentence = match (ban, tighten_field) {
        (Some(b), None) => duration_field(ctx, b).map(Sentence::Ban),
        (None, Some(t)) => tighten(ctx, t),
        (Some(_), Some(t)) => {
            ctx.error(
                t.key_line,
                "'penalty' takes either 'ban' or 'tighten', not both",
            );
            None
        }
        (None, None) => {
            ctx.error(
                line,
                "'penalty' needs 'ban' (a duration) or 'tighten' ({factor, for})",
            );
            None
        }
    };
    let block = match block_field {
        Some(b) => Some(block(ctx, b)?),
        None => None,
    };
    Some(Penalty {
        violations: violations?,
        within: within?,
        sentence: sentence?,
        block,
    })
}

/// `tighten: {factor: 0.1, for: 10m}`: `factor` strictly between 0 and 1.
fn tighten(ctx: &mut Ctx, field: Field<'_>) -> Option<Sentence> {
    let mut f = Fields::open_field(ctx, field, "tighten")?;
    let factor = f.get(ctx, "factor");
    let span = f.get(ctx, "for");
    let line = f.line;
    f.finish(ctx, "tighten");
    if factor.is_none() {
        ctx.error(line, "'tighten' needs 'factor' (such as 0.1)");
    }
    if span.is_none() {
        ctx.error(line, "'tighten' needs 'for' (a duration such as 10m)");
    }
    let span = span.and_then(|s| duration_field(ctx, s));
    let factor = factor?;
    let value = match factor.node.value {
        Value::Float(v, _) => v,
        Value::Int(v, _) => v as f64,
        _ => {
            ctx.error(
                factor.line(),
                format!(
                    "'factor' must be a number between 0 and 1, found {}",
                    factor.node.describe()
                ),
            );
            return None;
        }
    };
    let factor_ppm = (value * 1_000_000.0).round();
    if !(value > 0.0 && value < 1.0 && (1.0..1_000_000.0).contains(&factor_ppm)) {
        ctx.error(
            factor.line(),
            format!(
                "'factor' must be above 0 and below 1 (it scales the limit down), found {value}"
            ),
        );
        return None;
    }
    Some(Sentence::Tighten {
        factor_ppm: factor_ppm as u32,
        span: span?,
    })
}

/// `block: {bans: 3, within: 1h, for: 24h}`.
fn block(ctx: &mut Ctx, field: Field<'_>) -> Option<Block> {
    let mut f = Fields::open_field(ctx, field, "block")?;
    let bans = f.get(ctx, "bans");
    let within = f.get(ctx, "within");
    let span = f.get(ctx, "for");
    let line = f.line;
    f.finish(ctx, "block");
    for (present, name) in [(bans, "bans"), (within, "within"), (span, "for")] {
        if present.is_none() {
            ctx.error(line, format!("'block' needs '{name}'"));
        }
    }
    let bans = bans
        .and_then(|v| integer(ctx, v, 1, max_count(ctx)))
        .and_then(|v| u64::try_from(v).ok());
    let within = within.and_then(|w| duration_field(ctx, w));
    let span = span.and_then(|s| duration_field(ctx, s));
    Some(Block {
        bans: bans?,
        within: within?,
        span: span?,
    })
}

#[cfg(test)]
mod tests {
    use crate::policy::{compile, parse_resource_spec, parse_str, Shed};

    fn shed_of(rate_limit: &str) -> Result<Option<Shed>, String> {
        let text = format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {rate_limit}\n");
        match parse_str("p.yaml", &text) {
            Ok(docs) => Ok(compile(docs).unwrap().rules[0].shed),
            Err(e) => Err(e
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")),
        }
    }

    fn penalty_of(penalty: &str) -> Result<Option<crate::policy::Penalty>, String> {
        let text = format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: 10, penalty: {penalty}}}\n"
        );
        match parse_str("p.yaml", &text) {
            Ok(docs) => Ok(compile(docs).unwrap().rules[0].penalty),
            Err(e) => Err(e
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")),
        }
    }

    #[test]
    fn penalty_reads_ban_tighten_and_block() {
        use crate::algorithm::SECOND;
        use crate::policy::{Block, Sentence};
        let p = penalty_of("{violations: 3, within: 1m, ban: 10m}")
            .unwrap()
            .unwrap();
        assert_eq!(p.sentence, Sentence::Ban(600 * SECOND));
        assert_eq!(p.block, None);
        let p = penalty_of(
            "{violations: 3, within: 1m, tighten: {factor: 0.25, for: 5m}, block: {bans: 3, within: 1h, for: 24h}}",
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            p.sentence,
            Sentence::Tighten {
                factor_ppm: 250_000,
                span: 300 * SECOND
            }
        );
        assert_eq!(
            p.block,
            Some(Block {
                bans: 3,
                within: 3_600 * SECOND,
                span: 86_400 * SECOND
            })
        );
    }

    #[test]
    fn penalty_refuses_what_is_not_one_sentence_or_not_a_factor() {
        for (penalty, message) in [
            (
                "{violations: 3, within: 1m}",
                "needs 'ban' (a duration) or 'tighten'",
            ),
            (
                "{violations: 3, within: 1m, ban: 1m, tighten: {factor: 0.5, for: 1m}}",
                "either 'ban' or 'tighten', not both",
            ),
            (
                "{violations: 3, within: 1m, tighten: {factor: 1, for: 1m}}",
                "above 0 and below 1",
            ),
            (
                "{violations: 3, within: 1m, tighten: {factor: 0, for: 1m}}",
                "above 0 and below 1",
            ),
            (
                "{violations: 3, within: 1m, tighten: {factor: high, for: 1m}}",
                "must be a number",
            ),
            (
                "{violations: 3, within: 1m, tighten: {factor: 0.5}}",
                "'tighten' needs 'for'",
            ),
            (
                "{violations: 3, within: 1m, ban: 1m, block: {bans: 2, for: 1h}}",
                "'block' needs 'within'",
            ),
            (
                "{violations: 3, within: 1m, ban: 1m, block: {bans: 0, within: 1h, for: 1h}}",
                "'bans'",
            ),
            (
                "{violations: 3, within: 1m, ban: 1m, block: {bans: 2, within: 1h, for: 1h, x: 1}}",
                "'x'",
            ),
        ] {
            let err = penalty_of(penalty).expect_err(penalty);
            assert!(err.contains(message), "{penalty}: {err}");
        }
    }

    #[test]
    fn shed_reads_from_and_refuses_what_is_no_share_of_the_limit() {
        assert_eq!(
            shed_of("{unit: second, requests_per_unit: 10, shed: {from: 0.9}}"),
            Ok(Some(Shed { from: 0.9 }))
        );
        assert_eq!(shed_of("{unit: second, requests_per_unit: 10}"), Ok(None));
        for (rate_limit, message) in [
            (
                "{unit: second, requests_per_unit: 10, shed: {}}",
                "p.yaml:4: 'shed' needs 'from'",
            ),
            (
                "{unit: second, requests_per_unit: 10, shed: {from: 1}}",
                "p.yaml:4: 'from' must be above 0 and below 1 (a share of the limit), found 1",
            ),
            (
                "{unit: second, requests_per_unit: 10, shed: {from: 0}}",
                "'from' must be above 0 and below 1",
            ),
            (
                "{unit: second, requests_per_unit: 10, shed: {from: 1.5}}",
                "found 1.5",
            ),
            (
                "{unit: second, requests_per_unit: 10, shed: {from: '90%'}}",
                "'from' must be a number between 0 and 1, found the string '90%'",
            ),
            (
                "{unit: second, requests_per_unit: 10, shed: {from: 0.9, to: 1}}",
                "unknown field 'to' in shed",
            ),
            (
                "{unit: second, requests_per_unit: 10, shed: 0.9}",
                "shed must be a mapping, found the number 0.9",
            ),
            (
                "{unlimited: true, shed: {from: 0.9}}",
                "should not specify 'shed' when 'unlimited' is true",
            ),
        ] {
            let e = shed_of(rate_limit).unwrap_err();
            assert!(e.contains(message), "{rate_limit}: {message:?} in {e}");
        }
    }

    #[test]
    fn shed_in_the_resource_form() {
        let spec = serde_json::json!({
            "domain": "d",
            "descriptors": [{"key": "k", "rateLimit": {"unit": "second", "requestsPerUnit": 10, "shed": {"from": 0.75}}}]
        });
        let doc = parse_resource_spec("ns", "p", &spec).unwrap();
        assert_eq!(
            compile(vec![doc]).unwrap().rules[0].shed,
            Some(Shed { from: 0.75 })
        );
    }

    #[test]
    fn shed_probability_rises_linearly_from_from_to_the_limit() {
        let shed = Shed { from: 0.8 };
        assert_eq!(shed.probability(0, 100), 0.0);
        assert_eq!(shed.probability(80, 100), 0.0);
        assert!((shed.probability(90, 100) - 0.5).abs() < 1e-9);
        assert_eq!(shed.probability(100, 100), 1.0);
        assert_eq!(shed.probability(0, 0), 0.0);
    }
}
