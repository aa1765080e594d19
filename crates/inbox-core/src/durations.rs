//! Duration flags checked at start, by every binary: a zero interval would stop a timer (a
//! zero rescue interval once ended the worker's housekeeping while it ran on without rescue), a
//! zero deadline or timeout would refuse every request while the process looked healthy, and
//! values of years are typing errors that would overflow the database's intervals.

use std::time::Duration;

const MILLISECOND: Duration = Duration::from_millis(1);
const SECOND: Duration = Duration::from_secs(1);
const DAY: Duration = Duration::from_secs(24 * 60 * 60);
const YEAR: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// A duration flag, its value and the range it must fall in.
#[derive(Debug, Clone, Copy)]
pub struct DurationFlag {
    /// The flag as typed, e.g. `--lease`.
    pub flag: &'static str,
    /// Its value.
    pub value: Duration,
    /// Smallest sensible value.
    pub min: Duration,
    /// Largest sensible value.
    pub max: Duration,
}

impl DurationFlag {
    /// An interval or timeout: at least a millisecond, at most a day.
    pub fn interval(flag: &'static str, value: Duration) -> Self {
        Self {
            flag,
            value,
            min: MILLISECOND,
            max: DAY,
        }
    }

    /// A lease: at least a second (its heartbeat runs every third of it), at most a day.
    pub fn lease(flag: &'static str, value: Duration) -> Self {
        Self {
            flag,
            value,
            min: SECOND,
            max: DAY,
        }
    }

    /// A wait that may be zero (no wait), at most a day.
    pub fn wait(flag: &'static str, value: Duration) -> Self {
        Self {
            flag,
            value,
            min: Duration::ZERO,
            max: DAY,
        }
    }

    /// A wait on the hot path that may be zero, at most a second.
    pub fn short_wait(flag: &'static str, value: Duration) -> Self {
        Self {
            flag,
            value,
            min: Duration::ZERO,
            max: SECOND,
        }
    }

    /// A retry delay bound: at least a millisecond, at most thirty days.
    pub fn retry_delay(flag: &'static str, value: Duration) -> Self {
        Self {
            flag,
            value,
            min: MILLISECOND,
            max: 30 * DAY,
        }
    }

    /// A retention period: at least a second, at most ten years.
    pub fn period(flag: &'static str, value: Duration) -> Self {
        Self {
            flag,
            value,
            min: SECOND,
            max: 10 * YEAR,
        }
    }

    /// `Err` with a message naming the flag, its value and its range when out of range.
    pub fn check(&self) -> Result<(), String> {
        if (self.min..=self.max).contains(&self.value) {
            return Ok(());
        }
        Err(format!(
            "{} {} is out of range: it must be at least {} and at most {}",
            self.flag,
            humantime::format_duration(self.value),
            humantime::format_duration(self.min),
            humantime::format_duration(self.max),
        ))
    }
}

/// Checks every flag; the message lists every one out of range, not only the first.
pub fn check_all(flags: &[DurationFlag]) -> Result<(), String> {
    let refused: Vec<String> = flags.iter().filter_map(|f| f.check().err()).collect();
    if refused.is_empty() {
        Ok(())
    } else {
        Err(refused.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_and_absurd_values_are_refused_with_the_flag_and_its_range() {
        let err = DurationFlag::interval("--rescue-interval", Duration::ZERO)
            .check()
            .expect_err("zero");
        assert_eq!(
            err,
            "--rescue-interval 0s is out of range: it must be at least 1ms and at most 1day"
        );
        assert!(DurationFlag::lease("--lease", Duration::from_millis(500))
            .check()
            .is_err());
        assert!(DurationFlag::lease("--lease", 400 * DAY).check().is_err());
        assert!(DurationFlag::lease("--lease", 30 * SECOND).check().is_ok());
        assert!(DurationFlag::wait("--shutdown-grace", Duration::ZERO)
            .check()
            .is_ok());
    }

    #[test]
    fn every_refused_flag_is_named() {
        let err = check_all(&[
            DurationFlag::lease("--lease", Duration::ZERO),
            DurationFlag::interval("--poll-interval", SECOND),
            DurationFlag::interval("--stats-interval", Duration::ZERO),
        ])
        .expect_err("two out of range");
        assert!(err.contains("--lease 0s"), "{err}");
        assert!(err.contains("--stats-interval 0s"), "{err}");
        assert!(!err.contains("--poll-interval"), "{err}");
    }
}
