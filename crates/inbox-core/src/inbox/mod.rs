//! Every query that writes `webhook_inbox`, by side: [`ingest`] for the receiver (store
//! deduplicated events, wake the workers) and [`lease`] for the worker (claim, and one
//! function per state transition, fenced by the lease token).

use std::time::Duration;

pub mod ingest;
pub mod lease;
pub mod pause;

pub use ingest::{
    insert_events, nonce_replay_key, notify_new_events, ordering_key, rehearse_insert, replay_key,
    EventOrdering, InsertOutcome, NewEvent, ReplayCheck,
};
pub use lease::{
    claim_due, complete, complete_all, complete_all_keyed, dead_letter, extend_lease,
    extend_leases, prepare_claim_session, release_unstarted, rescue_expired, schedule_retry, Claim,
    ClaimedEvent, KeyLocks, Rescued, TransitionError, RESCUE_REASON,
};

/// Longest `last_error` kept; error chains can be long and the row is read on every claim.
pub const MAX_ERROR_CHARS: usize = 2_000;

fn duration_millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// Keeps `error` within [`MAX_ERROR_CHARS`], on a character boundary.
fn truncate_error(error: &str) -> &str {
    match error.char_indices().nth(MAX_ERROR_CHARS) {
        Some((byte_index, _)) => &error[..byte_index],
        None => error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_errors_are_cut_on_a_character_boundary() {
        let long = "é".repeat(MAX_ERROR_CHARS + 10);
        assert_eq!(truncate_error(&long).chars().count(), MAX_ERROR_CHARS);
        assert_eq!(truncate_error("short"), "short");
    }
}
