//! Waiting without notifications: MySQL and MariaDB cannot push, so a
//! waiter reads its key's row (by primary key, no lock, no write) every poll
//! interval and tries again once the row says the key is free. An acquire
//! attempt is made only then, never on every poll.

use std::time::Duration;

use async_trait::async_trait;
use lease_api::LeaseKey;
use lease_api::backend::KeyWatch;
use tokio::time::Instant;

use crate::provider::MysqlProvider;

/// Wakes when a read of the row finds the key free (released, expired or
/// never taken) or taken again since the watch started (its token moved: a
/// release and the next acquire between two reads, which an observer of
/// holders must not miss), or when the read fails (the waiter's next
/// attempt then reports the store's state).
pub(crate) struct PollWatch {
    provider: MysqlProvider,
    key: LeaseKey,
    /// The token when the watch started; `None`: no row.
    start: Option<u64>,
}

impl PollWatch {
    /// Reads the row once, so that a change after this call is seen.
    pub(crate) async fn start(
        provider: MysqlProvider,
        key: LeaseKey,
    ) -> lease_api::Result<PollWatch> {
        let mut watch = PollWatch {
            provider,
            key,
            start: None,
        };
        watch.start = watch.state().await?.map(|(token, _)| token);
        Ok(watch)
    }

    /// Whether the key changed: free now by the database clock, or held
    /// under another token than at the start.
    async fn changed_now(&self) -> lease_api::Result<bool> {
        Ok(match self.state().await? {
            None => true,
            Some((token, free)) => free || Some(token) != self.start,
        })
    }

    /// The row's token and whether the key is free; `None`: no row.
    async fn state(&self) -> lease_api::Result<Option<(u64, bool)>> {
        let inner = &self.provider.inner;
        let row: Option<(u64, i64)> = self
            .provider
            .bounded("the waiter's read", async {
                let mut c = inner.conns.checkout().await?;
                let r = sqlx::query_as(&inner.sql.state)
                    .bind(inner.namespace.as_bytes())
                    .bind(self.key.as_str().as_bytes())
                    .fetch_optional(c.conn())
                    .await;
                c.done(&r);
                r
            })
            .await?;
        Ok(row.map(|(token, free)| (token, free != 0)))
    }
}

#[async_trait]
impl KeyWatch for PollWatch {
    async fn changed(&mut self, max: Duration) {
        let every = self.provider.inner.poll_interval;
        let deadline = lease_api::backend::deadline_after(Instant::now(), max);
        loop {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            tokio::time::sleep(every.min(deadline - now)).await;
            if !matches!(self.changed_now().await, Ok(false)) {
                return;
            }
        }
    }
}
