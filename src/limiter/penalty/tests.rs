//! The penalty loop through the limiter: bans, tightenings, blocks and the board.

use std::sync::Arc;

use super::*;
use crate::algorithm::SECOND;
use crate::clock::{Clock, ManualClock};
use crate::limiter::{Ban, Descriptor, Limiter, Outcome, Settings};
use crate::policy::Penalty;
use crate::store::{MemoryStore, Sentenced, Store};

const T0: Micros = 1_700_000_000 * SECOND;

const POLICY: &str = r#"
domain: d
descriptors:
  - key: ip
    rate_limit:
      unit: minute
      requests_per_unit: 1
      algorithm: fixed_window
      penalty: {violations: 2, within: 10s, ban: 5m}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
"#;

fn limiter(clock: &ManualClock) -> Limiter<MemoryStore> {
    crate::limiter::test_limiter(POLICY, clock, Settings::default())
}

async fn ask(l: &Limiter<MemoryStore>, ip: &str) -> Outcome {
    let ip_entries = [("ip", ip)];
    let user = [("user", "u")];
    l.decide(
        "d",
        &[
            Descriptor::new(&ip_entries[..], 1),
            Descriptor::new(&user[..], 1),
        ],
    )
    .await
}

/// A request larger than its limit that starts a ban is told to wait out the ban,
/// as any denial that starts one: not one window, though no wait admits it.
#[tokio::test]
async fn a_request_no_wait_admits_that_starts_a_ban_waits_for_the_ban() {
    let clock = ManualClock::new(T0);
    let l = limiter(&clock);
    let ip = [("ip", "4.4.4.4")];
    let mut last = None;
    for _ in 0..2 {
        last = Some(l.decide("d", &[Descriptor::new(&ip[..], 5)]).await);
    }
    let o = last.expect("decided");
    assert_eq!(o.statuses[0].ban, Ban::Started);
    // What `retry-after` reports for it (the service's headers read the same).
    let verdict = o.statuses[0].verdict.expect("decided");
    let window = o
        .rule(&o.statuses[0])
        .and_then(|r| r.limit)
        .expect("a limit")
        .window;
    assert_eq!(verdict.retry_wait(window), 300 * SECOND, "{verdict:?}");
}

#[tokio::test]
async fn a_key_denied_n_times_is_banned_without_store_calls() {
    let clock = ManualClock::new(T0);
    let l = limiter(&clock);
    assert!(!ask(&l, "1.1.1.1").await.over_limit);
    let first = ask(&l, "1.1.1.1").await;
    assert!(first.over_limit);
    assert_eq!(first.statuses[0].ban, Ban::None);
    assert_eq!(first.offender(0), Some("1.1.1.1"));
    let second = ask(&l, "1.1.1.1").await;
    assert_eq!(second.statuses[0].ban, Ban::Started);
    assert!(second.statuses[0].verdict.unwrap().retry_after >= 300 * SECOND);

    // A minute later the limit would admit again, but the ban holds.
    clock.advance(61 * SECOND);
    let keys_before = l.store().active_keys();
    let banned = ask(&l, "1.1.1.1").await;
    assert!(banned.over_limit);
    assert_eq!(banned.statuses[0].ban, Ban::Active);
    assert_eq!(
        banned.statuses[0].verdict.unwrap().retry_after,
        239 * SECOND
    );
    // The user counter was not spent: no store call was made.
    assert_eq!(banned.statuses[1].verdict, None);
    assert_eq!(l.store().active_keys(), keys_before);
    assert_eq!(l.penalties().active().len(), 1);
    assert_eq!(l.penalties().active()[0].info.key, "1.1.1.1");

    // Other keys are unaffected; the ban ends.
    assert!(!ask(&l, "2.2.2.2").await.over_limit);
    clock.advance(240 * SECOND);
    assert!(!ask(&l, "1.1.1.1").await.over_limit);
}

/// A charge may report a request already served, so a ban spends it; it may also be
/// a request's cost asked before it is served, so the ban denies it. A refund is
/// never denied.
#[tokio::test]
async fn a_ban_spends_a_charge_and_denies_it_and_drops_no_refund() {
    use crate::store::Spend;
    let clock = ManualClock::new(T0);
    let l = limiter(&clock);
    for _ in 0..3 {
        ask(&l, "1.1.1.1").await;
    }
    assert_eq!(ask(&l, "1.1.1.1").await.statuses[0].ban, Ban::Active);
    let ip = [("ip", "1.1.1.1")];
    let user = [("user", "v")];
    let with = |entries, hits, spend| Descriptor {
        spend,
        ..Descriptor::new(entries, hits)
    };
    let charge = [
        with(&ip[..], 5, Spend::Always),
        with(&user[..], 30, Spend::Always),
    ];
    let charged = l.decide("d", &charge).await;
    assert!(charged.over_limit, "{charged:?}");
    assert_eq!(charged.statuses[0].ban, Ban::Active);
    let wait = charged.statuses[0].verdict.expect("decided").retry_after;
    assert!(
        wait > 200 * SECOND,
        "the ban's wait, not the window's: {wait}"
    );
    // Both spent: the other key's share is counted...
    let check = l.decide("d", &[Descriptor::new(&user[..], 0)]).await;
    assert_eq!(check.statuses[0].verdict.unwrap().remaining, 70);
    // ...and the refund gives back the one admitted hit and the charge of 5: the
    // minute is empty.
    let refund = l.decide("d", &[with(&ip[..], 6, Spend::Refund)]).await;
    assert!(!refund.over_limit, "{refund:?}");
    assert_eq!(refund.statuses[0].verdict.unwrap().remaining, 1);
}

/// A `limit` override changes a descriptor's limit, not whose key it is: a ban of
/// the key, or an operator's block, denies it too.
#[tokio::test]
async fn a_limit_override_escapes_no_ban_or_block() {
    use crate::limiter::Override;
    use crate::policy::Unit;
    let clock = ManualClock::new(T0);
    let l = limiter(&clock);
    let generous = Some(Override {
        requests_per_unit: 1_000,
        unit: Unit::Minute,
    });
    let overridden = |entries| Descriptor {
        limit: generous,
        ..Descriptor::new(entries, 1)
    };
    for _ in 0..3 {
        ask(&l, "1.1.1.1").await;
    }
    let ip = [("ip", "1.1.1.1")];
    let o = l.decide("d", &[overridden(&ip[..])]).await;
    assert!(o.over_limit, "{o:?}");
    assert_eq!(o.statuses[0].ban, Ban::Active);
    // Another key under the same override is admitted.
    let other = [("ip", "2.2.2.2")];
    assert!(!l.decide("d", &[overridden(&other[..])]).await.over_limit);

    let user = [("user", "w")];
    assert!(!l.decide("d", &[overridden(&user[..])]).await.over_limit);
    l.block("d", &user, 60 * SECOND).await.expect("blocked");
    let o = l.decide("d", &[overridden(&user[..])]).await;
    assert!(o.over_limit, "{o:?}");
    assert_eq!(o.statuses[0].ban, Ban::Blocked);
}

/// Denials under a `limit` override count towards the matched rule's penalty, on
/// the key its sentences are kept under: a client whose every request carries an
/// override is banned as any other.
#[tokio::test]
async fn denials_under_a_limit_override_start_the_rules_ban() {
    use crate::limiter::Override;
    use crate::policy::Unit;
    let clock = ManualClock::new(T0);
    let l = limiter(&clock);
    let ip = [("ip", "3.3.3.3")];
    let overridden = Descriptor {
        limit: Some(Override {
            requests_per_unit: 1,
            unit: Unit::Minute,
        }),
        ..Descriptor::new(&ip[..], 1)
    };
    assert!(!l.decide("d", &[overridden]).await.over_limit);
    assert_eq!(
        l.decide("d", &[overridden]).await.statuses[0].ban,
        Ban::None
    );
    let started = l.decide("d", &[overridden]).await;
    assert_eq!(started.statuses[0].ban, Ban::Started, "{started:?}");
    // The ban is the key's: a request without the override is denied by it too.
    assert_eq!(ask(&l, "3.3.3.3").await.statuses[0].ban, Ban::Active);
}

const LOOP: &str = r#"
domain: d
descriptors:
  - key: ip
    rate_limit:
      unit: minute
      requests_per_unit: 10
      algorithm: fixed_window
      penalty:
        violations: 2
        within: 1m
        tighten: {factor: 0.2, for: 10m}
        block: {bans: 2, within: 1h, for: 1d}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: fixed_window}
"#;

async fn one(l: &Limiter<MemoryStore>, key: &str, value: &str) -> Outcome {
    let entries = [(key, value)];
    l.decide("d", &[Descriptor::new(&entries[..], 1)]).await
}

async fn admitted_in_a_row(l: &Limiter<MemoryStore>, ip: &str) -> u64 {
    let mut n = 0;
    while !one(l, "ip", ip).await.over_limit {
        n += 1;
        assert!(n <= 100, "never denied");
    }
    n
}

#[tokio::test]
async fn repeat_violations_tighten_the_limit_then_block_the_key() {
    let clock = ManualClock::new(T0);
    let l = crate::limiter::test_limiter(LOOP, &clock, Settings::default());
    // The full limit, then a second denial tightens it to a fifth.
    assert_eq!(admitted_in_a_row(&l, "1.1.1.1").await, 10);
    let second = one(&l, "ip", "1.1.1.1").await;
    assert_eq!(second.statuses[0].ban, Ban::Started);
    assert_eq!(l.penalties().active()[0].kind, Kind::Tighten);

    // Next minute: 2 of 10, and another key keeps its full limit.
    clock.advance(61 * SECOND);
    assert_eq!(admitted_in_a_row(&l, "1.1.1.1").await, 2);
    let tight = one(&l, "ip", "1.1.1.1").await;
    assert!(tight.statuses[0].tightened.is_some());
    assert_eq!(admitted_in_a_row(&l, "2.2.2.2").await, 10);

    // That was the key's second violation under the tighter limit: its second
    // sentence, which the block counts, so it is blocked.
    assert_eq!(tight.statuses[0].ban, Ban::Started);
    let listed = l.penalties().active();
    let b = listed.iter().find(|b| b.info.key == "1.1.1.1").unwrap();
    assert_eq!((b.kind, b.source), (Kind::Block, Source::Penalty));
    clock.advance(61 * SECOND);
    let keys_before = l.store().active_keys();
    let blocked = one(&l, "ip", "1.1.1.1").await;
    assert!(blocked.over_limit);
    assert_eq!(blocked.statuses[0].ban, Ban::Blocked);
    let wait = blocked.statuses[0].verdict.unwrap().retry_after;
    assert!(wait > 86_000 * SECOND && wait <= 86_400 * SECOND, "{wait}");
    assert_eq!(l.store().active_keys(), keys_before);

    // The block ends after its day; the key starts afresh at its full limit.
    clock.advance(86_400 * SECOND);
    assert_eq!(admitted_in_a_row(&l, "1.1.1.1").await, 10);
}

#[tokio::test]
async fn a_tightening_ends_and_the_full_limit_returns() {
    let clock = ManualClock::new(T0);
    let l = crate::limiter::test_limiter(LOOP, &clock, Settings::default());
    assert_eq!(admitted_in_a_row(&l, "1.1.1.1").await, 10);
    one(&l, "ip", "1.1.1.1").await;
    clock.advance(11 * 60 * SECOND);
    assert_eq!(admitted_in_a_row(&l, "1.1.1.1").await, 10);
}

#[tokio::test]
async fn an_operator_blocks_and_unblocks_a_key_of_a_rule_without_penalty() {
    let clock = ManualClock::new(T0);
    let l = crate::limiter::test_limiter(LOOP, &clock, Settings::default());
    assert!(!one(&l, "user", "mallory").await.over_limit);
    let put = l
        .block("d", &[("user", "mallory")], 300 * SECOND)
        .await
        .unwrap();
    assert_eq!((put.kind, put.source), (Kind::Block, Source::Operator));
    assert_eq!(put.info.rule, "user");
    let denied = one(&l, "user", "mallory").await;
    assert_eq!(denied.statuses[0].ban, Ban::Blocked);
    assert_eq!(
        denied.statuses[0].verdict.unwrap().retry_after,
        300 * SECOND
    );
    // Other users pass.
    assert!(!one(&l, "user", "alice").await.over_limit);

    assert!(l.unblock(&put.counter).await.unwrap());
    assert!(!l.unblock(&put.counter).await.unwrap());
    assert!(!one(&l, "user", "mallory").await.over_limit);

    // What names no limited rule is refused, and nothing is listed.
    assert!(matches!(
        l.block("nope", &[("user", "x")], SECOND).await,
        Err(crate::limiter::BlockError::Unknown(_))
    ));
    assert!(matches!(
        l.block("d", &[("path", "/")], SECOND).await,
        Err(crate::limiter::BlockError::Unknown(_))
    ));
    assert!(l.penalties().active().is_empty());
    // An operator's block also ends on its own.
    l.block("d", &[("user", "eve")], 10 * SECOND).await.unwrap();
    clock.advance(10 * SECOND);
    assert!(!one(&l, "user", "eve").await.over_limit);
    l.penalties().sweep();
    assert!(!l.penalties().operator_blocks());
}

/// A reload that takes a rule's `penalty` away lifts the bans it gave at once, and
/// an operator's block of another key, which has every rule's hits looked up, does
/// not bring them back; the operator's own block still holds. Listings and the
/// count of denied keys show what holds.
#[tokio::test]
async fn a_reload_without_the_penalty_lifts_its_bans_whatever_operators_block() {
    let clock = ManualClock::new(T0);
    let l = limiter(&clock);
    assert!(!one(&l, "ip", "a").await.over_limit);
    for _ in 0..2 {
        assert!(one(&l, "ip", "a").await.over_limit);
    }
    assert_eq!(one(&l, "ip", "a").await.statuses[0].ban, Ban::Active);
    assert_eq!((l.sentences().len(), l.denied_keys()), (1, 1));
    let lifted = POLICY.replace("      penalty: {violations: 2, within: 10s, ban: 5m}\n", "");
    let lifted = lifted.replace("requests_per_unit: 1\n", "requests_per_unit: 50\n");
    let docs = crate::policy::parse_str("p.yaml", &lifted).expect("parses");
    l.policy
        .store(Arc::new(crate::policy::compile(docs).expect("compiles")));
    assert!(!one(&l, "ip", "a").await.over_limit, "the ban went with it");
    assert_eq!(l.sentences(), vec![], "and is not listed");
    assert_eq!(l.denied_keys(), 0);
    l.block("d", &[("ip", "b")], 60 * SECOND).await.unwrap();
    let listed: Vec<_> = l.sentences().into_iter().map(|b| b.info.key).collect();
    assert_eq!(listed, ["b"], "the operator's block is");
    assert_eq!(l.denied_keys(), 1);
    assert!(l.penalties().operator_blocks());
    let o = one(&l, "ip", "a").await;
    assert!(
        !o.over_limit,
        "another key's block brought the ban back: {o:?}"
    );
    assert_eq!(one(&l, "ip", "b").await.statuses[0].ban, Ban::Blocked);
}

/// A rule in shadow or quota mode denies nothing, so a block there would be listed
/// in force while every request passed: it is refused, saying why.
#[tokio::test]
async fn a_block_on_a_rule_that_denies_nothing_is_refused() {
    let clock = ManualClock::new(T0);
    let policy = r#"
domain: d
descriptors:
  - key: watch
    rate_limit: {unit: minute, requests_per_unit: 3}
    shadow_mode: true
  - key: quota
    rate_limit: {unit: minute, requests_per_unit: 3}
    quota_mode: true
"#;
    let l = crate::limiter::test_limiter(policy, &clock, Settings::default());
    for (key, mode) in [("watch", "shadow mode"), ("quota", "quota_mode")] {
        match l.block("d", &[(key, "mallory")], SECOND).await {
            Err(crate::limiter::BlockError::NotEnforced(m)) => {
                assert!(m.contains(mode) && m.contains(&format!("'{key}'")), "{m}");
            }
            other => panic!("{key}: {other:?}"),
        }
    }
    assert!(l.penalties().active().is_empty());
    assert!(!l.penalties().operator_blocks());
}

#[test]
fn sync_lifts_what_the_shared_list_no_longer_holds_and_keeps_local_sentences() {
    use super::table::tests::{info, penalty};
    let clock = ManualClock::new(T0);
    let p = Penalties::new(Arc::new(clock.clone()), 1000);
    let shared = |key: &str, kind| Sentenced {
        key: key.to_string(),
        kind,
        remaining: 60 * SECOND,
        factor_ppm: 0,
        info: encode_info(&info(), Source::Operator),
        started: false,
    };
    p.sync(&[shared("a", Kind::Block), shared("b", Kind::Ban)]);
    assert_eq!(p.banned("a", clock.now()), Some(60 * SECOND));
    assert!(p.operator_blocks());
    let one = Penalty {
        violations: 1,
        ..penalty()
    };
    assert!(p.deny("local", &one, clock.now(), info).is_some());
    p.sync(&[shared("b", Kind::Ban)]);
    assert_eq!(p.banned("a", clock.now()), None);
    assert!(p.banned("b", clock.now()).is_some());
    assert!(p.banned("local", clock.now()).is_some());
    let active = p.active();
    assert_eq!(active.len(), 2);
    assert_eq!(
        active.iter().find(|b| b.counter == "b").unwrap().info,
        info()
    );
}
