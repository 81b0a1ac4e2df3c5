//! Acquires whose answer never came back.
//!
//! The client gives up on a statement after the response timeout, counted
//! from before it took a connection. The server's `statement_timeout` counts
//! from the statement's arrival, a little later (twice as long with several
//! hosts), and a statement still in a socket buffer when the client gave up
//! arrives later still. A row lock freed in that gap lets the acquire commit
//! a lease nobody holds, and the key stays blocked for its TTL.
//!
//! So an acquire left without its answer (timed out, its future dropped, or
//! its connection broken mid-statement) is cancelled in the background, as
//! lease-redis cancels its own: the server session the statement was sent on
//! is ended and awaited, since once that session is gone its statement has
//! committed or never will; then whatever the acquire won is released, and
//! the key's waiters are told.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::PostgresProvider;
use crate::conns::Session;
use lease_api::backend::deadline_in;

/// How long a cancel keeps trying while the store does not answer. A cancel
/// that gives up leaves at most one lease, which runs out by its TTL.
const CANCEL_RETRY_FOR: Duration = Duration::from_secs(600);

/// How often a cancel looks whether the ended session has gone.
const GONE_POLL: Duration = Duration::from_millis(20);

/// An acquire statement on its way: the session it was sent on, until the
/// server answered. Dropped while it has no answer, it cancels the acquire
/// in the background (see the module docs).
pub(crate) struct Flight<'a> {
    provider: &'a PostgresProvider,
    /// The statement's text, to tell it on the server.
    statement: &'a str,
    /// The keys the statement may win, each with the owner it would write.
    keys: &'a [&'a str],
    owners: &'a [String],
    sent: Mutex<Option<Session>>,
}

impl<'a> Flight<'a> {
    /// An acquire of `keys` for `owners` (one owner per key) by `statement`,
    /// not sent yet.
    pub(crate) fn new(
        provider: &'a PostgresProvider,
        statement: &'a str,
        keys: &'a [&'a str],
        owners: &'a [String],
    ) -> Self {
        Flight {
            provider,
            statement,
            keys,
            owners,
            sent: Mutex::new(None),
        }
    }

    /// The statement is about to be sent on `session`.
    pub(crate) fn sent(&self, session: Session) {
        *self.sent.lock().unwrap_or_else(PoisonError::into_inner) = Some(session);
    }

    /// The statement ended with `result`. Its outcome is known when the server
    /// answered, with rows or with an error (which undid it); an I/O or
    /// protocol error leaves it unknown, and the acquire is cancelled.
    pub(crate) fn answered<T>(&self, result: &Result<T, sqlx::Error>) {
        if matches!(result, Ok(_) | Err(sqlx::Error::Database(_))) {
            *self.sent.lock().unwrap_or_else(PoisonError::into_inner) = None;
        }
    }
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        let sent = self.sent.get_mut().unwrap_or_else(PoisonError::into_inner);
        let Some(session) = sent.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                "an acquire without its answer could not be cancelled outside a runtime; if it ran, its lease runs out by its TTL"
            );
            return;
        };
        let provider = self.provider.clone();
        let keys: Vec<String> = self.keys.iter().map(|k| (*k).to_owned()).collect();
        let owners = self.owners.to_vec();
        let statement = self.statement.to_owned();
        self.provider.inner.cleanups.spawn_on(
            async move { provider.cancel(session, statement, keys, owners).await },
            &runtime,
        );
    }
}

impl PostgresProvider {
    /// Ends `session` and waits until it has gone, then releases what the
    /// acquire sent on it won. Tries again while the store does not answer.
    async fn cancel(
        &self,
        session: Session,
        statement: String,
        keys: Vec<String>,
        owners: Vec<String>,
    ) {
        let give_up = deadline_in(CANCEL_RETRY_FOR);
        let mut backoff = Duration::from_millis(100);
        loop {
            match self
                .end_then_release(session, &statement, &keys, &owners)
                .await
            {
                Ok(released) => {
                    for key in released {
                        tracing::info!(server = %self.inner.display, key, "released the lease of an acquire that had no answer");
                    }
                    return;
                }
                Err(e) if tokio::time::Instant::now() >= give_up => {
                    tracing::warn!(server = %self.inner.display, error = %e, "could not cancel an acquire that had no answer; if it ran, its lease runs out by its TTL");
                    return;
                }
                Err(_) => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// One try of [`cancel`](Self::cancel): the keys released.
    async fn end_then_release(
        &self,
        session: Session,
        statement: &str,
        keys: &[String],
        owners: &[String],
    ) -> lease_api::Result<Vec<String>> {
        // Signalled again on each look: a session in the middle of a commit
        // ends once the commit is done. Only while it is idle (the statement
        // still on its way) or runs the statement: behind a pooler in
        // transaction mode, a server session serves other clients once the
        // statement is over, and those are left alone.
        loop {
            let alive = self
                .bounded("cancel", async {
                    let mut c = self.inner.conns.checkout().await?;
                    let r = sqlx::query(&self.inner.sql.end_session)
                        .bind(session.pid)
                        .bind(session.started)
                        .bind(statement)
                        .fetch_optional(c.conn())
                        .await;
                    c.done(&r);
                    r
                })
                .await?;
            if alive.is_none() {
                break;
            }
            tokio::time::sleep(GONE_POLL).await;
        }
        let released = self
            .bounded("cancel", async {
                let mut c = self.inner.conns.checkout().await?;
                let r = sqlx::query_scalar::<_, String>(&self.inner.sql.release_owned)
                    .bind(&self.inner.namespace)
                    .bind(keys)
                    .bind(owners)
                    .bind(&self.inner.sql.channel)
                    .fetch_all(c.conn())
                    .await;
                c.done(&r);
                r
            })
            .await?;
        Ok(released)
    }
}
