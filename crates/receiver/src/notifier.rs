//! Wakes idle workers when new events are committed.
//!
//! The notification is its own statement, sent after the events' commit and coalesced: at most
//! one in flight and one pending, and two at least `spacing` apart, whatever the request rate.
//! Inside the insert's transaction a `NOTIFY` would take PostgreSQL's global notification lock
//! at every ingest commit and serialise them; here it costs one small commit. The spacing
//! bounds how often a steady flow wakes the workers' listening backend and claim loops: a
//! worker claims at most once per `--claim-spacing` anyway, so under a flow closer
//! notifications only cost wake-ups. The first notification after a quiet spell goes at once.
//!
//! A lost notification delays processing until the workers' fallback poll, never loses an
//! event: the events are already committed.

use std::time::Duration;

use inbox_core::db::PgPool;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Handle to the notifier task; cheap to clone. The task ends when every handle is dropped.
#[derive(Debug, Clone)]
pub struct Notifier {
    pending: mpsc::Sender<()>,
}

impl Notifier {
    /// Starts the notifier task on the current tokio runtime; notifications start at least
    /// `spacing` apart.
    pub fn start(pool: PgPool, spacing: Duration) -> Self {
        // Capacity one: a poke while a notification is in flight leaves exactly one pending.
        let (pending, mut pokes) = mpsc::channel::<()>(1);
        tokio::spawn(async move {
            while pokes.recv().await.is_some() {
                let started = Instant::now();
                let sent = async {
                    let mut conn = pool.get().await.map_err(|err| err.to_string())?;
                    inbox_core::inbox::notify_new_events(&mut conn)
                        .await
                        .map_err(|err| err.to_string())
                }
                .await;
                if let Err(err) = sent {
                    tracing::debug!(error = %err, "could not notify workers; they will poll");
                }
                // A poke meanwhile stays pending and goes once the spacing has passed.
                tokio::time::sleep_until(started + spacing).await;
            }
        });
        Self { pending }
    }

    /// New events were committed: make sure a notification follows.
    pub fn new_events_committed(&self) {
        // Full means one is already pending, which covers these events too.
        let _ = self.pending.try_send(());
    }
}
