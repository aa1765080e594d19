//! When a failed event is tried again: exponential backoff with full jitter, capped, bounded
//! by a maximum number of attempts.
//!
//! A pure value type: the jitter is passed in, so every bound is unit-tested without a clock,
//! a random source or a database.

use std::time::Duration;

/// Default delay ceiling after the first failed attempt.
pub const DEFAULT_BASE: Duration = Duration::from_secs(1);
/// Default upper bound of any single delay.
pub const DEFAULT_CAP: Duration = Duration::from_secs(60 * 60);
/// Default number of failed attempts before an event is dead-lettered (and of rescues of its
/// expired lease, counted apart).
pub const DEFAULT_MAX_ATTEMPTS: u32 = 12;

/// Retry policy: after the `n`-th failed attempt the next one waits a uniformly random delay
/// in `[0, min(cap, base * 2^(n-1))]` ("full jitter", which spreads out retries of events
/// that failed together instead of re-synchronising them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args)]
pub struct BackoffPolicy {
    /// Delay ceiling after the first failed attempt; doubles with every further failure.
    #[arg(long = "retry-base", env = "INBOX_RETRY_BASE", value_parser = humantime::parse_duration, default_value = "1s")]
    pub base: Duration,
    /// Upper bound of any single retry delay.
    #[arg(long = "retry-cap", env = "INBOX_RETRY_CAP", value_parser = humantime::parse_duration, default_value = "1h")]
    pub cap: Duration,
    /// Failed attempts before an event is dead-lettered. A lease that expired (its worker
    /// crashed or stalled) costs no attempt; it is counted apart, and an event rescued this
    /// many times is dead-lettered too.
    #[arg(long = "max-attempts", env = "INBOX_MAX_ATTEMPTS", default_value_t = DEFAULT_MAX_ATTEMPTS, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_attempts: u32,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        Self {
            base: DEFAULT_BASE,
            cap: DEFAULT_CAP,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
        }
    }
}

/// What to do with an event whose attempt just failed with a retryable error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryDecision {
    /// Try again after this delay.
    RetryAfter(Duration),
    /// No attempts left: dead-letter it.
    GiveUp,
}

impl BackoffPolicy {
    /// The largest delay that may follow failed attempt number `attempt` (1-based):
    /// `min(cap, base * 2^(attempt - 1))`, saturating instead of overflowing.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(63);
        let factor = 1u64 << doublings;
        let nanos = self.base.as_nanos().saturating_mul(u128::from(factor));
        let capped = nanos.min(self.cap.as_nanos());
        Duration::from_nanos(u64::try_from(capped).unwrap_or(u64::MAX))
    }

    /// The delay after failed attempt `attempt`, for a jitter `unit` drawn uniformly from
    /// `[0, 1)`; values outside that range are clamped into it.
    pub fn delay_for(&self, attempt: u32, unit: f64) -> Duration {
        let unit = if unit.is_finite() {
            unit.clamp(0.0, 1.0)
        } else {
            0.0
        };
        self.ceiling(attempt).mul_f64(unit)
    }

    /// Whether `attempt` attempts use up the budget.
    pub fn is_exhausted(&self, attempt: u32) -> bool {
        attempt >= self.max_attempts
    }

    /// The decision after failed attempt `attempt`, with jitter from the thread's random source.
    pub fn decide(&self, attempt: u32) -> RetryDecision {
        self.decide_with_jitter(attempt, rand::random::<f64>())
    }

    /// The decision after failed attempt `attempt` whose target asked not to be tried again
    /// before `not_before` (an HTTP `Retry-After`): the backoff delay, raised to that wait,
    /// which the cap bounds. No attempts left still means giving up.
    pub fn decide_not_before(&self, attempt: u32, not_before: Duration) -> RetryDecision {
        self.decide_with_jitter_not_before(attempt, rand::random::<f64>(), not_before)
    }

    /// [`Self::decide_not_before`] with the given jitter `unit`.
    pub fn decide_with_jitter_not_before(
        &self,
        attempt: u32,
        unit: f64,
        not_before: Duration,
    ) -> RetryDecision {
        match self.decide_with_jitter(attempt, unit) {
            RetryDecision::RetryAfter(delay) => {
                RetryDecision::RetryAfter(delay.max(not_before.min(self.cap)))
            }
            RetryDecision::GiveUp => RetryDecision::GiveUp,
        }
    }

    /// The decision after failed attempt `attempt`, with the given jitter `unit`.
    pub fn decide_with_jitter(&self, attempt: u32, unit: f64) -> RetryDecision {
        if self.is_exhausted(attempt) {
            RetryDecision::GiveUp
        } else {
            RetryDecision::RetryAfter(self.delay_for(attempt, unit))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(base_ms: u64, cap_ms: u64, max_attempts: u32) -> BackoffPolicy {
        BackoffPolicy {
            base: Duration::from_millis(base_ms),
            cap: Duration::from_millis(cap_ms),
            max_attempts,
        }
    }

    #[test]
    fn defaults_are_one_second_one_hour_twelve_attempts() {
        let p = BackoffPolicy::default();
        assert_eq!(p.base, Duration::from_secs(1));
        assert_eq!(p.cap, Duration::from_secs(3600));
        assert_eq!(p.max_attempts, 12);
    }

    #[test]
    fn a_retry_after_raises_the_delay_up_to_the_cap_but_never_lowers_it() {
        let p = policy(1_000, 60_000, 3);
        let delay = |attempt, unit, wait_ms| match p.decide_with_jitter_not_before(
            attempt,
            unit,
            Duration::from_millis(wait_ms),
        ) {
            RetryDecision::RetryAfter(delay) => Some(delay.as_millis() as u64),
            RetryDecision::GiveUp => None,
        };
        assert_eq!(
            delay(1, 0.5, 30_000),
            Some(30_000),
            "the target's wait wins"
        );
        assert_eq!(
            delay(1, 0.5, 3_600_000),
            Some(60_000),
            "capped by the retry cap"
        );
        assert_eq!(
            delay(2, 0.5, 10),
            Some(1_000),
            "a shorter wait keeps the backoff"
        );
        assert_eq!(delay(3, 0.5, 30_000), None, "out of attempts");
    }

    #[test]
    fn ceiling_doubles_from_base_until_the_cap() {
        let p = policy(1_000, 10_000, 12);
        let ceilings: Vec<u64> = (1..=6).map(|a| p.ceiling(a).as_millis() as u64).collect();
        assert_eq!(ceilings, [1_000, 2_000, 4_000, 8_000, 10_000, 10_000]);
    }

    #[test]
    fn attempt_zero_is_treated_as_the_first() {
        let p = policy(500, 10_000, 3);
        assert_eq!(p.ceiling(0), Duration::from_millis(500));
    }

    #[test]
    fn huge_attempt_numbers_saturate_at_the_cap() {
        let p = BackoffPolicy::default();
        assert_eq!(p.ceiling(64), p.cap);
        assert_eq!(p.ceiling(u32::MAX), p.cap);
        let p = BackoffPolicy {
            base: Duration::MAX,
            cap: Duration::MAX,
            max_attempts: 3,
        };
        assert!(p.ceiling(40) >= Duration::from_secs(u64::MAX / 1_000_000_000));
    }

    #[test]
    fn full_jitter_spans_zero_to_the_ceiling() {
        let p = policy(1_000, 60_000, 12);
        assert_eq!(p.delay_for(3, 0.0), Duration::ZERO);
        assert_eq!(p.delay_for(3, 0.5), Duration::from_millis(2_000));
        assert_eq!(p.delay_for(3, 1.0), Duration::from_millis(4_000));
    }

    #[test]
    fn jitter_outside_the_unit_interval_is_clamped() {
        let p = policy(1_000, 60_000, 12);
        assert_eq!(p.delay_for(2, -3.0), Duration::ZERO);
        assert_eq!(p.delay_for(2, 7.0), Duration::from_millis(2_000));
        assert_eq!(p.delay_for(2, f64::NAN), Duration::ZERO);
    }

    #[test]
    fn random_delays_stay_within_their_ceiling() {
        let p = policy(100, 5_000, 20);
        for attempt in 1..20 {
            for _ in 0..200 {
                match p.decide(attempt) {
                    RetryDecision::RetryAfter(delay) => assert!(delay <= p.ceiling(attempt)),
                    RetryDecision::GiveUp => panic!("attempt {attempt} of 20 gave up"),
                }
            }
        }
    }

    #[test]
    fn gives_up_exactly_when_attempts_are_exhausted() {
        let p = policy(1_000, 10_000, 3);
        assert!(matches!(
            p.decide_with_jitter(2, 0.5),
            RetryDecision::RetryAfter(_)
        ));
        assert_eq!(p.decide_with_jitter(3, 0.5), RetryDecision::GiveUp);
        assert_eq!(p.decide_with_jitter(4, 0.5), RetryDecision::GiveUp);
    }
}
