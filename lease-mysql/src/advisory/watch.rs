//! Waiting in the named lock's own queue: the `KeyWatch` of
//! `AdvisoryProvider`.

use std::time::Duration;

use async_trait::async_trait;
use lease_api::backend::KeyWatch;
use tokio::time::Instant;

use super::AdvisoryProvider;

/// A watch that waits for the key's named lock to be free.
pub(super) struct LockWatch {
    pub(super) provider: AdvisoryProvider,
    pub(super) name: String,
}

/// The longest one wait in the lock's queue lasts; the waiter then tries
/// the key again (a spurious wake-up, allowed) and waits anew.
const LOCK_WAIT_MAX: Duration = Duration::from_secs(3600);

impl LockWatch {
    async fn wait_free(&self, max: Duration) -> std::result::Result<(), sqlx::Error> {
        let provider = &self.provider;
        let mut session = provider.session().await?;
        let secs = max.as_secs_f64();
        // Asks for the lock and hands it straight back; the statement limit
        // (MariaDB) must outlast the wait.
        sqlx::query(&format!(
            "/*M!SET STATEMENT max_statement_time = {:.3} FOR*/ SELECT GET_LOCK(?, {secs:.3}), RELEASE_LOCK(?)",
            secs + 5.0
        ))
        .bind(&self.name)
        .bind(&self.name)
        .execute(&mut session.conn)
        .await?;
        provider.park(session);
        Ok(())
    }
}

#[async_trait]
impl KeyWatch for LockWatch {
    async fn changed(&mut self, max: Duration) {
        let max = max.min(LOCK_WAIT_MAX);
        let started = Instant::now();
        let limit = max.saturating_add(
            self.provider
                .inner
                .base
                .response_timeout()
                .saturating_mul(2),
        );
        match tokio::time::timeout(limit, self.wait_free(max)).await {
            Ok(Ok(())) => {}
            // The database is unreachable: wait out the allowance (at most
            // a second here, so the waiter's retries pace themselves).
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "waiting in the lock's queue failed");
                let rest = max
                    .saturating_sub(started.elapsed())
                    .min(Duration::from_secs(1));
                tokio::time::sleep(rest).await;
            }
            Err(_) => {}
        }
    }
}
