//! Sentences through the limiter: a denied request's offenders counted towards
//! their rule's `penalty` (here, or in a store that shares sentences), operators'
//! blocks and unblocks, and the sync of shared sentences.

use std::collections::HashSet;

use super::outcome::effective;
use super::{key, penalty, Ban, Descriptor, Limiter, Outcome, Status};
use crate::algorithm::{Micros, NO_DEADLINE};
use crate::policy::{Entry, Penalty, Policy};
use crate::store::{Hit, Mode, Sentenced, Spend, Store, StoreError, Strike};

/// Why a block could not be put or lifted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockError {
    /// The domain or entries name no limited rule.
    #[error("{0}")]
    Unknown(String),
    /// The entries' rule never denies (shadow or quota mode), so a block there
    /// would deny nothing.
    #[error("{0}")]
    NotEnforced(String),
    /// The store holding the shared block list failed.
    #[error("the store did not take it: {0}")]
    Store(String),
}

impl<S: Store> Limiter<S> {
    /// Puts the key `entries` name in `domain` on the block list for `span`: in
    /// process, and in a store that shares sentences. The entries must match a
    /// limited rule.
    pub async fn block<E: Entry>(
        &self,
        domain: &str,
        entries: &[E],
        span: Micros,
    ) -> Result<penalty::ActiveBan, BlockError> {
        let (key, info, mode) = self.sentence_of(domain, entries)?;
        if mode != Mode::Enforce {
            let why = match mode {
                Mode::Quota => "quota_mode",
                _ => "shadow mode",
            };
            return Err(BlockError::NotEnforced(format!(
                "rule '{}' of domain '{domain}' is in {why}: it denies nothing, so a block \
                 there would not be enforced",
                info.rule
            )));
        }
        let text = penalty::encode_info(&info, penalty::Source::Operator);
        let shared = self.store.shares_sentences();
        if shared {
            let sentence = crate::store::Sentenced {
                key: key.clone(),
                kind: crate::store::Kind::Block,
                remaining: span,
                factor_ppm: 0,
                info: text,
                started: true,
            };
            self.store
                .sentence(&sentence)
                .await
                .map_err(|e| BlockError::Store(e.to_string()))?;
        }
        self.penalties.put(
            &key,
            crate::store::Kind::Block,
            span,
            0,
            info.clone(),
            penalty::Source::Operator,
            shared,
        );
        let now = self.penalties.now();
        Ok(penalty::ActiveBan {
            info,
            kind: crate::store::Kind::Block,
            source: penalty::Source::Operator,
            counter: key,
            until: now.saturating_add(span),
            remaining: span,
            factor_ppm: 0,
        })
    }

    /// Lifts the sentence of a counter key, here and in a store that shares
    /// sentences; whether one was in force.
    pub async fn unblock(&self, counter: &str) -> Result<bool, BlockError> {
        let mut lifted = false;
        if self.store.shares_sentences() {
            lifted = self
                .store
                .pardon(counter)
                .await
                .map_err(|e| BlockError::Store(e.to_string()))?;
        }
        Ok(self.penalties.lift(counter) || lifted)
    }

    /// The counter key `entries` name in `domain`, and who it is.
    pub fn sentence_key<E: Entry>(
        &self,
        domain: &str,
        entries: &[E],
    ) -> Result<(String, penalty::BanInfo), BlockError> {
        self.sentence_of(domain, entries)
            .map(|(key, info, _)| (key, info))
    }

    /// [`Limiter::sentence_key`], and whether its rule's denials deny.
    fn sentence_of<E: Entry>(
        &self,
        domain: &str,
        entries: &[E],
    ) -> Result<(String, penalty::BanInfo, Mode), BlockError> {
        let guard = self.policy.load();
        let policy: &Policy = &guard;
        let dom = policy
            .domain(domain)
            .ok_or_else(|| BlockError::Unknown(format!("no policy has domain '{domain}'")))?;
        let descriptors = [Descriptor::new(entries, 1)];
        let mut statuses = [Status::undecided(1, Spend::IfAdmitted)];
        let (overrides, _order, hits, _) = self.plan(
            policy,
            dom,
            domain,
            &descriptors,
            NO_DEADLINE,
            &mut statuses,
        );
        let Some(hit) = hits.into_iter().next() else {
            return Err(BlockError::Unknown(
                "the entries match no limited rule of the domain".to_string(),
            ));
        };
        let rule = effective(policy, &overrides, &statuses[0]).ok_or_else(|| {
            BlockError::Unknown("the entries match no limited rule of the domain".to_string())
        })?;
        let mut shown = String::new();
        key::offender(rule, entries, &self.settings.hashing, &mut shown);
        Ok((
            hit.key,
            penalty::BanInfo {
                domain: domain.to_string(),
                rule: rule.path.clone(),
                key: shown,
            },
            hit.mode,
        ))
    }

    /// The sentences in force as requests meet them, longest remaining first: an
    /// operator's, and a penalty's while the serving policy gives its rule a
    /// penalty. A reload that takes the penalty (or the rule) away ends what it
    /// gave, though the record stays, unlisted, until its time.
    pub fn sentences(&self) -> Vec<penalty::ActiveBan> {
        let policy = self.policy.load();
        let penalised = penalised(&policy);
        self.penalties
            .active_where(|info, source| served(&penalised, info, source))
    }

    /// Keys denied outright now, of [`Limiter::sentences`].
    pub fn denied_keys(&self) -> usize {
        let policy = self.policy.load();
        let penalised = penalised(&policy);
        self.penalties
            .active_count_where(|info, source| served(&penalised, info, source))
    }

    /// Brings in the sentences of a store that shares them (other replicas'
    /// bans, operators' blocks and unblocks). The server runs it every second.
    pub async fn sync_sentences(&self) -> Result<(), StoreError> {
        if !self.store.shares_sentences() {
            return Ok(());
        }
        let list = self.store.sentences().await?;
        self.penalties.sync(&list);
        Ok(())
    }

    /// Counts denials in a store that shares sentences, and keeps the sentences it
    /// answers with.
    pub(super) async fn strike(&self, pending: Vec<penalty::Pending>, outcome: &mut Outcome) {
        for p in pending {
            if let Some(s) = self.count_shared(&p.strike()).await {
                if s.started {
                    penalty::mark_started(&mut outcome.statuses[p.status], s.kind, s.remaining);
                }
            }
        }
    }

    /// Whether sentences live in the store, shared by every replica, rather than
    /// in this process.
    pub fn shares_sentences(&self) -> bool {
        self.store.shares_sentences()
    }

    /// Counts `denials` of `key` at once towards `penalty` in a store that shares
    /// sentences (an RLQS report's), `info` ([`penalty::encode_info`]) kept with a
    /// sentence they start; the sentence in force after them, if any, kept here too.
    pub async fn strike_many(
        &self,
        key: &str,
        penalty: &Penalty,
        denials: u64,
        info: &str,
    ) -> Option<Sentenced> {
        self.count_shared(&penalty::strike(key, penalty, info, denials, false))
            .await
    }

    /// One strike in the store, within the store timeout; the sentence it answers
    /// with is learned. A failed count is logged: the denials stand, uncounted.
    async fn count_shared(&self, strike: &Strike<'_>) -> Option<Sentenced> {
        let call = self.store.strike(strike);
        let answer = match tokio::time::timeout(self.settings.store_timeout, call).await {
            Ok(answer) => answer,
            Err(_) => Err(StoreError::Timeout),
        };
        match answer {
            Ok(Some(s)) => {
                self.penalties.learn(&s);
                Some(s)
            }
            Ok(None) => None,
            Err(e) => {
                tracing::debug!(error = %e, "penalty count failed");
                None
            }
        }
    }

    /// Fills `outcome.offenders` for denied descriptors and counts their denials
    /// towards penalties: here, or (returned) in a store that shares sentences.
    /// Runs only when the request is denied.
    pub(super) fn note_offenders<E: Entry>(
        &self,
        domain: &str,
        descriptors: &[Descriptor<'_, E>],
        outcome: &mut Outcome,
        order: &[usize],
        hits: &[Hit],
    ) -> Vec<penalty::Pending> {
        let policy = outcome.policy.clone();
        let overrides = std::mem::take(&mut outcome.overrides);
        let shared = self.store.shares_sentences();
        let mut pending = Vec::new();
        for (n, (&i, hit)) in order.iter().zip(hits).enumerate() {
            // A rule's further limits (`rate_limits`) share its status: one offender,
            // counted under the rule's own key.
            if n > 0 && order[n - 1] == i {
                continue;
            }
            let status = &mut outcome.statuses[i];
            let Some(rule) = effective(&policy, &overrides, status) else {
                continue;
            };
            // A descriptor the failure mode answered is no offender.
            if !status.over_limit || (outcome.failure.is_some() && status.verdict.is_none()) {
                continue;
            }
            let mut shown = String::new();
            key::offender(
                rule,
                descriptors[i].entries,
                &self.settings.hashing,
                &mut shown,
            );
            // A descriptor with a `limit` override is counted under its matched
            // rule's key and penalty, where its sentences are looked up.
            let matched =
                penalty::matched_under_override(&policy, status).filter(|r| r.penalty.is_some());
            let mut matched_key = String::new();
            let (rule, key) = match matched {
                Some(m) => {
                    key::counter_key(
                        domain,
                        m,
                        descriptors[i].entries,
                        &self.settings.hashing,
                        &mut matched_key,
                    );
                    (m, matched_key.as_str())
                }
                None => (rule, hit.key.as_str()),
            };
            // Shedding is soft: it never counts towards a penalty.
            if status.ban == Ban::None && hit.mode == Mode::Enforce && !status.shed {
                match (&rule.penalty, shared) {
                    (Some(p), true) => {
                        let info = || penalty::BanInfo {
                            domain: domain.to_string(),
                            rule: rule.path.clone(),
                            key: shown.clone(),
                        };
                        // A tightened key is still denied often: its further denials
                        // are counted here, and only a count that reaches `violations`
                        // goes to the store, so a flood from it is not a flood of
                        // store calls.
                        let reached = status.tightened.is_some()
                            && self
                                .penalties
                                .deny(key, p, self.penalties.now(), info)
                                .is_some();
                        if status.tightened.is_none() || reached {
                            pending.push(penalty::Pending {
                                status: i,
                                key: key.to_string(),
                                penalty: *p,
                                reached,
                                info: penalty::encode_info(&info(), penalty::Source::Penalty),
                            });
                        }
                    }
                    (Some(_), false) => {
                        penalty::count_denial(&self.penalties, domain, rule, key, status, &shown)
                    }
                    (None, _) => {}
                }
            }
            outcome.offenders.push((i, shown));
        }
        outcome.overrides = overrides;
        pending
    }
}

/// The rules of `policy` with a penalty, as (domain, path).
fn penalised(policy: &Policy) -> HashSet<(&str, &str)> {
    policy
        .rules_by_domain()
        .into_iter()
        .filter(|(_, rule)| rule.penalty.is_some())
        .map(|(domain, rule)| (domain, rule.path.as_str()))
        .collect()
}

/// Whether a sentence is served: an operator's always, a penalty's while its rule
/// has one.
fn served(
    penalised: &HashSet<(&str, &str)>,
    info: &penalty::BanInfo,
    source: penalty::Source,
) -> bool {
    source == penalty::Source::Operator
        || penalised.contains(&(info.domain.as_str(), info.rule.as_str()))
}
