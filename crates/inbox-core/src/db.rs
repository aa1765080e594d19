//! Database access shared by both binaries: connection settings, the bb8 pool, and the
//! embedded migrations.

use std::time::Duration;

use diesel_async::pooled_connection::bb8::Pool;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::{AsyncConnection, AsyncMigrationHarness, AsyncPgConnection, RunQueryDsl};
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};

/// The pool type both binaries use.
pub type PgPool = Pool<AsyncPgConnection>;

/// The migrations of `migrations/`, compiled into every binary so none needs the files or libpq.
pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("../../migrations");

/// Default number of pooled connections per process.
pub const DEFAULT_POOL_SIZE: u32 = 16;

/// Advisory lock key that serialises concurrent migration runs (several replicas starting at once).
const MIGRATION_LOCK_KEY: i64 = 0x7765_6268_6f6f_6b31; // "webhook1"

/// Connection settings, shared by the receiver and the worker.
#[derive(Clone, clap::Args)]
pub struct DatabaseArgs {
    /// PostgreSQL connection URL, e.g. postgres://inbox@db:5432/inbox.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
    /// Maximum number of pooled database connections of this process.
    #[arg(long, env = "INBOX_DB_POOL_SIZE", default_value_t = DEFAULT_POOL_SIZE, value_parser = clap::value_parser!(u32).range(1..))]
    pub db_pool_size: u32,
    /// How long to wait for a pooled connection (or a new one) before giving up.
    #[arg(long, env = "INBOX_DB_CONNECT_TIMEOUT", value_parser = humantime::parse_duration, default_value = "2s")]
    pub db_connect_timeout: Duration,
}

impl std::fmt::Debug for DatabaseArgs {
    // The URL may carry a password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseArgs")
            .field("database_url", &"[redacted]")
            .field("db_pool_size", &self.db_pool_size)
            .field("db_connect_timeout", &self.db_connect_timeout)
            .finish()
    }
}

/// Why the database could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum DbSetupError {
    /// Connecting failed.
    #[error("cannot connect to the database")]
    Connect(#[source] diesel::ConnectionError),
    /// A statement failed.
    #[error("database query failed")]
    Query(#[source] diesel::result::Error),
    /// A migration failed.
    #[error("running migrations failed: {0}")]
    Migration(String),
}

impl DatabaseArgs {
    /// Builds the pool without connecting: a process must start, answer health checks and
    /// report 503 while the database is down, then recover by itself when it returns.
    pub fn pool(&self) -> PgPool {
        let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new(&self.database_url);
        Pool::builder()
            .max_size(self.db_pool_size)
            .connection_timeout(self.db_connect_timeout)
            // A broken connection is found by the query that uses it; checking each checkout
            // would add a round trip to every request.
            .test_on_check_out(false)
            .build_unchecked(manager)
    }
}

/// Flags of the `migrate` subcommand both binaries offer.
#[derive(Clone, clap::Args)]
pub struct MigrateArgs {
    /// PostgreSQL connection URL.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
}

impl std::fmt::Debug for MigrateArgs {
    // The URL may carry a password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MigrateArgs").finish_non_exhaustive()
    }
}

impl MigrateArgs {
    /// Applies the pending migrations and logs which.
    pub async fn run(&self) -> Result<(), DbSetupError> {
        let applied = run_migrations(&self.database_url).await?;
        tracing::info!(applied = applied.len(), versions = ?applied, "migrations complete");
        Ok(())
    }
}

/// Applies every pending migration, holding an advisory lock so that replicas starting
/// together migrate one at a time. Returns the versions applied.
///
/// Needs the multi-threaded tokio runtime (the harness blocks in place).
pub async fn run_migrations(database_url: &str) -> Result<Vec<String>, DbSetupError> {
    let mut conn = AsyncPgConnection::establish(database_url)
        .await
        .map_err(DbSetupError::Connect)?;
    diesel::sql_query("SELECT pg_advisory_lock($1)")
        .bind::<diesel::sql_types::BigInt, _>(MIGRATION_LOCK_KEY)
        .execute(&mut conn)
        .await
        .map_err(DbSetupError::Query)?;
    let mut harness = AsyncMigrationHarness::new(conn);
    let applied = harness
        .run_pending_migrations(MIGRATIONS)
        .map(|versions| versions.iter().map(ToString::to_string).collect())
        .map_err(|err| DbSetupError::Migration(err.to_string()));
    // Dropping the connection ends the session and with it the advisory lock.
    drop(harness.into_inner());
    applied
}
