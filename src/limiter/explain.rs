//! Explaining a decision without making it: the same matching, `replaces`, bans and
//! verdict rules as [`Limiter::decide`], with the store's read-only
//! [`peek`](crate::store::Store::peek) in place of its decision, so nothing is spent,
//! no penalty counts a denial, and no metric records it.

use std::time::Duration;

use super::{key, penalty, Descriptor, Limiter, Outcome, Status};
use crate::policy::{Entry, Trace};
use crate::store::{Mode, Store, StoreError};

/// Longest wait for the store's peek: an operator's call, not Envoy's, so the
/// request path's `--store-timeout` does not bound it.
const PEEK_TIMEOUT: Duration = Duration::from_secs(2);

/// What one request would get, and why.
#[derive(Debug, Clone)]
pub struct Explained {
    /// What [`Limiter::decide`] would answer now. Its `offenders` hold every
    /// limited descriptor's key as the top-offenders view shows it, denied or not.
    pub outcome: Outcome,
    /// Per request descriptor, in order.
    pub descriptors: Vec<Detail>,
}

/// How one descriptor was matched and counted.
#[derive(Debug, Clone, Default)]
pub struct Detail {
    /// How the descriptor walked its domain's tree; `None` for an unknown domain.
    pub trace: Option<Trace>,
    /// The rule matched before `replaces` was applied, when another matched rule
    /// replaced it.
    pub replaced: Option<usize>,
    /// The counter key, when a limit counts this descriptor.
    pub counter_key: Option<String>,
    /// How its verdict counts towards the request.
    pub mode: Option<Mode>,
}

impl<S: Store> Limiter<S> {
    /// What [`Limiter::decide`] would answer for this request now, spending nothing.
    pub async fn explain<E: Entry>(
        &self,
        domain: &str,
        descriptors: &[Descriptor<'_, E>],
    ) -> Explained {
        let policy = self.policy.load_full();
        let mut statuses: Vec<Status> = descriptors
            .iter()
            .map(|d| Status::undecided(d.hits, d.spend))
            .collect();
        let mut details = vec![Detail::default(); descriptors.len()];
        let Some(dom) = policy.domain(domain) else {
            return Explained {
                outcome: Outcome::undecided(policy, false, statuses, Vec::new()),
                descriptors: details,
            };
        };
        for (detail, d) in details.iter_mut().zip(descriptors) {
            detail.trace = Some(dom.trace(d.entries));
        }
        let (overrides, order, mut hits, failure_mode) = self.plan(
            &policy,
            dom,
            domain,
            descriptors,
            crate::algorithm::NO_DEADLINE,
            &mut statuses,
        );
        for ((detail, status), d) in details.iter_mut().zip(&statuses).zip(descriptors) {
            let matched = dom.find(d.entries);
            if status.rule.is_none() && status.limit_override.is_none() {
                detail.replaced = matched;
            }
        }
        for (&i, hit) in order.iter().zip(&hits) {
            // A rule with several limits shows its own limit's counter.
            if details[i].counter_key.is_none() {
                details[i].counter_key = Some(hit.key.clone());
                details[i].mode = Some(hit.mode);
            }
        }
        let mut outcome = Outcome::undecided(policy.clone(), true, statuses, overrides);
        let asked = penalty::Asked {
            domain,
            descriptors,
            hashing: &self.settings.hashing,
        };
        let sentenced =
            penalty::apply_sentences(&self.penalties, &asked, &order, &mut hits, &mut outcome);
        if !hits.is_empty() && !sentenced.denied {
            // What the store would decide on: the limits less missing replicas' shares.
            if failure_mode == crate::policy::FailureMode::Local {
                self.local.reserve(&mut hits);
            }
            let peeked = match tokio::time::timeout(PEEK_TIMEOUT, self.store.peek(&hits)).await {
                Ok(result) => result,
                Err(_) => Err(StoreError::Timeout),
            };
            self.settle(&mut outcome, &order, &hits, peeked, failure_mode);
            penalty::deny_charges(&sentenced.charges, &mut outcome);
        }
        // The state shown is the nearest limit's (`answered_by`, a further limit of
        // a `rate_limits` list): so is the counter key, `...|~86400s`, not the first
        // limit's.
        for (i, detail) in details.iter_mut().enumerate() {
            let status = &outcome.statuses[i];
            let (Some(by), Some(own)) = (status.answered_by, status.rule) else {
                continue;
            };
            let Some(k) = policy.rule(own).also.iter().position(|&id| id == by) else {
                continue;
            };
            let nearest = order.iter().zip(&hits).filter(|(&j, _)| j == i).nth(k + 1);
            if let Some((_, hit)) = nearest {
                detail.counter_key = Some(hit.key.clone());
            }
        }
        for (n, &i) in order.iter().enumerate() {
            if n > 0 && order[n - 1] == i {
                continue;
            }
            let Some(rule) = outcome.rule(&outcome.statuses[i]) else {
                continue;
            };
            let mut shown = String::new();
            key::offender(
                rule,
                descriptors[i].entries,
                &self.settings.hashing,
                &mut shown,
            );
            outcome.offenders.push((i, shown));
        }
        Explained {
            outcome,
            descriptors: details,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::SECOND;
    use crate::clock::ManualClock;
    use crate::limiter::{test_limiter, Ban, Settings};
    use crate::policy::{LevelMatch, NoMatch};

    const POLICY: &str = include_str!("../../tests/fixtures/explain.yaml");

    /// Explains, then decides the same request twice: the explanation must be what
    /// the first decision answers (it spent nothing), descriptor by descriptor.
    async fn agree(requests: &[&[(&str, &str)]]) -> Explained {
        let clock = ManualClock::new(1_000 * SECOND);
        let limiter = test_limiter(POLICY, &clock, Settings::default());
        let descriptors: Vec<Descriptor<'_, (&str, &str)>> =
            requests.iter().map(|e| Descriptor::new(e, 1)).collect();
        // Spend some first, so the counters are not fresh.
        limiter.decide("api", &descriptors).await;
        let explained = limiter.explain("api", &descriptors).await;
        let again = limiter.explain("api", &descriptors).await;
        let decided = limiter.decide("api", &descriptors).await;
        for e in [&explained, &again] {
            assert_eq!(e.outcome.over_limit, decided.over_limit, "{requests:?}");
            assert_eq!(e.outcome.statuses, decided.statuses, "{requests:?}");
        }
        explained
    }

    #[tokio::test]
    async fn each_matching_case_is_explained_as_it_is_decided() {
        let e = agree(&[&[("tenant", "acme")]]).await;
        let t = e.descriptors[0].trace.as_ref().unwrap();
        assert_eq!(t.levels, [LevelMatch::Exact]);
        assert_eq!(e.outcome.statuses[0].verdict.unwrap().remaining, 1);
        assert_eq!(
            e.descriptors[0].counter_key.as_deref(),
            Some("api|tenant=acme")
        );

        let e = agree(&[&[("tenant", "beta-7")]]).await;
        let t = e.descriptors[0].trace.as_ref().unwrap();
        assert_eq!(t.levels, [LevelMatch::Wildcard("beta-*".into())]);

        let e = agree(&[&[("tenant", "zeta")]]).await;
        assert_eq!(
            e.descriptors[0].trace.as_ref().unwrap().levels,
            [LevelMatch::KeyOnly]
        );

        let e = agree(&[&[("tenant", "zeta"), ("path", "/search")]]).await;
        let t = e.descriptors[0].trace.as_ref().unwrap();
        assert_eq!(t.levels, [LevelMatch::KeyOnly, LevelMatch::Exact]);
        assert_eq!(
            e.outcome.rule(&e.outcome.statuses[0]).unwrap().path,
            "tenant/path"
        );

        // Depth: the exact `acme` rule has no children, so a longer descriptor
        // matches nothing.
        let e = agree(&[&[("tenant", "acme"), ("path", "/search")]]).await;
        let t = e.descriptors[0].trace.as_ref().unwrap();
        assert_eq!(t.result, Err(NoMatch::Deeper(0)));
        assert!(e.outcome.statuses[0].rule.is_none());

        // Shadow: the second request is over the limit of 1 but admitted.
        let e = agree(&[&[("client", "c1")]]).await;
        assert_eq!(e.descriptors[0].mode, Some(Mode::Shadow));
        assert!(!e.outcome.statuses[0].verdict.unwrap().admitted);
        assert!(!e.outcome.over_limit);

        let e = agree(&[&[("health", "x")]]).await;
        assert!(e.descriptors[0].counter_key.is_none());
        assert!(e
            .outcome
            .rule(&e.outcome.statuses[0])
            .unwrap()
            .limit
            .is_none());

        let e = agree(&[&[("plan", "free")], &[("plan", "promo")]]).await;
        assert!(e.descriptors[0].replaced.is_some());
        assert!(e.outcome.statuses[0].rule.is_none());
        assert!(e.outcome.statuses[1].rule.is_some());

        let e = agree(&[&[("nothing", "here")]]).await;
        let t = e.descriptors[0].trace.as_ref().unwrap();
        assert_eq!(t.result, Err(NoMatch::Key(0)));
    }

    /// A `rate_limits` list answered by a further limit: the counter key shown is
    /// that limit's (its window after the key), the one whose state is shown.
    #[tokio::test]
    async fn a_list_shows_the_counter_of_the_limit_it_describes() {
        let clock = ManualClock::new(1_000 * SECOND);
        let limiter = test_limiter(
            "domain: api\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: second, requests_per_unit: 10}\n      - {unit: day, requests_per_unit: 2}\n",
            &clock,
            Settings::default(),
        );
        let d = [Descriptor::new(&[("k", "a")][..], 1)];
        let e = limiter.explain("api", &d).await;
        // Fresh: the per-second limit is the first; 9 left of 10 against 1 of 2, so
        // the daily one is nearest already.
        assert!(e.outcome.statuses[0].answered_by.is_some());
        assert_eq!(
            e.descriptors[0].counter_key.as_deref(),
            Some("api|k=a|~86400s")
        );
        limiter.decide("api", &d).await;
        limiter.decide("api", &d).await;
        let e = limiter.explain("api", &d).await;
        assert!(e.outcome.over_limit);
        assert_eq!(e.outcome.statuses[0].verdict.unwrap().remaining, 0);
        assert_eq!(
            e.descriptors[0].counter_key.as_deref(),
            Some("api|k=a|~86400s")
        );
    }

    #[tokio::test]
    async fn an_unknown_domain_is_explained_as_ok() {
        let clock = ManualClock::new(1_000 * SECOND);
        let limiter = test_limiter(POLICY, &clock, Settings::default());
        let d = [Descriptor::new(&[("tenant", "acme")][..], 1)];
        let e = limiter.explain("nope", &d).await;
        assert!(!e.outcome.domain_known && !e.outcome.over_limit);
        assert!(e.descriptors[0].trace.is_none());
    }

    #[tokio::test]
    async fn explaining_spends_nothing_and_counts_no_penalty() {
        let policy = "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: 1\n      penalty: {violations: 1, within: 1m, ban: 1h}\n";
        let clock = ManualClock::new(1_000 * SECOND);
        let limiter = test_limiter(policy, &clock, Settings::default());
        let d = [Descriptor::new(&[("k", "a")][..], 1)];
        for _ in 0..5 {
            let e = limiter.explain("d", &d).await;
            assert!(!e.outcome.over_limit);
        }
        assert!(
            !limiter.decide("d", &d).await.over_limit,
            "the explains spent nothing"
        );
        for _ in 0..3 {
            let e = limiter.explain("d", &d).await;
            assert!(e.outcome.over_limit);
            assert_eq!(
                e.outcome.statuses[0].ban,
                Ban::None,
                "no ban from explaining"
            );
        }
        let denied = limiter.decide("d", &d).await;
        assert_eq!(denied.statuses[0].ban, Ban::Started);
        let e = limiter.explain("d", &d).await;
        assert_eq!(e.outcome.statuses[0].ban, Ban::Active);
    }
}
