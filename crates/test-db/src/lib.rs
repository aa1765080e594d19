//! Test support: every test gets a database of its own, cloned from a migrated template, so
//! tests run in parallel against a real PostgreSQL without seeing each other's rows.
//!
//! The server comes from `DATABASE_URL` (set by `make test`, which starts a throwaway server
//! when the variable is unset). The template is built once per migration fingerprint, under
//! an advisory lock, and renamed into place only when complete, so concurrent test processes
//! never clone a half-migrated one.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used)] // test support: a failure here should stop the test loudly

use diesel::sql_types::{BigInt, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncMigrationHarness, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use diesel_migrations::MigrationHarness;
use inbox_core::db::{DatabaseArgs, PgPool, MIGRATIONS};
use std::time::Duration;

const TEMPLATE_LOCK_KEY: i64 = 0x7465_7374_5f64_6231; // "test_db1"

/// A fresh, migrated database that is dropped when this value is.
#[derive(Debug)]
pub struct TestDatabase {
    name: String,
    url: String,
    admin_url: String,
}

/// One connection through inbox-core, as the binaries open theirs (TLS as `sslmode` says),
/// with no session limits.
pub async fn establish(url: &str) -> diesel::ConnectionResult<AsyncPgConnection> {
    inbox_core::db::establish(url, "inbox-tests", inbox_core::db::SessionLimits::default()).await
}

/// The server to create test databases on; panics with an explanation when unset.
pub fn server_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        panic!("DATABASE_URL is not set: run the tests with `make test`, which starts a throwaway PostgreSQL")
    })
}

/// `url` with its database name replaced by `database`.
pub fn with_database(url: &str, database: &str) -> String {
    let (without_query, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let scheme_end = without_query.find("://").map_or(0, |i| i + 3);
    let base = match without_query[scheme_end..].find('/') {
        Some(slash) => &without_query[..scheme_end + slash],
        None => without_query,
    };
    match query {
        Some(query) => format!("{base}/{database}?{query}"),
        None => format!("{base}/{database}"),
    }
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    count: i64,
}

async fn database_exists(conn: &mut AsyncPgConnection, name: &str) -> bool {
    let rows: Vec<Count> =
        diesel::sql_query("SELECT count(*) AS count FROM pg_database WHERE datname = $1")
            .bind::<Text, _>(name)
            .load(conn)
            .await
            .unwrap();
    rows.iter().any(|row| row.count > 0)
}

/// Runs the migrations on a runtime of their own (see [`on_own_runtime`]).
fn migrate(url: String) {
    on_own_runtime(move || async move {
        inbox_core::db::run_migrations(&url).await.unwrap();
    });
}

/// Runs `work` with a migration harness on `url`, on a runtime of its own.
fn with_harness(
    url: String,
    work: impl FnOnce(&mut AsyncMigrationHarness<AsyncPgConnection>) + Send + 'static,
) {
    on_own_runtime(move || async move {
        let conn = establish(&url).await.unwrap();
        work(&mut AsyncMigrationHarness::new(conn));
    });
}

/// Runs the future `work` makes on a multi-threaded runtime of its own, on a thread of its
/// own: the migration harness needs such a runtime, and the calling test may run on a single
/// thread.
fn on_own_runtime<F>(work: impl FnOnce() -> F + Send + 'static)
where
    F: std::future::Future<Output = ()>,
{
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
            .block_on(work());
    })
    .join()
    .unwrap();
}

async fn ensure_template(admin_url: &str) -> String {
    let template = format!("inbox_template_{}", env!("MIGRATIONS_FINGERPRINT"));
    let mut admin = establish(admin_url).await.unwrap();
    if database_exists(&mut admin, &template).await {
        return template;
    }
    diesel::sql_query("SELECT pg_advisory_lock($1)")
        .bind::<BigInt, _>(TEMPLATE_LOCK_KEY)
        .execute(&mut admin)
        .await
        .unwrap();
    if !database_exists(&mut admin, &template).await {
        let building = format!("{template}_building");
        // One statement per call: several would form a transaction block, which these refuse.
        for statement in [
            format!("DROP DATABASE IF EXISTS {building} WITH (FORCE)"),
            format!("CREATE DATABASE {building}"),
        ] {
            admin.batch_execute(&statement).await.unwrap();
        }
        migrate(with_database(admin_url, &building));
        for statement in [
            format!("ALTER DATABASE {building} RENAME TO {template}"),
            format!("ALTER DATABASE {template} WITH IS_TEMPLATE true"),
        ] {
            admin.batch_execute(&statement).await.unwrap();
        }
    }
    // Ending the session releases the advisory lock.
    drop(admin);
    template
}

impl TestDatabase {
    /// Creates a database of its own for the calling test.
    pub async fn new() -> Self {
        let admin_url = server_url();
        let template = ensure_template(&admin_url).await;
        let name = format!("inbox_test_{}", uuid::Uuid::new_v4().simple());
        let mut admin = establish(&admin_url).await.unwrap();
        admin
            .batch_execute(&format!("CREATE DATABASE {name} TEMPLATE {template}"))
            .await
            .unwrap();
        let url = with_database(&admin_url, &name);
        Self {
            name,
            url,
            admin_url,
        }
    }

    /// An empty database migrated up to and including migration `version` (its digits, as
    /// in `"20261201000004"`), not further: for testing a later migration on the rows of an
    /// earlier schema. [`Self::migrate_pending`] then applies the rest.
    pub async fn migrated_until(version: &str) -> Self {
        let admin_url = server_url();
        let name = format!("inbox_test_{}", uuid::Uuid::new_v4().simple());
        let mut admin = establish(&admin_url).await.unwrap();
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        let database = Self {
            url: with_database(&admin_url, &name),
            name,
            admin_url,
        };
        let last = version.to_owned();
        with_harness(database.url.clone(), move |harness| loop {
            let pending = harness.pending_migrations(MIGRATIONS).unwrap();
            let Some(next) = pending.into_iter().next() else {
                break;
            };
            if next.name().version().to_string() > last {
                break;
            }
            harness.run_migration(next.as_ref()).unwrap();
        });
        database
    }

    /// Applies every pending migration, as the binaries' `migrate` does.
    pub fn migrate_pending(&self) {
        migrate(self.url.clone());
    }

    /// Reverts the last applied migration (runs its `down.sql`).
    pub fn revert_last_migration(&self) {
        with_harness(self.url.clone(), |harness| {
            harness.revert_last_migration(MIGRATIONS).unwrap();
        });
    }

    /// Reverts every applied migration later than `version` (its digits, as in
    /// [`Self::migrated_until`]), newest first.
    pub fn revert_after(&self, version: &str) {
        if let Err(err) = self.try_revert_after(version) {
            panic!("reverting the migrations after {version}: {err}");
        }
    }

    /// Like [`Self::revert_after`], stopping at the first migration whose `down.sql` fails
    /// and returning its error.
    pub fn try_revert_after(&self, version: &str) -> Result<(), String> {
        let last = version.to_owned();
        let (sender, receiver) = std::sync::mpsc::channel();
        with_harness(self.url.clone(), move |harness| {
            let result = loop {
                let applied = match harness.applied_migrations() {
                    Ok(applied) => applied,
                    Err(err) => break Err(err.to_string()),
                };
                match applied.iter().max() {
                    Some(newest) if newest.to_string() > last => {
                        if let Err(err) = harness.revert_last_migration(MIGRATIONS) {
                            break Err(err.to_string());
                        }
                    }
                    _ => break Ok(()),
                }
            };
            let _ = sender.send(result);
        });
        receiver
            .recv()
            .unwrap_or_else(|_| Err("the migration harness stopped".into()))
    }

    /// The database's connection URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Connection settings for this database, as the binaries take them.
    pub fn args(&self, pool_size: u32) -> DatabaseArgs {
        DatabaseArgs {
            db_pool_size: pool_size,
            db_connect_timeout: Duration::from_secs(5),
            ..DatabaseArgs::for_url(self.url.clone())
        }
    }

    /// A pool of `size` connections to this database.
    pub fn pool(&self, size: u32) -> PgPool {
        self.args(size).pool().unwrap()
    }

    /// One new connection to this database.
    pub async fn connect(&self) -> AsyncPgConnection {
        establish(&self.url).await.unwrap()
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        if std::env::var_os("KEEP_TEST_DATABASES").is_some() {
            eprintln!("kept test database {}", self.url);
            return;
        }
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        // Drop may run inside a runtime; a thread with its own runtime avoids nesting one.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async {
                let mut admin = establish(&admin_url).await.ok()?;
                admin
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await
                    .ok()
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(()))) {
            eprintln!("could not drop test database {}", self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_name_is_replaced_keeping_credentials_and_options() {
        assert_eq!(
            with_database("postgres://u:p@h:5/postgres", "x"),
            "postgres://u:p@h:5/x"
        );
        assert_eq!(
            with_database("postgres://u@h/db?sslmode=disable", "x"),
            "postgres://u@h/x?sslmode=disable"
        );
        assert_eq!(with_database("postgres://h:5", "x"), "postgres://h:5/x");
    }
}
