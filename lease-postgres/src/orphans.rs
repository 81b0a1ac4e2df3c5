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
//! the key's waiters are told. An acquire whose answer came but never
//! reached its caller (the answer could not be read) releases what it won
//! too, without ending a session.
//!
//! Behind a pooler, the session must be the client's for its whole life
//! (PgBouncer's session mode): in transaction mode the session read at
//! connect is not the one a later statement runs on.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use lease_api::backend::{deadline_in, poll_until, retry_until, spawn_tracked};

use crate::PostgresProvider;
use crate::conns::{Session, in_step};
use crate::sql::rw_payload;

/// How long a cancel keeps trying while the store does not answer, or the
/// session does not go. A cancel that gives up leaves at most one lease,
/// which runs out by its TTL.
const CANCEL_RETRY_FOR: Duration = Duration::from_secs(600);

/// The first wait between looks at whether an ended session has gone; it
/// doubles up to a second.
const GONE_POLL: Duration = Duration::from_millis(20);

/// An acquire statement on its way. Dropped before its caller has the
/// answer, it cancels the acquire in the background (see the module docs).
pub(crate) struct Flight<'a> {
    provider: &'a PostgresProvider,
    /// The statement's text, to tell it on the server.
    statement: &'a str,
    wins: Wins<'a>,
    stage: Mutex<Stage>,
}

/// Where an acquire statement stands.
#[derive(Clone, Copy, Debug)]
enum Stage {
    /// Not sent, or settled: the caller has the answer, or the statement
    /// was undone (the server answered with an error).
    Quiet,
    /// Sent on this session, no answer yet: its outcome is unknown.
    Sent(Session),
    /// Answered, not yet handed to the caller.
    Answered,
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
            stage: Mutex::new(Stage::Quiet),
        }
    }

    fn set(&self, stage: Stage) {
        *self.stage.lock().unwrap_or_else(PoisonError::into_inner) = stage;
    }

    /// The statement is about to be sent on `session`.
    pub(crate) fn sent(&self, session: Session) {
        self.set(Stage::Sent(session));
    }

    /// The statement ended with `result`. With rows, it is answered; with an
    /// ordinary error from the server, it was undone. Anything else (an I/O
    /// or protocol error, the server ending the session) leaves its outcome
    /// unknown, as a timeout does.
    pub(crate) fn answered<T>(&self, result: &Result<T, sqlx::Error>) {
        match result {
            Ok(_) => self.set(Stage::Answered),
            Err(e @ sqlx::Error::Database(_)) if in_step(e) => self.set(Stage::Quiet),
            Err(_) => {}
        }
    }

    /// The caller has the answer: nothing to cancel. Called last, just
    /// before the acquire returns it.
    pub(crate) fn settled(&self) {
        self.set(Stage::Quiet);
    }
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        let stage = *self.stage.get_mut().unwrap_or_else(PoisonError::into_inner);
        let session = match stage {
            Stage::Quiet => return,
            Stage::Sent(session) => Some(session),
            Stage::Answered => None,
        };
        let provider = self.provider.clone();
        let won = Won::from(self.wins);
        let statement = self.statement.to_owned();
        let work = async move { provider.cancel(session, statement, won).await };
        if !spawn_tracked(&self.provider.inner.cleanups, work) {
            tracing::warn!(
                "an acquire without its answer could not be cancelled outside a runtime; if it ran, its lease runs out by its TTL"
            );
        }
    }
}

impl PostgresProvider {
    /// Ends `session` (when the statement's outcome is unknown) and waits
    /// until it has gone, then releases what the acquire won. Tries again
    /// while the store does not answer.
    async fn cancel(&self, session: Option<Session>, statement: String, won: Won) {
        let Ok(_turn) = self.inner.cancel_turns.acquire().await else {
            return;
        };
        let give_up = deadline_in(CANCEL_RETRY_FOR);
        let tries = retry_until(give_up, || {
            self.end_then_release(session, &statement, &won, give_up)
        });
        match tries.await {
            Ok(released) => {
                for key in released {
                    tracing::info!(server = %self.inner.display, key, "released the lease of an acquire that had no answer");
                }
            }
            Err(e) => {
                tracing::warn!(server = %self.inner.display, error = %e, "could not cancel an acquire that had no answer; if it ran, its lease runs out by its TTL");
            }
        }
    }

    /// One try of [`cancel`](Self::cancel): the keys released.
    async fn end_then_release(
        &self,
        session: Option<Session>,
        statement: &str,
        won: &Won,
        give_up: tokio::time::Instant,
    ) -> lease_api::Result<Vec<String>> {
        // Signalled again on each look: a session in the middle of a commit
        // ends once the commit is done. Only while it is idle (the statement
        // still on its way), runs the statement, or does not say: a session
        // that runs something else is no longer ours (a pooler gave it to
        // another client once the statement was over).
        if let Some(session) = session {
            let gone = || async {
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
                Ok(alive.is_none())
            };
            poll_until("cancel (the session did not end)", GONE_POLL, give_up, gone).await?;
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
                    let sql = if matches!(won, Won::Reader(..)) {
                        &self.inner.sql.rw.release_reader_owned
                    } else {
                        &self.inner.sql.rw.release_writer_owned
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
