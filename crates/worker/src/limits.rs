//! Bounds on the database time of an attempt: `statement_timeout` and `lock_timeout`, set
//! with `SET LOCAL` in the attempt's transaction, so a handler stuck on a row lock or a
//! runaway query ends with an error (and its event is retried) instead of holding its event,
//! its slot and a connection while the lease keeper keeps the lease alive.

use std::time::Duration;

/// Statement and lock timeouts; `None` takes the next level's value (route, then worker,
/// then the lease's defaults).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DatabaseLimits {
    /// Longest one statement of the attempt may run.
    pub statement_timeout: Option<Duration>,
    /// Longest one statement may wait for a lock.
    pub lock_timeout: Option<Duration>,
}

/// Timeouts resolved for one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptLimits {
    /// `statement_timeout` of the attempt's transaction.
    pub statement_timeout: Duration,
    /// `lock_timeout` of the attempt's transaction.
    pub lock_timeout: Duration,
}

impl DatabaseLimits {
    /// `self`'s values where set, `fallback`'s elsewhere.
    pub fn or(self, fallback: Self) -> Self {
        Self {
            statement_timeout: self.statement_timeout.or(fallback.statement_timeout),
            lock_timeout: self.lock_timeout.or(fallback.lock_timeout),
        }
    }

    /// The values to use, those unset derived from the lease: a statement may run for half
    /// of it and wait for a lock for a sixth, so that one stuck statement ends well within
    /// what a lease allows between two extensions by the lease keeper.
    pub fn resolve(self, lease: Duration) -> AttemptLimits {
        let floor = Duration::from_millis(1);
        AttemptLimits {
            statement_timeout: self.statement_timeout.unwrap_or(lease / 2).max(floor),
            lock_timeout: self.lock_timeout.unwrap_or(lease / 6).max(floor),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_overrides_the_worker_which_overrides_the_lease_defaults() {
        let route = DatabaseLimits {
            statement_timeout: None,
            lock_timeout: Some(Duration::from_millis(200)),
        };
        let worker = DatabaseLimits {
            statement_timeout: Some(Duration::from_secs(5)),
            lock_timeout: Some(Duration::from_secs(2)),
        };
        let limits = route.or(worker).resolve(Duration::from_secs(30));
        assert_eq!(limits.statement_timeout, Duration::from_secs(5));
        assert_eq!(limits.lock_timeout, Duration::from_millis(200));
        let defaults = DatabaseLimits::default().resolve(Duration::from_secs(30));
        assert_eq!(defaults.statement_timeout, Duration::from_secs(15));
        assert_eq!(defaults.lock_timeout, Duration::from_secs(5));
    }
}
