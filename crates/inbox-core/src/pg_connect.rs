//! Opening connections: TLS as `sslmode` says, the first read-write host of a multi-host
//! connection string, the session's own limits, and a connection that drops itself when its
//! server turns out to be read-only (a demoted primary, a standby after failover), so the pool
//! replaces it with one to the new primary.

use std::sync::Arc;
use std::time::Duration;

use diesel::connection::{Instrumentation, InstrumentationEvent};
use diesel::result::{ConnectionError, DatabaseErrorKind, Error as DieselError};
use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use tokio::sync::Notify;
use tokio_postgres::{Client, Connection, Socket};

use crate::pg_tls::{PgTls, PgTlsStream, TlsSetupError};
use crate::pg_url::{self, UrlError};

/// How long a connection attempt to one host may take when the string does not say
/// (`connect_timeout`): a host that is down must not hold up the next one of the list.
const DEFAULT_HOST_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// TCP keepalive and user timeout when the string does not say: a server that vanished
/// without closing its connections (a crashed machine, a partition) is noticed within about
/// half a minute instead of the kernel's two hours.
const DEFAULT_KEEPALIVE_IDLE: Duration = Duration::from_secs(15);
const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const DEFAULT_TCP_USER_TIMEOUT: Duration = Duration::from_secs(30);
/// tokio-postgres's own keepalive idle default, to tell "not set" from "set".
const DRIVER_KEEPALIVE_IDLE: Duration = Duration::from_secs(2 * 60 * 60);

/// Limits a binary sets on its own sessions, so that a stuck client cannot hold locks on the
/// shared database for ever. Per-statement or per-transaction limits (`SET LOCAL`) override
/// them where a shorter one is wanted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionLimits {
    /// `statement_timeout`: the longest one statement may run (`None`: the server's setting).
    pub statement_timeout: Option<Duration>,
    /// `idle_in_transaction_session_timeout`: the longest a transaction may sit idle, holding
    /// its locks, waiting for the client.
    pub idle_in_transaction_timeout: Option<Duration>,
}

impl SessionLimits {
    /// The `SET` statements of these limits, one round trip; `None` when there are none.
    fn statements(&self) -> Option<String> {
        let settings = [
            ("statement_timeout", self.statement_timeout),
            (
                "idle_in_transaction_session_timeout",
                self.idle_in_transaction_timeout,
            ),
        ];
        let statements: Vec<String> = settings
            .iter()
            .filter_map(|(name, value)| {
                value.map(|limit| format!("SET {name} = {}", limit.as_millis()))
            })
            .collect();
        (!statements.is_empty()).then(|| statements.join("; "))
    }
}

/// Why settings could not be built from a connection string.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The string itself.
    #[error(transparent)]
    Url(#[from] UrlError),
    /// Its TLS part (`sslmode`, `sslrootcert`).
    #[error(transparent)]
    Tls(#[from] TlsSetupError),
}

/// A connection could not be opened. Names the hosts, never the credentials. Its message
/// holds the driver's whole chain of causes (the TLS handshake's reason, say): it often ends
/// up as a plain string (diesel's `ConnectionError`).
#[derive(Debug, thiserror::Error)]
#[error("cannot connect to PostgreSQL at {target}: {reason}")]
pub struct ConnectError {
    target: String,
    reason: String,
}

impl ConnectError {
    fn new(target: &str, error: &tokio_postgres::Error) -> Self {
        let mut reason = error.to_string();
        let mut cause = std::error::Error::source(error);
        while let Some(inner) = cause {
            reason.push_str(": ");
            reason.push_str(&inner.to_string());
            cause = inner.source();
        }
        Self {
            target: target.to_owned(),
            reason,
        }
    }
}

/// Everything needed to open a connection, parsed and checked once.
#[derive(Clone)]
pub struct ConnectionSettings {
    config: tokio_postgres::Config,
    tls: PgTls,
    limits: SessionLimits,
    target: String,
}

impl std::fmt::Debug for ConnectionSettings {
    // The driver's configuration holds the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionSettings")
            .field("target", &self.target)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl ConnectionSettings {
    /// Reads `url` (libpq's URL or `key=value` form). `application_name` is used unless the
    /// string names one itself.
    pub fn new(
        url: &str,
        application_name: &str,
        limits: SessionLimits,
    ) -> Result<Self, SettingsError> {
        let parsed = pg_url::parse(url)?;
        let tls = PgTls::new(parsed.tls_mode, &parsed.root_certs)?;
        let mut config = parsed.config;
        if config.get_application_name().is_none() {
            config.application_name(application_name);
        }
        apply_network_defaults(&mut config);
        let target = pg_url::describe(&config);
        Ok(Self {
            config,
            tls,
            limits,
            target,
        })
    }

    /// Overrides the string's `application_name`.
    pub fn set_application_name(&mut self, name: &str) {
        self.config.application_name(name);
    }

    /// Where this connects (hosts and database, no credentials).
    pub fn target(&self) -> &str {
        &self.target
    }

    /// A driver-level client and its connection, for what diesel does not do (`LISTEN`).
    /// The connection must be polled (spawned) for the client to work.
    pub async fn connect_client(
        &self,
    ) -> Result<(Client, Connection<Socket, PgTlsStream<Socket>>), ConnectError> {
        self.config
            .connect(self.tls.clone())
            .await
            .map_err(|err| ConnectError::new(&self.target, &err))
    }

    /// Asks the server to cancel the statement running on `token`'s session, if any (the
    /// session itself stays; its statement fails with SQLSTATE 57014). Best effort: a cancel
    /// arriving after the statement ended does nothing, and one that cannot reach the server
    /// leaves the statement to finish on its own.
    pub async fn cancel_statement(
        &self,
        token: &tokio_postgres::CancelToken,
    ) -> Result<(), ConnectError> {
        token
            .cancel_query(self.tls.clone())
            .await
            .map_err(|err| ConnectError::new(&self.target, &err))
    }

    /// A diesel connection with this binary's session limits. It closes itself the first time
    /// a statement fails because the server is read-only, so a pool drops it.
    pub async fn establish(&self) -> Result<AsyncPgConnection, ConnectionError> {
        let (client, connection) = self
            .connect_client()
            .await
            .map_err(|err| ConnectionError::BadConnection(err.to_string()))?;
        let read_only = Arc::new(Notify::new());
        tokio::spawn(drive_until_read_only(connection, read_only.clone()));
        let mut conn = AsyncPgConnection::try_from(client).await?;
        conn.set_instrumentation(ReadOnlyWatch { read_only });
        if let Some(statements) = self.limits.statements() {
            conn.batch_execute(&statements)
                .await
                .map_err(ConnectionError::CouldntSetupConfiguration)?;
        }
        Ok(conn)
    }
}

/// Short connect and keepalive timeouts, unless the connection string chose its own.
fn apply_network_defaults(config: &mut tokio_postgres::Config) {
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(DEFAULT_HOST_CONNECT_TIMEOUT);
    }
    if config.get_keepalives_idle() == DRIVER_KEEPALIVE_IDLE {
        config.keepalives_idle(DEFAULT_KEEPALIVE_IDLE);
        config.keepalives_interval(DEFAULT_KEEPALIVE_INTERVAL);
        config.keepalives_retries(3);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(DEFAULT_TCP_USER_TIMEOUT);
    }
}

/// Polls the connection until it ends or a statement found the server read-only; dropping
/// it then closes the socket, which the client (and the pool, on return) sees as closed.
async fn drive_until_read_only(
    connection: Connection<Socket, PgTlsStream<Socket>>,
    read_only: Arc<Notify>,
) {
    tokio::select! {
        result = connection => {
            if let Err(err) = result {
                tracing::debug!(error = %err, "database connection ended");
            }
        }
        () = read_only.notified() => {
            tracing::warn!(
                "database server is read-only (a standby, or a demoted primary): connection \
                 closed, the next one looks for the read-write server"
            );
        }
    }
}

/// Watches every statement's outcome for SQLSTATE 25006 (read_only_sql_transaction).
struct ReadOnlyWatch {
    read_only: Arc<Notify>,
}

impl Instrumentation for ReadOnlyWatch {
    fn on_connection_event(&mut self, event: InstrumentationEvent<'_>) {
        if let InstrumentationEvent::FinishQuery {
            error: Some(DieselError::DatabaseError(DatabaseErrorKind::ReadOnlyTransaction, _)),
            ..
        } = event
        {
            // A stored permit: the driver task sees it even if it is not waiting right now.
            self.read_only.notify_one();
        }
    }
}

/// One connection with `limits`, outside any pool (migrations, operator commands, tests).
pub async fn establish(
    url: &str,
    application_name: &str,
    limits: SessionLimits,
) -> Result<AsyncPgConnection, ConnectionError> {
    let settings = ConnectionSettings::new(url, application_name, limits)
        .map_err(|err| ConnectionError::InvalidConnectionUrl(err.to_string()))?;
    settings.establish().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_become_one_batch_of_set_statements_in_milliseconds() {
        let limits = SessionLimits {
            statement_timeout: Some(Duration::from_secs(30)),
            idle_in_transaction_timeout: Some(Duration::from_secs(60)),
        };
        assert_eq!(
            limits.statements().as_deref(),
            Some("SET statement_timeout = 30000; SET idle_in_transaction_session_timeout = 60000")
        );
        assert_eq!(SessionLimits::default().statements(), None);
    }

    #[test]
    fn the_strings_own_application_name_and_timeouts_win() {
        let settings = ConnectionSettings::new(
            "postgres://u:pw@h/db?application_name=mine&connect_timeout=9&sslmode=disable",
            "receiver",
            SessionLimits::default(),
        )
        .unwrap();
        assert_eq!(settings.config.get_application_name(), Some("mine"));
        assert_eq!(
            settings.config.get_connect_timeout(),
            Some(&Duration::from_secs(9))
        );
        assert_eq!(
            settings.config.get_tcp_user_timeout(),
            Some(&DEFAULT_TCP_USER_TIMEOUT)
        );
        assert!(!format!("{settings:?}").contains("pw"));
    }
}
