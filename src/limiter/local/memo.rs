//! What the store last said of counters (how much of each was used, and until when
//! that holds), for a local counter to start from: a direct-mapped table of atomics,
//! written for `local` domains on every store answer, without a lock or an
//! allocation.
//!
//! Two counters may share a slot and be written at once. Each slot is a seqlock:
//! a writer makes its sequence odd (skipping the write if another writer has),
//! stores, then makes it even again; a reader takes the slot only if the sequence
//! was even and unchanged around its loads. So a reader gets its own counter's
//! word or nothing, never a mix of two counters'.

use std::sync::atomic::{fence, AtomicU64, Ordering};

use crate::algorithm::Micros;
use crate::store::Hit;

/// Slots of the memo: a busy replica remembers its most recent counters and an
/// idle one loses nothing that matters.
const SLOTS: usize = 1 << 13;

/// What the store last said of counters, by the hash of their key and algorithm
/// (the store keeps each algorithm's counter apart: a rule reloaded to another
/// algorithm starts a fresh one there, and so here).
pub(super) struct Memo {
    slots: Box<[Slot]>,
    hasher: ahash::RandomState,
}

#[derive(Default)]
struct Slot {
    /// Even while the slot is whole, odd while a writer fills it.
    seq: AtomicU64,
    /// The counter's hash; 0 for an empty slot.
    tag: AtomicU64,
    /// How much of the counter was used.
    used: AtomicU64,
    /// Until when (limiter clock, µs) that stands: the counter's reset.
    until: AtomicU64,
}

/// A slot's fields as one read saw them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Word {
    tag: u64,
    used: u64,
    until: Micros,
}

impl Slot {
    /// Starts a write: the even sequence it found, or `None` while another writer
    /// holds the slot (this write is dropped: a counter written at the same moment
    /// takes the slot, as it would have had it written last).
    fn claim(&self) -> Option<u64> {
        let seq = self.seq.load(Ordering::Relaxed);
        if seq & 1 == 1 {
            return None;
        }
        // Acquire: the last writer's stores come before this one's.
        self.seq
            .compare_exchange(seq, seq + 1, Ordering::Acquire, Ordering::Relaxed)
            .ok()?;
        // The odd sequence is seen before any of the stores that follow.
        fence(Ordering::Release);
        Some(seq)
    }

    fn fill(&self, word: Word) {
        self.tag.store(word.tag, Ordering::Relaxed);
        self.used.store(word.used, Ordering::Relaxed);
        self.until.store(word.until, Ordering::Relaxed);
    }

    /// Ends the write [`Slot::claim`] started at `seq`.
    fn release(&self, seq: u64) {
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// The slot's fields and the sequence they were read at; `None` mid-write.
    fn load(&self) -> Option<(u64, Word)> {
        let seq = self.seq.load(Ordering::Acquire);
        if seq & 1 == 1 {
            return None;
        }
        let word = Word {
            tag: self.tag.load(Ordering::Relaxed),
            used: self.used.load(Ordering::Relaxed),
            until: self.until.load(Ordering::Relaxed),
        };
        Some((seq, word))
    }

    /// Whether no write has started since [`Slot::load`] read at `seq`.
    fn unchanged(&self, seq: u64) -> bool {
        fence(Ordering::Acquire);
        self.seq.load(Ordering::Relaxed) == seq
    }
}

impl Memo {
    pub(super) fn new() -> Memo {
        Memo {
            slots: (0..SLOTS).map(|_| Slot::default()).collect(),
            hasher: ahash::RandomState::new(),
        }
    }

    fn hash(&self, hit: &Hit) -> u64 {
        self.hasher
            .hash_one((hit.key.as_str(), hit.limit.algorithm))
            .max(1)
    }

    fn slot(&self, tag: u64) -> &Slot {
        &self.slots[tag as usize % SLOTS]
    }

    /// The store said `used` of `hit`'s counter was used, until `until`.
    pub(super) fn write(&self, hit: &Hit, used: u64, until: Micros) {
        let tag = self.hash(hit);
        let slot = self.slot(tag);
        if let Some(seq) = slot.claim() {
            slot.fill(Word { tag, used, until });
            slot.release(seq);
        }
    }

    /// How much of `hit`'s counter was used, if the store said so and it still
    /// stands at `now`.
    pub(super) fn read(&self, hit: &Hit, now: Micros) -> Option<u64> {
        let tag = self.hash(hit);
        let slot = self.slot(tag);
        let (seq, word) = slot.load()?;
        (slot.unchanged(seq) && word.tag == tag && word.until > now).then_some(word.used)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One step of a writer (each of its stores apart, as [`Slot::fill`] makes
    /// them) or of the reader of a slot.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Step {
        Claim,
        Tag,
        Used,
        Until,
        Release,
        Load,
        Check,
    }

    const WRITE: [Step; 5] = [
        Step::Claim,
        Step::Tag,
        Step::Used,
        Step::Until,
        Step::Release,
    ];
    const READ: [Step; 2] = [Step::Load, Step::Check];

    /// Every order of the steps of `actors` (each actor's own in sequence).
    fn interleavings(actors: &[&[Step]]) -> Vec<Vec<(usize, Step)>> {
        fn go(
            actors: &[&[Step]],
            next: &mut Vec<usize>,
            order: &mut Vec<(usize, Step)>,
            out: &mut Vec<Vec<(usize, Step)>>,
        ) {
            let mut done = true;
            for a in 0..actors.len() {
                if let Some(&step) = actors[a].get(next[a]) {
                    done = false;
                    next[a] += 1;
                    order.push((a, step));
                    go(actors, next, order, out);
                    order.pop();
                    next[a] -= 1;
                }
            }
            if done {
                out.push(order.clone());
            }
        }
        let mut out = Vec::new();
        go(
            actors,
            &mut vec![0; actors.len()],
            &mut Vec::new(),
            &mut out,
        );
        out
    }

    /// Two counters of one slot written at once (`A` with 5 used, `B` with 90),
    /// the slot holding `A`'s earlier word (1 used), and a reader of `A` between
    /// them, their steps in every order: the reader gets one of `A`'s words or
    /// nothing, never `B`'s, and after both writes the slot is whole.
    #[test]
    fn a_reader_gets_its_own_counters_word_or_nothing_however_two_writers_interleave() {
        const A: u64 = 0xA;
        const B: u64 = 0xB;
        let words = [
            Word {
                tag: A,
                used: 5,
                until: 100,
            },
            Word {
                tag: B,
                used: 90,
                until: 200,
            },
        ];
        let orders = interleavings(&[&WRITE, &WRITE, &READ]);
        assert_eq!(orders.len(), 16_632);
        let mut got_new = 0;
        for order in orders {
            let slot = Slot::default();
            let seq = slot.claim().expect("no other writer");
            slot.fill(Word {
                tag: A,
                used: 1,
                until: 100,
            });
            slot.release(seq);
            let mut claimed = [None, None];
            let mut loaded = None;
            let mut read = None;
            for &(actor, step) in &order {
                match step {
                    Step::Claim => claimed[actor] = slot.claim(),
                    Step::Tag | Step::Used | Step::Until if claimed[actor].is_some() => {
                        let (field, value) = match step {
                            Step::Tag => (&slot.tag, words[actor].tag),
                            Step::Used => (&slot.used, words[actor].used),
                            _ => (&slot.until, words[actor].until),
                        };
                        field.store(value, Ordering::Relaxed);
                    }
                    Step::Tag | Step::Used | Step::Until => {}
                    Step::Release => {
                        if let Some(seq) = claimed[actor] {
                            slot.release(seq);
                        }
                    }
                    Step::Load => loaded = slot.load(),
                    Step::Check => {
                        read = loaded
                            .filter(|&(seq, w)| slot.unchanged(seq) && w.tag == A)
                            .map(|(_, w)| w.used);
                    }
                }
            }
            assert!(
                matches!(read, None | Some(1) | Some(5)),
                "{order:?}: A read {read:?}"
            );
            got_new += usize::from(read == Some(5));
            let (_, whole) = slot.load().expect("no write under way");
            assert!(
                whole == words[0] || whole == words[1],
                "{order:?}: {whole:?}"
            );
        }
        assert!(got_new > 0, "a read after A's write gets it");
    }

    /// The memo's own path: a counter reads what was written of it, until its
    /// reset; one of its slot written later takes the slot.
    #[test]
    fn a_counter_reads_its_latest_word_until_its_reset_and_never_another_counters() {
        let memo = Memo::new();
        let hit = |key: &str| {
            crate::store::testkit::hit(key, crate::algorithm::Algorithm::FixedWindow, 100, 1)
        };
        // Two keys of one slot.
        let mut seen = std::collections::HashMap::new();
        let (a, b) = (0..)
            .find_map(|i| {
                let h = hit(&format!("d|k={i}"));
                let at = memo.hash(&h) as usize % SLOTS;
                match seen.remove(&at) {
                    Some(other) => Some((other, h)),
                    None => {
                        seen.insert(at, h);
                        None
                    }
                }
            })
            .expect("a pair");
        assert_eq!(memo.read(&a, 0), None);
        memo.write(&a, 5, 100);
        assert_eq!(memo.read(&a, 99), Some(5));
        assert_eq!(memo.read(&a, 100), None, "past its reset");
        assert_eq!(memo.read(&b, 0), None);
        memo.write(&b, 90, 100);
        assert_eq!((memo.read(&a, 0), memo.read(&b, 0)), (None, Some(90)));
    }
}
