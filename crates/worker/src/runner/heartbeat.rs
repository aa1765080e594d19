//! Keeping a running attempt's lease alive.

use std::convert::Infallible;

use inbox_core::inbox;
use uuid::Uuid;

use super::{Worker, WorkerError};

impl Worker {
    /// Extends the lease every third of its length for as long as the attempt runs.
    pub(super) async fn heartbeat(&self, ids: &[i64], token: Uuid) -> Infallible {
        let period = self.settings.lease / 3;
        loop {
            tokio::time::sleep(period).await;
            let extended = async {
                let mut conn = self.connection().await?;
                Ok::<_, WorkerError>(
                    inbox::extend_lease(&mut conn, ids, token, self.settings.lease).await?,
                )
            }
            .await;
            match extended {
                Ok(0) => tracing::warn!("heartbeat found the lease already lost"),
                Ok(_) => {}
                Err(err) => tracing::warn!(error = %err, "heartbeat failed"),
            }
        }
    }
}
