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
use crate::sql::rw_payload;
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
    wins: Wins<'a>,
    sent: Mutex<Option<Session>>,
}

/// What an acquire statement may win.
#[derive(Clone, Copy)]
pub(crate) enum Wins<'a> {
    /// Plain leases: each key with the owner it would write.
    Plain {
        keys: &'a [&'a str],
        owners: &'a [String],
    },
    /// A reader's place on a key's read/write row.
    Reader { key: &'a str, owner: &'a str },
    /// The writer's place on a key's read/write row.
    Writer { key: &'a str, owner: &'a str },
}

/// [`Wins`], owned by the cancel.
enum Won {
    Plain(Vec<String>, Vec<String>),
    Reader(String, String),
    Writer(String, String),
}

impl From<Wins<'_>> for Won {
    fn from(w: Wins<'_>) -> Self {
        match w {
            Wins::Plain { keys, owners } => Won::Plain(
                keys.iter().map(|k| (*k).to_owned()).collect(),
                owners.to_vec(),
            ),
            Wins::Reader { key, owner } => Won::Reader(key.to_owned(), owner.to_owned()),
            Wins::Writer { key, owner } => Won::Writer(key.to_owned(), owner.to_owned()),
        }
    }
}

impl<'a> Flight<'a> {
    /// An acquire by `statement` that may win `wins`, not sent yet.
    pub(crate) fn new(provider: &'a PostgresProvider, statement: &'a str, wins: Wins<'a>) -> Self {
        Flight {
            provider,
            statement,
            wins,
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
        let won = Won::from(self.wins);
        let statement = self.statement.to_owned();
        self.provider.inner.cleanups.spawn_on(
            async move { provider.cancel(session, statement, won).await },
            &runtime,
        );
    }
}

impl PostgresProvider {
    /// Ends `session` and waits until it has gone, then releases what the
    /// acquire sent on it won. Tries again while the store does not answer.
    async fn cancel(&self, session: Session, statement: String, won: Won) {
        let give_up = deadline_in(CANCEL_RETRY_FOR);
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.end_then_release(session, &statement, &won).await {
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
        won: &Won,
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
        self.bounded("cancel", async {
            let mut c = self.inner.conns.checkout().await?;
            let ns = &self.inner.namespace;
            let channel = &self.inner.sql.channel;
            let r = match won {
                Won::Plain(keys, owners) => {
                    sqlx::query_scalar::<_, String>(&self.inner.sql.release_owned)
                        .bind(ns)
                        .bind(keys)
                        .bind(owners)
                        .bind(channel)
                        .fetch_all(c.conn())
                        .await
                }
                Won::Reader(key, owner) | Won::Writer(key, owner) => {
                    let sql = match won {
                        Won::Reader(..) => &self.inner.sql.rw.release_reader_owned,
                        _ => &self.inner.sql.rw.release_writer_owned,
                    };
                    sqlx::query(sql)
                        .bind(ns)
                        .bind(key)
                        .bind(owner)
                        .bind(channel)
                        .bind(rw_payload(ns, key))
                        .fetch_optional(c.conn())
                        .await
                        .map(|gone| gone.map(|_| key.clone()).into_iter().collect())
                }
            };
            c.done(&r);
            r
        })
        .await
    }
}
