//! Database access shared by both binaries: connection flags, the bb8 pool, and the
//! embedded migrations. How a connection is opened (TLS, failover, session limits) is
//! [`crate::pg_connect`]'s job.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use diesel_async::pooled_connection::bb8::Pool;
use diesel_async::pooled_connection::{
    AsyncDieselConnectionManager, ManagerConfig, PoolError, PoolableConnection, RecyclingMethod,
};
use diesel_async::{AsyncMigrationHarness, AsyncPgConnection, RunQueryDsl};
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};
use futures_util::FutureExt;

use crate::durations::DurationFlag;

pub use crate::pg_connect::{
    establish, ConnectError, ConnectionSettings, SessionLimits, SettingsError,
};

/// The pool type both binaries use.
pub type PgPool = Pool<AsyncPgConnection>;

/// The migrations of `migrations/`, compiled into every binary so none needs the files or libpq.
pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("../../migrations");

/// Default number of pooled connections per process.
pub const DEFAULT_POOL_SIZE: u32 = 16;

/// Default `statement_timeout` of the binaries' pooled sessions.
pub const DEFAULT_STATEMENT_TIMEOUT: &str = "30s";

/// Default `idle_in_transaction_session_timeout` of the binaries' sessions. Longer than any
/// handler is expected to hold its transaction open (a forward route's default timeout is 10 s).
pub const DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT: &str = "60s";

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
    /// `application_name` of this process's sessions, as `pg_stat_activity` shows it.
    /// Default: the binary, host name and process id (`receiver@pod-name/1`); an
    /// `application_name` in the URL is used instead when given.
    #[arg(long, env = "INBOX_DB_APPLICATION_NAME")]
    pub db_application_name: Option<String>,
    /// `statement_timeout` of pooled sessions (0s: the server's). Transactions that need
    /// another limit set their own with `SET LOCAL`.
    #[arg(long, env = "INBOX_DB_STATEMENT_TIMEOUT", value_parser = humantime::parse_duration, default_value = DEFAULT_STATEMENT_TIMEOUT)]
    pub db_statement_timeout: Duration,
    /// `idle_in_transaction_session_timeout` (0s: the server's): the server ends a session
    /// whose transaction waits this long for its client, releasing its locks. Keep it above
    /// the longest handler (route timeout).
    #[arg(long, env = "INBOX_DB_IDLE_IN_TRANSACTION_TIMEOUT", value_parser = humantime::parse_duration, default_value = DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT)]
    pub db_idle_in_transaction_timeout: Duration,
}

impl DatabaseArgs {
    /// The duration flags to check at start ([`crate::durations`]): a zero connect timeout
    /// would fail every connection; the two session timeouts may be 0s (the server's own).
    pub fn duration_flags(&self) -> [DurationFlag; 3] {
        [
            DurationFlag::interval("--db-connect-timeout", self.db_connect_timeout),
            DurationFlag::wait("--db-statement-timeout", self.db_statement_timeout),
            DurationFlag::wait(
                "--db-idle-in-transaction-timeout",
                self.db_idle_in_transaction_timeout,
            ),
        ]
    }
}

impl std::fmt::Debug for DatabaseArgs {
    // The URL may carry a password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseArgs")
            .field("database_url", &"[redacted]")
            .field("db_pool_size", &self.db_pool_size)
            .field("db_connect_timeout", &self.db_connect_timeout)
            .field("db_application_name", &self.db_application_name)
            .field("db_statement_timeout", &self.db_statement_timeout)
            .field(
                "db_idle_in_transaction_timeout",
                &self.db_idle_in_transaction_timeout,
            )
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
    /// The defaults of every flag but the URL.
    pub fn for_url(database_url: impl Into<String>) -> Self {
        Self {
            database_url: database_url.into(),
            db_pool_size: DEFAULT_POOL_SIZE,
            db_connect_timeout: Duration::from_secs(2),
            db_application_name: None,
            db_statement_timeout: humantime::parse_duration(DEFAULT_STATEMENT_TIMEOUT)
                .unwrap_or(Duration::from_secs(30)),
            db_idle_in_transaction_timeout: humantime::parse_duration(
                DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT,
            )
            .unwrap_or(Duration::from_secs(60)),
        }
    }

    /// The session limits these flags ask for (0s: leave the server's setting).
    pub fn session_limits(&self) -> SessionLimits {
        let nonzero = |limit: Duration| (!limit.is_zero()).then_some(limit);
        SessionLimits {
            statement_timeout: nonzero(self.db_statement_timeout),
            idle_in_transaction_timeout: nonzero(self.db_idle_in_transaction_timeout),
        }
    }

    /// The URL read and its TLS files loaded: fails now on a malformed URL, an unknown
    /// `sslmode` or an unreadable `sslrootcert`.
    pub fn connection_settings(&self) -> Result<ConnectionSettings, SettingsError> {
        let mut settings = ConnectionSettings::new(
            &self.database_url,
            &default_application_name(),
            self.session_limits(),
        )?;
        if let Some(name) = &self.db_application_name {
            settings.set_application_name(name);
        }
        Ok(settings)
    }

    /// Builds the pool without connecting: a process must start, answer health checks and
    /// report 503 while the database is down, then recover by itself when it returns.
    pub fn pool(&self) -> Result<PgPool, SettingsError> {
        let settings = self.connection_settings()?;
        tracing::info!(database = settings.target(), "database pool configured");
        let mut config = ManagerConfig::<AsyncPgConnection>::default();
        config.custom_setup = Box::new(move |_url| {
            let settings = settings.clone();
            async move { settings.establish().await }.boxed()
        });
        // Checked out, a connection is only tested for what is known without a round trip:
        // one whose socket the driver already saw closed (the server restarted or failed
        // over while it sat idle) is dropped and another taken, instead of failing the first
        // statement of whatever got it. Any other breakage is found by the query that meets it.
        config.recycling_method = RecyclingMethod::CustomFunction(Box::new(|conn| {
            let closed = PoolableConnection::is_broken(conn);
            async move {
                if closed {
                    Err(diesel::result::Error::DatabaseError(
                        diesel::result::DatabaseErrorKind::ClosedConnection,
                        Box::new("pooled connection closed".to_string()),
                    ))
                } else {
                    Ok(())
                }
            }
            .boxed()
        }));
        // The URL is in the settings; the manager's copy is never used.
        let manager = AsyncDieselConnectionManager::new_with_config("", config);
        Ok(Pool::builder()
            .max_size(self.db_pool_size)
            .connection_timeout(self.db_connect_timeout)
            .test_on_check_out(true)
            .error_sink(Box::new(LogConnectionErrors::default()))
            .build_unchecked(manager))
    }
}

/// `binary@host/pid`: which binary and which replica a session belongs to. The host name is
/// the pod's name on Kubernetes, the container's with compose.
pub fn default_application_name() -> String {
    let binary = std::env::args_os()
        .next()
        .and_then(|path| {
            std::path::Path::new(&path)
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "webhook-inbox".to_owned());
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|name| name.trim().to_owned())
        .unwrap_or_default();
    format!("{binary}@{host}/{}", std::process::id())
}

/// Logs why the pool could not open a connection (a wrong CA, a refused password, no
/// read-write host), at most once per [`CONNECT_ERROR_LOG_INTERVAL_SECS`]: callers only see
/// a timeout.
#[derive(Debug, Default, Clone)]
struct LogConnectionErrors {
    last_logged_secs: Arc<AtomicU64>,
}

const CONNECT_ERROR_LOG_INTERVAL_SECS: u64 = 5;

impl bb8::ErrorSink<PoolError> for LogConnectionErrors {
    fn sink(&self, error: PoolError) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_secs());
        // Called as a function: diesel's `RunQueryDsl::load` is in scope too.
        let last = AtomicU64::load(&self.last_logged_secs, Ordering::Relaxed);
        if now.saturating_sub(last) >= CONNECT_ERROR_LOG_INTERVAL_SECS
            && self
                .last_logged_secs
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(error = %error, "cannot open a database connection");
        }
    }

    fn boxed_clone(&self) -> Box<dyn bb8::ErrorSink<PoolError>> {
        Box::new(self.clone())
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
/// No statement timeout (an index build may take long); idle transactions are still ended.
///
/// Needs the multi-threaded tokio runtime (the harness blocks in place).
pub async fn run_migrations(database_url: &str) -> Result<Vec<String>, DbSetupError> {
    let limits = SessionLimits {
        statement_timeout: None,
        idle_in_transaction_timeout: Some(Duration::from_secs(60)),
    };
    let mut conn = establish(database_url, &default_application_name(), limits)
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
