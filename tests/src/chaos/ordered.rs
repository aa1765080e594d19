//! The promises of ordered processing, checked on the demo handler's trace after a run: the
//! `demo_ledger` lines of ordered events, each written in the transaction that completed its
//! event (so only committed handlings appear) with the event's key, sequence, stale mark, the
//! start of its transaction, the transaction itself, when the writing statement started and
//! the moment it was written.
//!
//! Per key, the next event may only be claimed once the one before has committed, or be
//! handed on to run after it in the same transaction: in another transaction, it starts after
//! the earlier line was written; in the same one, its statement does. Its line gets a higher
//! id either way. The lines of a key in id order are therefore its handlings in commit order,
//! and their intervals [start, line written] never overlap, where the start is the
//! transaction's or, after a line of the same transaction, the statement's. Two handlings of a
//! key at once would show as a later one starting before an earlier one wrote its line (what
//! it cannot show: one that started in the moment between the other's write and its commit;
//! the unique index on keys in processing forbids that too). In that order, an event is marked
//! stale exactly when a higher sequence of its key was done before it.

use std::collections::{HashMap, HashSet};

use diesel::sql_types::{BigInt, Bool, Nullable, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use inbox_simulator::{Fate, Report};

use super::{invariant, Violations};

/// One committed handling of an ordered event: its `demo_ledger` line.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct Handling {
    /// The line's id: per key, the commit order.
    #[diesel(sql_type = BigInt)]
    pub line: i64,
    /// The event's provider.
    #[diesel(sql_type = Text)]
    pub provider: String,
    /// The event's id.
    #[diesel(sql_type = Text)]
    pub event_id: String,
    /// Its ordering key (`provider:value`).
    #[diesel(sql_type = Text)]
    pub key: String,
    /// Its sequence within the key.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub sequence: Option<i64>,
    /// Whether it reached the handler marked stale.
    #[diesel(sql_type = Bool)]
    pub stale: bool,
    /// When its transaction started, in microseconds since the epoch.
    #[diesel(sql_type = BigInt)]
    pub started_us: i64,
    /// The transaction that wrote the line (none on lines older than the column).
    #[diesel(sql_type = Nullable<BigInt>)]
    pub transaction: Option<i64>,
    /// When the statement that wrote the line started, in microseconds since the epoch.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub statement_started_us: Option<i64>,
    /// When the handler wrote the line, in microseconds since the epoch.
    #[diesel(sql_type = BigInt)]
    pub written_us: i64,
}

/// Every ordered handling, by key, then in commit order.
pub async fn load_trace(conn: &mut AsyncPgConnection) -> diesel::QueryResult<Vec<Handling>> {
    diesel::sql_query(
        "SELECT id AS line, provider, event_id, ordering_key AS key, \
             ordering_sequence AS sequence, stale, \
             floor(extract(epoch FROM recorded_at) * 1000000)::int8 AS started_us, \
             transaction_id AS transaction, \
             floor(extract(epoch FROM statement_started_at) * 1000000)::int8 \
                 AS statement_started_us, \
             floor(extract(epoch FROM written_at) * 1000000)::int8 AS written_us \
         FROM demo_ledger WHERE ordering_key IS NOT NULL ORDER BY ordering_key, id",
    )
    .load(conn)
    .await
}

/// Keys still held by an event or blocked by a dead one once the inbox is drained: each would
/// keep its key's later events from ever running.
pub async fn keys_left_taken(conn: &mut AsyncPgConnection) -> diesel::QueryResult<i64> {
    super::number(
        conn,
        "SELECT count(*) AS n FROM inbox_keys WHERE blocked_by IS NOT NULL OR EXISTS ( \
         SELECT 1 FROM inbox_queue AS held \
         WHERE held.ordering_key = inbox_keys.ordering_key AND held.status = 1)",
    )
    .await
}

/// What the trace held.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    /// Ordered events the inbox stored and had to hand to the handler.
    pub events: u64,
    /// Their keys.
    pub keys: u64,
    /// Handlings marked stale (late arrivals).
    pub stale: u64,
}

/// An ordered event as planned: its key and sequence.
type Planned = (String, i64);

/// Checks `trace` (as [`load_trace`] orders it) against the report: every ordered event
/// stored (a key of `stored`) handled once under its planned key and sequence, and per key
/// one handling at a time, in sequence order, late arrivals marked stale.
pub(super) fn check(
    trace: &[Handling],
    report: &Report,
    stored: &HashSet<(&str, &str)>,
    v: &mut Violations,
) -> Tally {
    let mut planned: HashMap<(&str, &str), Planned> = HashMap::new();
    for event in &report.events {
        let (Some(object), Some(sequence)) = (&event.object, event.sequence) else {
            continue;
        };
        let id = (event.provider.as_str(), event.event_id.as_str());
        if event.expected == Fate::Effect && stored.contains(&id) {
            let key = inbox_core::inbox::ordering_key(&event.provider, object);
            planned.insert(id, (key, sequence));
        }
    }
    let mut handled: HashMap<(&str, &str), Vec<&Handling>> = HashMap::new();
    for handling in trace {
        let id = (handling.provider.as_str(), handling.event_id.as_str());
        handled.entry(id).or_default().push(handling);
    }
    for (&(provider, event_id), (key, sequence)) in &planned {
        let what = format!("{provider}/{event_id} (key {key}, sequence {sequence})");
        match handled.get(&(provider, event_id)).map(Vec::as_slice) {
            None | Some([]) => v.add(invariant::ORDERED_ONCE, format!("{what} never handled")),
            Some([one]) if one.key != *key || one.sequence != Some(*sequence) => v.add(
                invariant::ORDERED_ONCE,
                format!(
                    "{what} handled as key {}, sequence {:?}",
                    one.key, one.sequence
                ),
            ),
            Some([_]) => {}
            Some(more) => v.add(
                invariant::ORDERED_ONCE,
                format!("{what} handled {} times", more.len()),
            ),
        }
    }
    for (provider, event_id) in handled.keys() {
        if !planned.contains_key(&(provider, event_id)) {
            v.add(
                invariant::ORDERED_ONCE,
                format!("{provider}/{event_id} handled as an ordered event it was not"),
            );
        }
    }
    let mut tally = Tally {
        events: planned.len() as u64,
        ..Tally::default()
    };
    for handlings in trace.chunk_by(|a, b| a.key == b.key) {
        tally.keys += 1;
        tally.stale += handlings.iter().filter(|h| h.stale).count() as u64;
        check_key(handlings, v);
    }
    tally
}

impl Handling {
    /// When this handling began, as far as the trace can tell, for comparing with `earlier`'s
    /// write: its statement's start after a line of its own transaction (events handed on run
    /// one after the other in it), its transaction's start otherwise.
    fn started_after_us(&self, earlier: &Handling) -> i64 {
        match (self.transaction, self.statement_started_us) {
            (Some(transaction), Some(statement)) if earlier.transaction == Some(transaction) => {
                statement
            }
            _ => self.started_us,
        }
    }
}

/// Checks one key's handlings, in commit order: none starts before an earlier one wrote its
/// line, and each is marked stale exactly when a higher sequence was done before it.
pub(super) fn check_key(handlings: &[Handling], v: &mut Violations) {
    let mut highest: Option<&Handling> = None;
    let mut latest_write: Option<&Handling> = None;
    for handling in handlings {
        let what = format!(
            "key {}: {}/{} (sequence {:?}{})",
            handling.key,
            handling.provider,
            handling.event_id,
            handling.sequence,
            if handling.stale { ", stale" } else { "" }
        );
        if let Some(earlier) = latest_write {
            let started_us = handling.started_after_us(earlier);
            if started_us < earlier.written_us {
                v.add(
                    invariant::ORDERED_ONE_AT_A_TIME,
                    format!(
                        "{what} started {} µs before {} (sequence {:?}) wrote its line",
                        earlier.written_us - started_us,
                        earlier.event_id,
                        earlier.sequence
                    ),
                );
            }
        }
        if latest_write.is_none_or(|e| handling.written_us > e.written_us) {
            latest_write = Some(handling);
        }
        let Some(sequence) = handling.sequence else {
            v.add(invariant::ORDERED_ONCE, format!("{what} has no sequence"));
            continue;
        };
        let done_above = highest.filter(|h| h.sequence.is_some_and(|high| sequence < high));
        match (handling.stale, done_above) {
            (false, Some(above)) => v.add(
                invariant::ORDERED_SEQUENCE,
                format!(
                    "{what} handled after {} (sequence {:?}) without being marked stale",
                    above.event_id, above.sequence
                ),
            ),
            (true, None) => v.add(
                invariant::ORDERED_SEQUENCE,
                format!(
                    "{what} marked stale, yet no higher sequence was done before it (highest {:?})",
                    highest.and_then(|h| h.sequence)
                ),
            ),
            _ => {}
        }
        if highest.is_none_or(|h| h.sequence.is_none_or(|high| sequence > high)) {
            highest = Some(handling);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Handlings of one key `k`: (event, sequence, stale, started, written), in commit order.
    fn trace(handlings: &[(&str, i64, bool, i64, i64)]) -> Vec<Handling> {
        handlings
            .iter()
            .enumerate()
            .map(
                |(line, &(event_id, sequence, stale, started_us, written_us))| Handling {
                    line: line as i64 + 1,
                    provider: "ordered".into(),
                    event_id: event_id.into(),
                    key: "ordered:k".into(),
                    sequence: Some(sequence),
                    stale,
                    started_us,
                    // Each in a transaction of its own, its statement starting with it.
                    transaction: Some(line as i64 + 1),
                    statement_started_us: Some(started_us),
                    written_us,
                },
            )
            .collect()
    }

    /// `handlings` as lines of one transaction that started at 0, each written by a statement
    /// of its own: (event, sequence, statement started, written).
    fn one_transaction(handlings: &[(&str, i64, i64, i64)]) -> Vec<Handling> {
        let steps: Vec<_> = handlings
            .iter()
            .map(|&(event_id, sequence, _, written_us)| (event_id, sequence, false, 0, written_us))
            .collect();
        trace(&steps)
            .into_iter()
            .zip(handlings)
            .map(|(handling, &(_, _, statement_us, _))| Handling {
                transaction: Some(7),
                statement_started_us: Some(statement_us),
                ..handling
            })
            .collect()
    }

    fn breaches(handlings: &[Handling]) -> Vec<(&'static str, String)> {
        let mut v = Violations::default();
        check_key(handlings, &mut v);
        v.finish()
            .into_iter()
            .map(|violation| (violation.invariant, violation.detail))
            .collect()
    }

    #[test]
    fn handlings_one_after_another_in_sequence_with_late_ones_marked_stale_pass() {
        let good = trace(&[
            ("a", 1, false, 0, 10),
            ("c", 3, false, 20, 30),
            // A late arrival below what was done: handled after, marked stale.
            ("b", 2, true, 40, 50),
            ("d", 4, false, 60, 70),
        ]);
        assert_eq!(breaches(&good), vec![]);
    }

    #[test]
    fn a_lower_sequence_handled_later_without_the_stale_mark_is_a_violation() {
        let unmarked = trace(&[("b", 2, false, 0, 10), ("a", 1, false, 20, 30)]);
        let found = breaches(&unmarked);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, invariant::ORDERED_SEQUENCE);
        assert!(
            found[0].1.contains("without being marked stale"),
            "{found:?}"
        );
    }

    #[test]
    fn a_stale_mark_with_nothing_higher_done_before_is_a_violation() {
        for wrongly in [
            trace(&[("a", 1, true, 0, 10)]),
            trace(&[("a", 1, false, 0, 10), ("b", 2, true, 20, 30)]),
        ] {
            let found = breaches(&wrongly);
            assert_eq!(found.len(), 1, "{found:?}");
            assert_eq!(found[0].0, invariant::ORDERED_SEQUENCE);
            assert!(found[0].1.contains("marked stale, yet"), "{found:?}");
        }
    }

    #[test]
    fn two_handlings_of_a_key_at_once_are_a_violation() {
        // The second started before the first wrote its line.
        let overlapping = trace(&[("a", 1, false, 0, 30), ("b", 2, false, 20, 40)]);
        let found = breaches(&overlapping);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, invariant::ORDERED_ONE_AT_A_TIME);
        assert!(found[0].1.contains("started 10 µs before a"), "{found:?}");
        // Touching is not overlapping: the next may start as the line is written.
        let touching = trace(&[("a", 1, false, 0, 30), ("b", 2, false, 30, 40)]);
        assert_eq!(breaches(&touching), vec![]);
    }

    #[test]
    fn events_handed_on_within_one_transaction_are_judged_by_their_statements() {
        // All three lines carry the transaction's start; each statement began after the line
        // before was written.
        let in_turn = one_transaction(&[("a", 1, 5, 10), ("b", 2, 12, 20), ("c", 3, 21, 30)]);
        assert_eq!(breaches(&in_turn), vec![]);
        // A statement that began before the line before it was written overlapped it.
        let overlapping = one_transaction(&[("a", 1, 5, 10), ("b", 2, 8, 20)]);
        let found = breaches(&overlapping);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, invariant::ORDERED_ONE_AT_A_TIME);
        assert!(found[0].1.contains("started 2 µs before a"), "{found:?}");
        // Lines of two transactions are still judged by the later transaction's start, however
        // late its statement began.
        let mut across = trace(&[("a", 1, false, 0, 30), ("b", 2, false, 20, 40)]);
        across[1].statement_started_us = Some(35);
        assert_eq!(breaches(&across).len(), 1);
    }

    fn report(events: &[(&str, i64)]) -> Report {
        let records = events
            .iter()
            .map(|&(event_id, sequence)| inbox_simulator::EventRecord {
                provider: "ordered".into(),
                event_id: event_id.into(),
                event_type: Some("order.updated".into()),
                object: Some("k".into()),
                amount: None,
                sequence: Some(sequence),
                expected: Fate::Effect,
                copies: 2,
                forged: 0,
                acked: true,
                requests: 2,
                accepted: 1,
                duplicates: 1,
            })
            .collect();
        Report {
            run_id: "r".into(),
            seed: 1,
            targets: Vec::new(),
            elapsed_ms: 0,
            totals: inbox_simulator::Totals::default(),
            events: records,
        }
    }

    #[test]
    fn every_stored_ordered_event_is_handled_once_under_its_own_key_and_sequence() {
        let report = report(&[("a", 1), ("b", 2), ("c", 3)]);
        let stored: HashSet<(&str, &str)> = [("ordered", "a"), ("ordered", "b"), ("ordered", "c")]
            .into_iter()
            .collect();
        let good = trace(&[
            ("a", 1, false, 0, 10),
            ("c", 3, false, 20, 30),
            ("b", 2, true, 40, 50),
        ]);
        let mut v = Violations::default();
        let tally = check(&good, &report, &stored, &mut v);
        assert_eq!(v.finish().len(), 0);
        assert_eq!(
            tally,
            Tally {
                events: 3,
                keys: 1,
                stale: 1
            }
        );

        // `b` missing, `a` twice (the second marked stale, as it would be), `c` under another
        // sequence.
        let bad = trace(&[
            ("a", 1, false, 0, 10),
            ("c", 7, false, 20, 30),
            ("a", 1, true, 40, 50),
        ]);
        let mut v = Violations::default();
        check(&bad, &report, &stored, &mut v);
        let mut found: Vec<String> = v
            .finish()
            .into_iter()
            .inspect(|violation| assert_eq!(violation.invariant, invariant::ORDERED_ONCE))
            .map(|violation| violation.detail)
            .collect();
        found.sort();
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found[0].contains("ordered/a") && found[0].ends_with("handled 2 times"));
        assert!(found[1].contains("ordered/b") && found[1].ends_with("never handled"));
        assert!(found[2].contains("ordered/c") && found[2].contains("sequence Some(7)"));
    }
}
