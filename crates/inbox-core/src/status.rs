//! The lifecycle state of an inbox row, stored as a `smallint` guarded by a CHECK constraint.

use diesel::deserialize::{self, FromSql, FromSqlRow};
use diesel::expression::AsExpression;
use diesel::pg::{Pg, PgValue};
use diesel::serialize::{self, Output, ToSql};
use diesel::sql_types::SmallInt;

/// Where a row is in its life: `ready -> processing -> done`, with retries back to `ready`
/// and `dead` for events that exhausted their attempts or failed permanently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, AsExpression, FromSqlRow)]
#[diesel(sql_type = SmallInt)]
pub enum InboxStatus {
    /// Waiting to be claimed once `next_attempt_at` has passed.
    Ready,
    /// Claimed by a worker holding the lease in `lease_token` until `locked_until`.
    Processing,
    /// Handled; its business effect is committed.
    Done,
    /// Given up on: permanent error or attempts exhausted. An operator may replay it.
    Dead,
}

impl InboxStatus {
    /// Every state, in lifecycle order.
    pub const ALL: [InboxStatus; 4] = [Self::Ready, Self::Processing, Self::Done, Self::Dead];

    /// The value stored in the `status` column.
    pub const fn code(self) -> i16 {
        match self {
            Self::Ready => 0,
            Self::Processing => 1,
            Self::Done => 2,
            Self::Dead => 3,
        }
    }

    /// The state stored as `code`, if it is one.
    pub const fn from_code(code: i16) -> Option<Self> {
        match code {
            0 => Some(Self::Ready),
            1 => Some(Self::Processing),
            2 => Some(Self::Done),
            3 => Some(Self::Dead),
            _ => None,
        }
    }

    /// The lower-case name used in logs, metrics labels and operator commands.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ready => "ready",
            Self::Processing => "processing",
            Self::Done => "done",
            Self::Dead => "dead",
        }
    }
}

impl std::fmt::Display for InboxStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `pad`, so that a column width (`{:<10}`) applies.
        f.pad(self.as_str())
    }
}

impl std::str::FromStr for InboxStatus {
    type Err = UnknownStatus;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| UnknownStatus(s.to_owned()))
    }
}

/// A status name that is not one of `ready`, `processing`, `done`, `dead`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown status {0:?} (expected ready, processing, done or dead)")]
pub struct UnknownStatus(pub String);

impl ToSql<SmallInt, Pg> for InboxStatus {
    fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Pg>) -> serialize::Result {
        let code = self.code();
        <i16 as ToSql<SmallInt, Pg>>::to_sql(&code, &mut out.reborrow())
    }
}

impl FromSql<SmallInt, Pg> for InboxStatus {
    fn from_sql(bytes: PgValue<'_>) -> deserialize::Result<Self> {
        let code = <i16 as FromSql<SmallInt, Pg>>::from_sql(bytes)?;
        Self::from_code(code).ok_or_else(|| format!("unknown inbox status code {code}").into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_match_the_migration() {
        let codes: Vec<i16> = InboxStatus::ALL.iter().map(|s| s.code()).collect();
        assert_eq!(codes, [0, 1, 2, 3]);
        for status in InboxStatus::ALL {
            assert_eq!(InboxStatus::from_code(status.code()), Some(status));
            assert_eq!(status.as_str().parse::<InboxStatus>(), Ok(status));
        }
        assert_eq!(InboxStatus::from_code(4), None);
        assert!("stuck".parse::<InboxStatus>().is_err());
    }
}
