//! The LISTEN connection shared by a provider's waiters: it wakes them on
//! each release's NOTIFY, and reconnects (waking them all) when it drops.

use std::sync::Arc;
use std::time::Duration;
use tokio_util::task::AbortOnDropHandle;

use lease_api::{LeaseError, Result};
use sqlx::postgres::{PgListener, PgPool};

use crate::provider::{Listener, PostgresProvider, point_pool};

/// How long the LISTEN connection may stay quiet before it is checked with a
/// query: a connection whose peer vanished without a reset would otherwise
/// miss every release until the process restarts.
const LISTEN_HEARTBEAT: Duration = Duration::from_secs(15);

impl PostgresProvider {
    pub(crate) async fn ensure_listener(&self) -> Result<()> {
        let mut slot = self.inner.listener.lock().await;
        if slot.as_ref().is_some_and(|l| !l.task.is_finished()) {
            return Ok(());
        }
        let channel = self.inner.sql.channel.clone();
        let pool = self.pool()?.clone();
        let limit = self.inner.response_timeout;
        let hosts = Arc::clone(&self.inner.hosts);
        let pool_host = Arc::clone(&self.inner.pool_host);
        let connect = move |pool: PgPool, channel: String| {
            let (hosts, pool_host) = (Arc::clone(&hosts), Arc::clone(&pool_host));
            async move {
                match tokio::time::timeout(limit + hosts.connect_timeout(), async {
                    if hosts.is_multi() {
                        // LISTEN is refused on a standby: find the primary first
                        // (after a promotion, nothing else may have yet).
                        drop(hosts.connect_primary(|o| o).await?);
                        point_pool(&pool, &hosts, &pool_host);
                    }
                    let mut l = PgListener::connect_with(&pool).await?;
                    l.listen(&channel).await?;
                    Ok::<_, sqlx::Error>(l)
                })
                .await
                {
                    Ok(r) => r.map_err(|e| e.to_string()),
                    Err(_) => Err(format!("no answer within {limit:?}")),
                }
            }
        };
        let first =
            connect(pool.clone(), channel.clone())
                .await
                .map_err(|e| LeaseError::Unavailable {
                    message: format!("LISTEN at PostgreSQL {} failed: {e}", self.inner.display),
                    source: None,
                })?;
        let hub = Arc::clone(&self.inner.hub);
        let task = tokio::spawn(async move {
            let mut listener = Some(first);
            let mut backoff = Duration::from_millis(50);
            loop {
                let Some(l) = listener.as_mut() else {
                    match connect(pool.clone(), channel.clone()).await {
                        Ok(l) => {
                            listener = Some(l);
                            backoff = Duration::from_millis(50);
                            // Releases while no LISTEN was active were not
                            // announced to us: every waiter looks again now.
                            hub.wake_all();
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "re-LISTEN failed; retrying");
                            tokio::time::sleep(backoff).await;
                            backoff = (backoff * 2).min(Duration::from_secs(1));
                        }
                    }
                    continue;
                };
                let received = match tokio::time::timeout(LISTEN_HEARTBEAT, l.try_recv()).await {
                    Ok(r) => r,
                    // Quiet for a while: make sure the connection is alive (a
                    // peer that vanished without a reset would leave try_recv
                    // waiting forever, and every release unannounced).
                    Err(_) => {
                        let ping =
                            tokio::time::timeout(limit, sqlx::query("SELECT 1").execute(&mut *l));
                        match ping.await {
                            Ok(Ok(_)) => continue,
                            _ => Ok(None),
                        }
                    }
                };
                match received {
                    Ok(Some(n)) => hub.wake(n.payload()),
                    // The connection broke. Reconnect ourselves (not inside
                    // sqlx), so the wake-up comes after LISTEN is active again.
                    Ok(None) | Err(_) => {
                        listener = None;
                        hub.wake_all();
                    }
                }
            }
        });
        *slot = Some(Listener {
            task: AbortOnDropHandle::new(task),
        });
        Ok(())
    }
}
