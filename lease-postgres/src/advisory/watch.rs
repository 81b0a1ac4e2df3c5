//! Waiting in PostgreSQL's own lock queue: the `KeyWatch` of
//! `AdvisoryProvider`.

use std::time::Duration;

use async_trait::async_trait;
use lease_api::backend::KeyWatch;
use tokio::time::Instant;

use super::AdvisoryProvider;

/// A watch that waits for the key's advisory lock to be free.
pub(super) struct LockWatch {
    pub(super) provider: AdvisoryProvider,
    pub(super) lock_id: i64,
}

/// The longest one wait in the lock queue lasts; the waiter then tries the
/// key again (a spurious wake-up, allowed) and waits anew.
const LOCK_WAIT_MAX: Duration = Duration::from_secs(3600);

impl LockWatch {
    async fn wait_free(&self, max: Duration) -> std::result::Result<(), sqlx::Error> {
        let provider = &self.provider;
        let mut conn = provider.session().await?;
        let ms = max.as_millis().max(1);
        // The statement limit must outlast the lock wait.
        sqlx::query(
            "SELECT set_config('lock_timeout', $1, false), set_config('statement_timeout', $2, false)",
        )
        .bind(ms.to_string())
        .bind((ms + 1000).to_string())
        .execute(&mut conn)
        .await?;
        let waited = sqlx::query("SELECT pg_advisory_lock($1), pg_advisory_unlock($1)")
            .bind(self.lock_id)
            .execute(&mut conn)
            .await;
        match waited {
            Ok(_) => {}
            // lock_timeout (or the statement limit): the wait ran out.
            Err(sqlx::Error::Database(d))
                if matches!(d.code().as_deref(), Some("55P03" | "57014")) => {}
            Err(e) => return Err(e),
        }
        sqlx::query(
            "SELECT set_config('lock_timeout', '0', false), set_config('statement_timeout', $1, false)",
        )
        .bind(&provider.inner.statement_ms)
        .execute(&mut conn)
        .await?;
        provider.park(conn);
        Ok(())
    }
}

#[async_trait]
impl KeyWatch for LockWatch {
    async fn changed(&mut self, max: Duration) {
        let max = max.min(LOCK_WAIT_MAX);
        let started = Instant::now();
        let limit = max.saturating_add(self.provider.inner.base.response_timeout() * 2);
        match tokio::time::timeout(limit, self.wait_free(max)).await {
            Ok(Ok(())) => {}
            // The database is unreachable: wait out the allowance (at most
            // a second here, so the waiter's retries pace themselves).
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "waiting in the lock queue failed");
                let rest = max
                    .saturating_sub(started.elapsed())
                    .min(Duration::from_secs(1));
                tokio::time::sleep(rest).await;
            }
            Err(_) => {}
        }
    }
}
