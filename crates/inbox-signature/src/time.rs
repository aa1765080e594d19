//! Signed timestamps: the formats providers write them in, and the tolerance check.

use std::time::Duration;

use crate::parse::parse_timestamp;
use crate::VerifyError;

/// How a provider writes its timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimestampFormat {
    /// Unix seconds, decimal digits (Stripe, Slack, Standard Webhooks, most others).
    UnixSeconds,
    /// Unix milliseconds, decimal digits (HubSpot, Linear).
    UnixMillis,
    /// RFC 3339, with up to nanoseconds (Twitch).
    Rfc3339,
}

impl TimestampFormat {
    /// Unix seconds of `text`, or `None` when it is not in this format.
    #[must_use]
    pub fn parse(self, text: &str) -> Option<i64> {
        match self {
            Self::UnixSeconds => parse_timestamp(text),
            Self::UnixMillis => parse_timestamp(text).map(|millis| millis.div_euclid(1_000)),
            Self::Rfc3339 => chrono::DateTime::parse_from_rfc3339(text.trim())
                .ok()
                .map(|time| time.timestamp()),
        }
    }

    /// `unix_seconds` written in this format.
    #[must_use]
    pub fn format(self, unix_seconds: i64) -> String {
        match self {
            Self::UnixSeconds => unix_seconds.to_string(),
            Self::UnixMillis => unix_seconds.saturating_mul(1_000).to_string(),
            Self::Rfc3339 => chrono::DateTime::from_timestamp(unix_seconds, 0)
                .unwrap_or_default()
                .to_rfc3339_opts(chrono::SecondsFormat::Nanos, true),
        }
    }
}

/// Accepts `timestamp` when it is at most `tolerance` away from `now`, either way. Saturating
/// arithmetic keeps extreme values (a forged `t=9223372036854775807`) from overflowing; they
/// end up far outside any tolerance instead.
///
/// # Errors
/// [`VerifyError::StaleTimestamp`] or [`VerifyError::FutureTimestamp`].
pub fn check_tolerance(timestamp: i64, now: i64, tolerance: Duration) -> Result<(), VerifyError> {
    let tolerance = i64::try_from(tolerance.as_secs()).unwrap_or(i64::MAX);
    if now.saturating_sub(timestamp) > tolerance {
        Err(VerifyError::StaleTimestamp)
    } else if timestamp.saturating_sub(now) > tolerance {
        Err(VerifyError::FutureTimestamp)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOLERANCE: Duration = Duration::from_secs(300);

    #[test]
    fn timestamps_exactly_at_the_tolerance_are_accepted() {
        assert_eq!(check_tolerance(1_000, 1_300, TOLERANCE), Ok(()));
        assert_eq!(check_tolerance(1_600, 1_300, TOLERANCE), Ok(()));
        assert_eq!(check_tolerance(1_300, 1_300, TOLERANCE), Ok(()));
    }

    #[test]
    fn timestamps_one_second_beyond_the_tolerance_are_rejected() {
        assert_eq!(
            check_tolerance(999, 1_300, TOLERANCE),
            Err(VerifyError::StaleTimestamp)
        );
        assert_eq!(
            check_tolerance(1_601, 1_300, TOLERANCE),
            Err(VerifyError::FutureTimestamp)
        );
    }

    #[test]
    fn extreme_values_do_not_overflow() {
        assert_eq!(
            check_tolerance(i64::MAX, 0, TOLERANCE),
            Err(VerifyError::FutureTimestamp)
        );
        assert_eq!(
            check_tolerance(i64::MIN, i64::MAX, TOLERANCE),
            Err(VerifyError::StaleTimestamp)
        );
        assert_eq!(
            check_tolerance(i64::MAX, i64::MIN, TOLERANCE),
            Err(VerifyError::FutureTimestamp)
        );
        assert_eq!(check_tolerance(0, 0, Duration::from_secs(u64::MAX)), Ok(()));
        assert_eq!(check_tolerance(i64::MAX, i64::MIN, Duration::MAX), Ok(()));
    }

    #[test]
    fn zero_tolerance_accepts_only_the_current_second() {
        assert_eq!(check_tolerance(5, 5, Duration::ZERO), Ok(()));
        assert_eq!(
            check_tolerance(4, 5, Duration::ZERO),
            Err(VerifyError::StaleTimestamp)
        );
        assert_eq!(
            check_tolerance(6, 5, Duration::ZERO),
            Err(VerifyError::FutureTimestamp)
        );
    }

    #[test]
    fn the_three_formats_round_trip() {
        for format in [
            TimestampFormat::UnixSeconds,
            TimestampFormat::UnixMillis,
            TimestampFormat::Rfc3339,
        ] {
            assert_eq!(
                format.parse(&format.format(1_700_000_000)),
                Some(1_700_000_000)
            );
        }
        assert_eq!(
            TimestampFormat::Rfc3339.parse("2023-11-14T22:13:20.123456789Z"),
            Some(1_700_000_000)
        );
        assert_eq!(
            TimestampFormat::UnixMillis.parse("1700000000999"),
            Some(1_700_000_000)
        );
        assert_eq!(TimestampFormat::Rfc3339.parse("yesterday"), None);
    }
}
