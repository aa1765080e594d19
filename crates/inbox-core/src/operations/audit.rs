//! The audit of repair actions: every replay, pause, resume and abort, with who did it, what
//! it applied to and how many events it changed. Rows are written when an action starts;
//! only a running action's own row is updated afterwards (its progress and outcome).

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::schema::console_audit;

/// How an action ended, or that it is still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A background action still at work.
    Running,
    /// Finished.
    Done,
    /// Stopped by an operator before the end.
    Aborted,
    /// Stopped by an error (the database failed).
    Failed,
}

impl Outcome {
    /// The stored word.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Done => "done",
            Self::Aborted => "aborted",
            Self::Failed => "failed",
        }
    }
}

/// An action about to be recorded.
#[derive(Debug, Clone)]
pub struct NewAction<'a> {
    /// Who acts.
    pub actor: &'a str,
    /// What they do (`replay`, `replay_filter`, `pause`, `resume`, ...).
    pub action: &'a str,
    /// What it applies to.
    pub target: serde_json::Value,
    /// The estimate shown before a replay by filter.
    pub estimated: Option<i64>,
    /// Events changed (0 for an action that starts in the background).
    pub affected: i64,
    /// Its outcome so far.
    pub outcome: Outcome,
}

impl<'a> NewAction<'a> {
    /// A repair finished as it is recorded (in the transaction that makes it): no estimate,
    /// `affected` events changed.
    pub fn done(actor: &'a str, action: &'a str, target: serde_json::Value, affected: i64) -> Self {
        Self {
            actor,
            action,
            target,
            estimated: None,
            affected,
            outcome: Outcome::Done,
        }
    }
}

/// A recorded action.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable)]
#[diesel(table_name = console_audit)]
pub struct AuditEntry {
    /// Row id.
    pub id: i64,
    /// When it started.
    pub at: DateTime<Utc>,
    /// Who acted.
    pub actor: String,
    /// The action.
    pub action: String,
    /// What it applied to.
    pub target: serde_json::Value,
    /// The estimate shown first, for a replay by filter.
    pub estimated: Option<i64>,
    /// Events changed.
    pub affected: i64,
    /// running, done, aborted or failed.
    pub outcome: String,
}

/// Records `action`; returns its row id. Locks nothing beyond the new row.
pub async fn record(conn: &mut AsyncPgConnection, action: NewAction<'_>) -> QueryResult<i64> {
    diesel::insert_into(console_audit::table)
        .values((
            console_audit::actor.eq(action.actor),
            console_audit::action.eq(action.action),
            console_audit::target.eq(action.target),
            console_audit::estimated.eq(action.estimated),
            console_audit::affected.eq(action.affected),
            console_audit::outcome.eq(action.outcome.as_str()),
        ))
        .returning(console_audit::id)
        .get_result(conn)
        .await
}

/// Sets a running action's progress (`affected` so far) and outcome. Only a `running` row is
/// updated, so a finished record is never rewritten; returns false when none was.
pub async fn update_progress(
    conn: &mut AsyncPgConnection,
    id: i64,
    affected: i64,
    outcome: Outcome,
) -> QueryResult<bool> {
    let updated = diesel::update(
        console_audit::table
            .filter(console_audit::id.eq(id))
            .filter(console_audit::outcome.eq(Outcome::Running.as_str())),
    )
    .set((
        console_audit::affected.eq(affected),
        console_audit::outcome.eq(outcome.as_str()),
    ))
    .execute(conn)
    .await?;
    Ok(updated == 1)
}

/// The `limit` most recent actions, newest first.
pub async fn recent(conn: &mut AsyncPgConnection, limit: i64) -> QueryResult<Vec<AuditEntry>> {
    console_audit::table
        .order_by(console_audit::id.desc())
        .limit(limit)
        .select(AuditEntry::as_select())
        .load(conn)
        .await
}

/// One page of the audit, newest first: at most `limit` actions with an id below `before` (the
/// last id of the previous page; `None` for the first page). A backward scan of the primary
/// key that stops after `limit` rows, whatever the page; locks nothing.
pub async fn page_before(
    conn: &mut AsyncPgConnection,
    before: Option<i64>,
    limit: i64,
) -> QueryResult<Vec<AuditEntry>> {
    let mut query = console_audit::table
        .order_by(console_audit::id.desc())
        .limit(limit)
        .select(AuditEntry::as_select())
        .into_boxed();
    if let Some(before) = before {
        query = query.filter(console_audit::id.lt(before));
    }
    query.load(conn).await
}
