//! Start-up: the `serve` flags, the shared state of the handlers, and the two HTTP servers
//! (console, metrics) they describe.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::time::Duration;

use actix_web::dev::ServerHandle;
use actix_web::{web, App, HttpServer};
use anyhow::Context;
use diesel_async::AsyncPgConnection;
use inbox_core::db::{DatabaseArgs, PgPool};
use inbox_core::durations::DurationFlag;
use inbox_core::operations::browse::{self, EventQuery};
use inbox_core::request_span::RequestSpan;

use crate::client_address::TrustedProxies;
use crate::error::ConsoleError;

use crate::jobs::Jobs;
use crate::login_throttle::LoginThrottle;
use crate::metrics::Metrics;
use crate::sessions::{CookieNames, SessionStore};
use crate::users::Users;
use crate::{http, pages};

/// Default session lifetime.
pub const DEFAULT_SESSION_LIFETIME: &str = "8h";
/// Default events per replay statement.
pub const DEFAULT_REPLAY_BATCH: i64 = 500;
/// Password checks run at once. Each takes argon2's ~19 MiB and ~20 ms of a core; one at a
/// time leaves the other core of a small machine to the pages, whatever the login traffic,
/// and still checks about 50 logins a second.
pub const PASSWORD_CHECKS_AT_ONCE: usize = 1;
/// Searches of the bodies run at once. Each parses every body it reaches, which takes
/// seconds on a large journal and holds a pooled connection meanwhile: two leave the rest of
/// the pool to the other pages and to the replays.
pub const BODY_SEARCHES_AT_ONCE: usize = 2;
/// Default longest time a search of the bodies may take.
pub const DEFAULT_BODY_SEARCH_TIMEOUT: &str = "10s";

/// `console serve` flags.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address of the console (HTML pages). Keep it off the receiver's public address: put it
    /// behind the operators' network or VPN, and TLS in front of it.
    #[arg(long, env = "CONSOLE_LISTEN", default_value = "127.0.0.1:8090")]
    pub listen: SocketAddr,
    /// Address of the Prometheus endpoint (GET /metrics).
    #[arg(long, env = "CONSOLE_METRICS_LISTEN", default_value = "0.0.0.0:9093")]
    pub metrics_listen: SocketAddr,
    /// File of users who may log in, `name:role:argon2-hash` per line (role viewer or
    /// operator; `console hash-password` prints a hash). Give this or --users, not both.
    #[arg(long, env = "CONSOLE_USERS_FILE", conflicts_with = "users")]
    pub users_file: Option<PathBuf>,
    /// Users inline, the same entries separated by spaces (instead of a file).
    #[arg(long, env = "CONSOLE_USERS", hide_env_values = true)]
    pub users: Option<String>,
    /// How long a login lasts.
    #[arg(long, env = "CONSOLE_SESSION_LIFETIME", value_parser = humantime::parse_duration, default_value = DEFAULT_SESSION_LIFETIME)]
    pub session_lifetime: Duration,
    /// Send the console's cookies only over HTTPS (`Secure`, their names prefixed `__Host-`).
    /// Turn off only for a console reached over plain HTTP on a loopback address.
    #[arg(long, env = "CONSOLE_COOKIE_SECURE", default_value_t = true, action = clap::ArgAction::Set)]
    pub cookie_secure: bool,
    /// Show everything, change nothing: every repair is refused, for every user.
    #[arg(long, env = "CONSOLE_READ_ONLY")]
    pub read_only: bool,
    /// Longest a search of the bodies (the filter's body field) may take; a longer one is
    /// cancelled on the server and the page says to narrow it. Two run at once at most; a
    /// third is answered 429.
    #[arg(long, env = "CONSOLE_BODY_SEARCH_TIMEOUT", value_parser = humantime::parse_duration, default_value = DEFAULT_BODY_SEARCH_TIMEOUT)]
    pub body_search_timeout: Duration,
    /// Reverse proxies (addresses or networks, separated by commas) whose X-Forwarded-For
    /// names the client, for the per-address login limit. Without it every login behind a
    /// proxy comes from the proxy's address, and the limit applies to all users together.
    #[arg(long, env = "CONSOLE_TRUSTED_PROXIES", default_value = "")]
    pub trusted_proxies: TrustedProxies,
    /// Dead events replayed per statement by a replay by filter.
    #[arg(long, env = "CONSOLE_REPLAY_BATCH", default_value_t = DEFAULT_REPLAY_BATCH, value_parser = clap::value_parser!(i64).range(1..=10_000))]
    pub replay_batch: i64,
    #[command(flatten)]
    pub db: DatabaseArgs,
}

impl ServeArgs {
    fn load_users(&self) -> anyhow::Result<Users> {
        // The command line refuses both at once; a caller building these arguments by hand
        // gets the same refusal rather than one list silently ignored.
        let text = match (&self.users_file, &self.users) {
            (Some(_), Some(_)) => {
                anyhow::bail!(
                    "give the users in a file (--users-file) or inline (--users), not both"
                )
            }
            (Some(path), None) => std::fs::read_to_string(path)
                .with_context(|| format!("cannot read users file {}", path.display()))?,
            (None, Some(inline)) => inline.clone(),
            (None, None) => String::new(),
        };
        Ok(Users::parse(&text)?)
    }
}

/// What every handler shares.
#[derive(Debug)]
pub struct AppState {
    /// The database.
    pub pool: PgPool,
    /// Who may log in.
    pub users: Users,
    /// Who is logged in.
    pub sessions: SessionStore,
    /// Recent failed logins, per client and per name.
    pub login_throttle: LoginThrottle,
    /// `--trusted-proxies`.
    pub trusted_proxies: TrustedProxies,
    /// Turns to search the bodies ([`BODY_SEARCHES_AT_ONCE`]).
    pub body_searches: tokio::sync::Semaphore,
    /// `--body-search-timeout`.
    pub body_search_timeout: Duration,
    /// `--db-statement-timeout` of the other queries (`None`: the server's).
    pub statement_timeout: Option<Duration>,
    /// Permits to run a password check ([`PASSWORD_CHECKS_AT_ONCE`]).
    pub password_checks: tokio::sync::Semaphore,
    /// Replays by filter of this process.
    pub jobs: Jobs,
    /// The metrics.
    pub metrics: Metrics,
    /// Every repair is refused.
    pub read_only: bool,
    /// Session cookies carry `Secure` (and their names the `__Host-` prefix).
    pub cookie_secure: bool,
    /// Events per replay statement.
    pub replay_batch: i64,
}

impl AppState {
    /// The names of the console's cookies ([`CookieNames`]).
    pub fn cookie_names(&self) -> CookieNames {
        CookieNames::new(self.cookie_secure)
    }

    /// A pooled connection set up for operator queries ([`browse::tune_session`]).
    pub async fn connection(&self) -> Result<PooledConnection<'_>, ConsoleError> {
        let mut conn = self.pool.get().await?;
        browse::tune_session(&mut conn, self.statement_timeout).await?;
        Ok(conn)
    }

    /// Runs `run`, a query of the events `query` selects. When the query searches the bodies
    /// it first takes one of [`BODY_SEARCHES_AT_ONCE`] turns (none free:
    /// [`ConsoleError::Busy`], so that a few browser tabs cannot hold every connection of the
    /// pool), and its statements end at `--body-search-timeout`.
    pub async fn query_events<T>(
        &self,
        query: &EventQuery,
        run: impl AsyncFnOnce(&mut AsyncPgConnection) -> diesel::QueryResult<T>,
    ) -> Result<T, ConsoleError> {
        if query.body_contains.is_none() {
            let mut conn = self.connection().await?;
            return Ok(run(&mut conn).await?);
        }
        let _turn = self.body_searches.try_acquire().map_err(|_| {
            ConsoleError::Busy("Other searches of the bodies are running; retry in a moment.")
        })?;
        let mut conn = self.pool.get().await?;
        browse::tune_session(&mut conn, Some(self.body_search_timeout)).await?;
        run(&mut conn)
            .await
            .map_err(|err| ConsoleError::SearchFailed {
                timeout: self.body_search_timeout,
                err,
            })
    }
}

/// A connection checked out of the console's pool.
pub type PooledConnection<'a> =
    diesel_async::pooled_connection::bb8::PooledConnection<'a, diesel_async::AsyncPgConnection>;

/// A console serving; stop it with [`RunningConsole::stop`].
#[derive(Debug)]
pub struct RunningConsole {
    /// Where the pages are served.
    pub addr: SocketAddr,
    /// Where /metrics is served.
    pub metrics_addr: SocketAddr,
    handle: ServerHandle,
    metrics_handle: ServerHandle,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    metrics_server: tokio::task::JoinHandle<std::io::Result<()>>,
    state: web::Data<AppState>,
}

impl RunningConsole {
    /// Stops the replays in progress (see [`Jobs::stop_all`]), then both servers, letting
    /// requests in progress finish.
    pub async fn stop(self) {
        self.state.jobs.stop_all().await;
        self.handle.stop(true).await;
        self.metrics_handle.stop(true).await;
        let _ = self.server.await;
        let _ = self.metrics_server.await;
    }

    /// Serves until SIGTERM or SIGINT, then stops as [`Self::stop`] does (or until the page
    /// server fails).
    pub async fn wait(mut self) -> anyhow::Result<()> {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .context("listening for SIGTERM")?;
        tokio::select! {
            _ = terminate.recv() => {}
            interrupted = tokio::signal::ctrl_c() => interrupted.context("listening for SIGINT")?,
            served = &mut self.server => {
                self.metrics_handle.stop(true).await;
                return Ok(served.context("console server task")??);
            }
        }
        tracing::info!("stopping: replays in progress first, then the servers");
        self.stop().await;
        Ok(())
    }
}

/// Refuses a zero session lifetime (no login would last) and durations that are typing errors.
fn check_durations(args: &ServeArgs) -> anyhow::Result<()> {
    let mut flags = vec![
        DurationFlag::period("--session-lifetime", args.session_lifetime),
        DurationFlag::interval("--body-search-timeout", args.body_search_timeout),
    ];
    flags.extend(args.db.duration_flags());
    inbox_core::durations::check_all(&flags).map_err(anyhow::Error::msg)
}

/// Binds both listeners and starts serving.
pub async fn start(args: &ServeArgs) -> anyhow::Result<RunningConsole> {
    check_durations(args)?;
    let users = args.load_users()?;
    let pool = args.db.pool().context("database settings")?;
    let statement_timeout = Some(args.db.db_statement_timeout).filter(|t| !t.is_zero());
    let metrics = Metrics::new();
    let state = web::Data::new(AppState {
        pool,
        users,
        sessions: SessionStore::new(args.session_lifetime),
        login_throttle: LoginThrottle::default(),
        password_checks: tokio::sync::Semaphore::new(PASSWORD_CHECKS_AT_ONCE),
        trusted_proxies: args.trusted_proxies.clone(),
        body_searches: tokio::sync::Semaphore::new(BODY_SEARCHES_AT_ONCE),
        body_search_timeout: args.body_search_timeout,
        statement_timeout,
        jobs: Jobs::new(statement_timeout),
        metrics: metrics.clone(),
        read_only: args.read_only,
        cookie_secure: args.cookie_secure,
        replay_batch: args.replay_batch,
    });
    let listener = TcpListener::bind(args.listen)
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let metrics_listener = TcpListener::bind(args.metrics_listen)
        .with_context(|| format!("cannot listen on {}", args.metrics_listen))?;
    let metrics_addr = metrics_listener.local_addr()?;

    let app_state = state.clone();
    let server = HttpServer::new(move || {
        App::new()
            .app_data(app_state.clone())
            .app_data(web::FormConfig::default().limit(64 * 1024))
            .configure(pages::configure)
            .wrap_fn(http::record_and_protect)
            .wrap(tracing_actix_web::TracingLogger::<RequestSpan>::new())
    })
    .workers(2)
    // Signals are `RunningConsole::wait`'s: replays stop before the page workers do.
    .disable_signals()
    .listen(listener)?
    .run();
    let handle = server.handle();

    let metrics_data = web::Data::new(metrics);
    let metrics_server = HttpServer::new(move || {
        App::new()
            .app_data(metrics_data.clone())
            .route("/metrics", web::get().to(http::metrics))
    })
    .workers(1)
    .disable_signals()
    .listen(metrics_listener)?
    .run();
    let metrics_handle = metrics_server.handle();
    Ok(RunningConsole {
        addr,
        metrics_addr,
        handle,
        metrics_handle,
        server: tokio::spawn(server),
        metrics_server: tokio::spawn(metrics_server),
        state,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve_args(flags: &[&str]) -> ServeArgs {
        #[derive(clap::Parser)]
        struct Command {
            #[command(flatten)]
            serve: ServeArgs,
        }
        let fixed = ["console", "--database-url", "postgres://db"];
        <Command as clap::Parser>::try_parse_from(fixed.iter().chain(flags))
            .expect("flags")
            .serve
    }

    #[test]
    fn a_zero_session_lifetime_refuses_to_start_naming_the_flag() {
        assert!(check_durations(&serve_args(&[])).is_ok());
        let err =
            check_durations(&serve_args(&["--session-lifetime", "0s"])).expect_err("zero lifetime");
        assert!(err.to_string().contains("--session-lifetime 0s"), "{err}");
    }
}
