//! Instant wake-up: a dedicated connection `LISTEN`s on the channel the receiver `NOTIFY`s
//! once per committed batch, and wakes the claim loop. Notifications can be lost (while
//! reconnecting, say); the claim loop's fallback poll covers that.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::poll_fn;
use tokio::sync::{watch, Notify};
use tokio_postgres::{AsyncMessage, NoTls};

/// Keeps a `LISTEN` connection open until `shutdown`, reconnecting after failures, and wakes
/// the claim loops for every notification (also leaving a stored permit, so none is missed
/// while they are busy).
pub async fn listen_for_new_events(
    database_url: String,
    wake: Arc<Notify>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut delay = Duration::from_millis(100);
    while !*shutdown.borrow() {
        tokio::select! {
            result = listen_once(&database_url, &wake) => {
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

async fn listen_once(database_url: &str, wake: &Notify) -> Result<(), tokio_postgres::Error> {
    let (client, mut connection) = tokio_postgres::connect(database_url, NoTls).await?;
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
    while let Some(message) = messages.recv().await {
        if let AsyncMessage::Notification(_) = message {
            wake_all(wake);
        }
    }
    match driver.await {
        Ok(result) => result,
        Err(_) => Ok(()),
    }
}
