//! Instant wake-up: a dedicated connection `LISTEN`s on the channel the receiver `NOTIFY`s
//! once per committed batch, and wakes a claim loop. Notifications can be lost (while
//! reconnecting, say); the claim loop's fallback poll covers that.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::poll_fn;
use inbox_core::db::{ConnectError, ConnectionSettings};
use tokio::sync::{watch, Notify};
use tokio_postgres::AsyncMessage;

/// Keeps a `LISTEN` connection open until `shutdown`, reconnecting after failures, and wakes
/// a claim loop for every notification (a stored permit when all are busy, so none is
/// missed), and every loop after each (re)connection. Each reconnection goes through
/// `settings` again, so after a failover it finds the new primary
/// (`target_session_attrs=read-write`) and listens there.
pub async fn listen_for_new_events(
    settings: ConnectionSettings,
    wake: Arc<Notify>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut delay = Duration::from_millis(100);
    while !*shutdown.borrow() {
        tokio::select! {
            result = listen_once(&settings, &wake) => {
                if let Err(err) = result {
                    tracing::warn!(error = %err, retry_in = ?delay, "notification listener disconnected");
                }
            }
            _ = shutdown.changed() => return,
        }
        // Whatever arrived while disconnected is found by an immediate claim.
        wake_all(&wake);
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shutdown.changed() => return,
        }
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

/// Wakes every idle claim loop, and leaves a permit for one that is busy right now.
fn wake_all(wake: &Notify) {
    wake.notify_waiters();
    wake.notify_one();
}

/// Why the listening connection ended.
#[derive(Debug, thiserror::Error)]
enum ListenError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// `LISTEN` failed (on a standby: "cannot execute LISTEN during recovery") or the
    /// connection broke.
    #[error("listening failed: {0}")]
    Listen(#[from] tokio_postgres::Error),
}

async fn listen_once(settings: &ConnectionSettings, wake: &Notify) -> Result<(), ListenError> {
    let (client, mut connection) = settings.connect_client().await?;
    let (sender, mut messages) = tokio::sync::mpsc::unbounded_channel();
    // The connection must be polled for the LISTEN to complete and notifications to arrive.
    let driver = tokio::spawn(async move {
        loop {
            match poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(message)) => {
                    if sender.send(message).is_err() {
                        return Ok(());
                    }
                }
                Some(Err(err)) => return Err(err),
                None => return Ok(()),
            }
        }
    });
    client
        .batch_execute(&format!("LISTEN {}", inbox_core::NOTIFY_CHANNEL))
        .await?;
    tracing::debug!("listening for new-event notifications");
    // Events committed before the LISTEN (at start, or on a new primary after a failover)
    // sent their notifications to nobody: an immediate claim finds them.
    wake_all(wake);
    while let Some(message) = messages.recv().await {
        if let AsyncMessage::Notification(_) = message {
            // One loop claims the new events; a claim that comes back full wakes another.
            // Waking them all made every arrival cost a claim per loop, all but one empty.
            wake.notify_one();
        }
    }
    match driver.await {
        Ok(result) => Ok(result?),
        Err(_) => Ok(()),
    }
}
