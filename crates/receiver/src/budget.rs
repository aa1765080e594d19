//! The global budget of request body bytes in flight: memory stays bounded whatever arrives.
//!
//! A request reserves bytes as its body arrives, covering the buffer that holds them: a
//! declared `Content-Length` is a promise, not bytes, so idle or slow senders hold only what
//! they have sent. When the budget cannot cover the next chunk, the request is answered 503
//! with `Retry-After` at once, the rest of its body unread, so the provider retries later. The
//! reservation lasts until the answer, covering the body's copies on its way to the database.
//!
//! Large bodies (declaring, or reaching, more than 64 KiB) leave a quarter of the budget to
//! small ones: a flood of large uploads, signed or not, cannot turn away the small webhooks
//! most providers send. Start-up refuses a `--max-body-bytes` that could never fit
//! ([`BodyBudget::largest_body`]).

use std::sync::Arc;

use prometheus::IntGauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Bodies up to this size may use the whole budget; larger ones only three quarters of it.
pub const SMALL_BODY_BYTES: usize = 64 * 1024;

/// Shared by every request of the server; cheap to clone.
#[derive(Debug, Clone)]
pub struct BodyBudget {
    bytes: Arc<Semaphore>,
    /// Kept for small bodies only.
    headroom: usize,
    in_flight: IntGauge,
}

/// Bytes reserved by one request, given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    permit: Option<OwnedSemaphorePermit>,
    /// The body's declared length (0 when unknown): a body declaring more than
    /// [`SMALL_BODY_BYTES`] is large from its first byte.
    declared: usize,
    in_flight: IntGauge,
}

impl Reservation {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.permit
            .as_ref()
            .map_or(0, OwnedSemaphorePermit::num_permits)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.in_flight
            .sub(i64::try_from(self.bytes()).unwrap_or(i64::MAX));
    }
}

impl BodyBudget {
    /// A budget of `total` bytes; `in_flight` follows what is reserved.
    pub fn new(total: usize, in_flight: IntGauge) -> Self {
        let total = usable(total);
        Self {
            bytes: Arc::new(Semaphore::new(total)),
            headroom: total / 4,
            in_flight,
        }
    }

    /// The largest body a budget of `total` bytes can ever take, when nothing else is in
    /// flight: all of it for a small body, three quarters for a large one.
    #[must_use]
    pub fn largest_body(total: usize) -> usize {
        let total = usable(total);
        let large = total - total / 4;
        if large > SMALL_BODY_BYTES {
            large
        } else {
            total.min(SMALL_BODY_BYTES)
        }
    }

    /// An empty reservation, to grow as a body arrives; `declared` is its `Content-Length`.
    pub fn empty(&self, declared: Option<usize>) -> Reservation {
        Reservation {
            permit: None,
            declared: declared.unwrap_or(0),
            in_flight: self.in_flight.clone(),
        }
    }

    /// Adds `bytes` to `reservation`; `false` (nothing added) when the budget cannot cover
    /// them now.
    pub fn grow(&self, reservation: &mut Reservation, bytes: usize) -> bool {
        if bytes == 0 {
            return true;
        }
        let total = (reservation.bytes() + bytes).max(reservation.declared);
        let keep_free = if total <= SMALL_BODY_BYTES {
            0
        } else {
            self.headroom
        };
        if self.bytes.available_permits() < bytes + keep_free {
            return false;
        }
        let Ok(count) = u32::try_from(bytes) else {
            return false;
        };
        let Ok(permit) = Arc::clone(&self.bytes).try_acquire_many_owned(count) else {
            return false;
        };
        match &mut reservation.permit {
            Some(held) => held.merge(permit),
            None => reservation.permit = Some(permit),
        }
        self.in_flight.add(i64::try_from(bytes).unwrap_or(i64::MAX));
        true
    }
}

/// `total` as a semaphore can hold it (at most `Semaphore::MAX_PERMITS`).
fn usable(total: usize) -> usize {
    total.clamp(1, Semaphore::MAX_PERMITS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(total: usize) -> BodyBudget {
        BodyBudget::new(
            total,
            IntGauge::new("in_flight", "test").unwrap_or_else(|e| panic!("{e}")),
        )
    }

    #[test]
    fn large_bodies_leave_a_quarter_to_small_ones_and_give_bytes_back_when_done() {
        let budget = budget(1024 * 1024);
        let mut large = budget.empty(None);
        assert!(budget.grow(&mut large, 700 * 1024));
        let mut second_large = budget.empty(None);
        assert!(
            !budget.grow(&mut second_large, 100 * 1024),
            "would eat into the small bodies' quarter"
        );
        let mut small = budget.empty(None);
        assert!(budget.grow(&mut small, 60 * 1024), "small bodies still fit");
        assert_eq!(budget.in_flight.get(), 760 * 1024);
        drop(large);
        assert!(budget.grow(&mut second_large, 100 * 1024));
        assert_eq!(budget.in_flight.get(), 160 * 1024);
    }

    #[test]
    fn a_body_declared_large_leaves_the_small_bodies_quarter_from_its_first_byte() {
        let budget = budget(256 * 1024);
        let mut held = budget.empty(None);
        assert!(budget.grow(&mut held, 192 * 1024));
        let mut large = budget.empty(Some(100 * 1024));
        assert!(
            !budget.grow(&mut large, 1024),
            "64 KiB left: the quarter kept for small bodies"
        );
        let mut small = budget.empty(Some(1024));
        assert!(budget.grow(&mut small, 1024));
    }

    #[test]
    fn the_largest_body_is_three_quarters_of_the_budget_or_all_of_a_small_one() {
        assert_eq!(BodyBudget::largest_body(4 * 1024 * 1024), 3 * 1024 * 1024);
        assert_eq!(BodyBudget::largest_body(64 * 1024), 64 * 1024);
        assert_eq!(BodyBudget::largest_body(80 * 1024), 64 * 1024);
        assert_eq!(BodyBudget::largest_body(1000), 1000);
        let budget = budget(4 * 1024 * 1024);
        let mut body = budget.empty(Some(3 * 1024 * 1024));
        assert!(budget.grow(&mut body, 3 * 1024 * 1024));
        let mut over = budget.empty(None);
        drop(body);
        assert!(!budget.grow(&mut over, 3 * 1024 * 1024 + 1));
    }

    #[test]
    fn a_body_growing_chunk_by_chunk_is_refused_once_it_no_longer_fits() {
        let budget = budget(256 * 1024);
        let mut body = budget.empty(None);
        assert!(budget.grow(&mut body, 32 * 1024));
        assert!(budget.grow(&mut body, 32 * 1024));
        assert!(budget.grow(&mut body, 100 * 1024));
        assert!(!budget.grow(&mut body, 100 * 1024));
        assert_eq!(body.bytes(), 164 * 1024);
    }
}
