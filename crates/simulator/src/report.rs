//! The record of a run: what was sent, how the receivers answered, and what each event must
//! have become. Written as JSON by `inbox-simulator send --report FILE`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::plan::Fate;

/// The whole run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// Part of every event id of the run.
    pub run_id: String,
    /// Seed of the plan.
    pub seed: u64,
    /// Receiver base URLs, used in turn.
    pub targets: Vec<String>,
    /// Wall-clock length of the run, in milliseconds.
    pub elapsed_ms: u64,
    /// Sums over all events.
    pub totals: Totals,
    /// Every event, in plan order.
    pub events: Vec<EventRecord>,
}

/// Sums over a run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Events planned.
    pub events: u64,
    /// Events the provider sent genuinely (all but the forged-only ones).
    pub genuine_events: u64,
    /// Deliveries planned: genuine copies plus forged ones.
    pub deliveries: u64,
    /// Genuine copies planned (duplicates included).
    pub genuine_deliveries: u64,
    /// Forged deliveries planned (bad signatures, stale replays).
    pub forged_deliveries: u64,
    /// HTTP requests made, retries included.
    pub requests: u64,
    /// Genuine events with at least one 2xx.
    pub acked_events: u64,
    /// Genuine events never acknowledged, all attempts spent (each one is a lost event from
    /// the provider's point of view).
    pub unacked_events: u64,
    /// 2xx answers `{"status":"accepted"}`.
    pub accepted: u64,
    /// 2xx answers `{"status":"duplicate"}`: deliveries the receiver deduplicated.
    pub duplicates: u64,
    /// Non-2xx answers to genuine deliveries (503 while the database is away, ...), retried.
    pub refused: u64,
    /// Requests that got no answer (connection refused or reset, timeout), retried.
    pub transport_errors: u64,
    /// Forged deliveries answered 401, as they must be.
    pub forged_rejected: u64,
    /// Forged deliveries answered 2xx: must be 0.
    pub forged_accepted: u64,
    /// Deliveries given up after the retry budget (attempts or time).
    pub gave_up: u64,
    /// Every answer by HTTP status (0: no answer).
    pub by_status: BTreeMap<u16, u64>,
    /// Handshakes (challenges, pings) answered as the provider expects, before the events.
    #[serde(default)]
    pub handshakes: u64,
    /// Handshakes answered otherwise, or not at all: must be 0.
    #[serde(default)]
    pub handshakes_failed: u64,
}

/// One event of the run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EventRecord {
    /// Provider name.
    pub provider: String,
    /// Event id.
    pub event_id: String,
    /// Event type as the receiver reads it.
    pub event_type: Option<String>,
    /// The business object (order or payment id), when it has one.
    pub object: Option<String>,
    /// Payment amount, for payment events.
    pub amount: Option<i64>,
    /// Its sequence within its object, its ordering key (an ordered provider's events).
    #[serde(default)]
    pub sequence: Option<i64>,
    /// What the inbox must make of it.
    pub expected: Fate,
    /// Genuine copies planned.
    pub copies: u32,
    /// Forged copies planned.
    pub forged: u32,
    /// Whether a genuine copy got a 2xx.
    pub acked: bool,
    /// HTTP requests made for it, retries included.
    pub requests: u32,
    /// `accepted` answers (at most one, unless the inbox failed to deduplicate).
    pub accepted: u32,
    /// `duplicate` answers.
    pub duplicates: u32,
}

impl Report {
    /// A plain-text summary of the totals, one `name: value` per line.
    pub fn summary(&self) -> String {
        let t = &self.totals;
        let statuses: Vec<String> = t
            .by_status
            .iter()
            .map(|(status, n)| {
                if *status == 0 {
                    format!("no answer: {n}")
                } else {
                    format!("{status}: {n}")
                }
            })
            .collect();
        format!(
            "run {run} (seed {seed}) in {secs:.1} s\n\
             events:            {events} ({genuine} genuine, {forged_only} forged only)\n\
             deliveries:        {deliveries} planned ({gd} genuine, {fd} forged), {requests} requests\n\
             acked events:      {acked} of {genuine}, never acked: {unacked}\n\
             answers:           {accepted} accepted, {duplicates} duplicate, {refused} refused (retried), {transport} without answer (retried)\n\
             forgeries:         {frej} rejected, {facc} accepted\n\
             given up:          {gave_up} deliveries\n\
             by status:         {statuses}",
            run = self.run_id,
            seed = self.seed,
            secs = self.elapsed_ms as f64 / 1000.0,
            events = t.events,
            genuine = t.genuine_events,
            forged_only = t.events - t.genuine_events,
            deliveries = t.deliveries,
            gd = t.genuine_deliveries,
            fd = t.forged_deliveries,
            requests = t.requests,
            acked = t.acked_events,
            unacked = t.unacked_events,
            accepted = t.accepted,
            duplicates = t.duplicates,
            refused = t.refused,
            transport = t.transport_errors,
            frej = t.forged_rejected,
            facc = t.forged_accepted,
            gave_up = t.gave_up,
            statuses = statuses.join(", "),
        )
    }
}
