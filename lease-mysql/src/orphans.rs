//! Acquires whose answer never came back.
//!
//! The client gives up on a statement after the response timeout, counted
//! from before it took a connection. MariaDB's `max_statement_time` counts
//! from the statement's arrival, a little later; MySQL has no such limit for
//! writes, only InnoDB's lock wait in whole seconds; and a statement still in
//! a socket buffer when the client gave up arrives later still. A row lock
//! freed in that gap lets the acquire commit a lease nobody holds, and the
//! key stays blocked for its TTL.
//!
//! So an acquire left without its answer (timed out, its future dropped, or
//! its connection broken mid-statement) is cancelled in the background: the
//! server session it was sent on is killed and awaited, since once that
//! session is gone its statement has committed or never will; then whatever
//! the acquire won is released.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use lease_api::backend::deadline_in;

use crate::MysqlProvider;
use crate::conns::{SERVER_NAME, Session};

/// How long a cancel keeps trying while the store does not answer. A cancel
/// that gives up leaves at most one lease, which runs out by its TTL.
const CANCEL_RETRY_FOR: Duration = Duration::from_secs(600);

/// How often a cancel looks whether the killed session has gone.
const GONE_POLL: Duration = Duration::from_millis(20);

/// An acquire statement on its way: the session it was sent on, until the
/// server answered. Dropped while it has no answer, it cancels the acquire
/// in the background (see the module docs).
pub(crate) struct Flight<'a> {
    provider: &'a MysqlProvider,
    /// The statement's text, to tell it on the server.
    statement: &'a str,
    key: &'a str,
    owner: &'a str,
    sent: Mutex<Option<Session>>,
}

/// Where the session an acquire was sent on stands, seen from a connection.
enum Standing {
    /// Gone, or serving other statements (behind a pooler): nothing of the
    /// acquire can still run on it.
    Over,
    /// Idle (the statement still on its way) or running the statement.
    Ours,
    /// On another server than this connection's: it cannot be seen from here.
    Elsewhere,
}

impl<'a> Flight<'a> {
    /// An acquire of `key` for `owner` by `statement`, not sent yet.
    pub(crate) fn new(
        provider: &'a MysqlProvider,
        statement: &'a str,
        key: &'a str,
        owner: &'a str,
    ) -> Self {
        Flight {
            provider,
            statement,
            key,
            owner,
            sent: Mutex::new(None),
        }
    }

    /// The statement is about to be sent on `session`.
    pub(crate) fn sent(&self, session: &Session) {
        *self.sent.lock().unwrap_or_else(PoisonError::into_inner) = Some(session.clone());
    }

    /// The statement ended with `result`. Its outcome is known when the server
    /// answered, with rows or with an error (which undid it); an I/O or
    /// protocol error leaves it unknown, and the acquire is cancelled.
    pub(crate) fn answered<T>(&self, result: &Result<T, sqlx::Error>) {
        let settled = match result {
            Ok(_) => true,
            // 2006/2013: the server went away, not an answer.
            Err(e @ sqlx::Error::Database(_)) => {
                !matches!(crate::error::error_number(e), Some(2006 | 2013))
            }
            Err(_) => false,
        };
        if settled {
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
        let (statement, key, owner) = (
            self.statement.to_owned(),
            self.key.to_owned(),
            self.owner.to_owned(),
        );
        self.provider.inner.cleanups.spawn_on(
            async move { provider.cancel(session, statement, key, owner).await },
            &runtime,
        );
    }
}

impl MysqlProvider {
    /// Kills `session` and waits until it has gone, then releases what the
    /// acquire sent on it won. Tries again while the store does not answer.
    async fn cancel(&self, session: Session, statement: String, key: String, owner: String) {
        let give_up = deadline_in(CANCEL_RETRY_FOR);
        let mut backoff = Duration::from_millis(100);
        loop {
            match self
                .end_then_release(&session, &statement, &key, &owner)
                .await
            {
                Ok(released) => {
                    if released {
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

    /// One try of [`cancel`](Self::cancel): whether a lease was released.
    async fn end_then_release(
        &self,
        session: &Session,
        statement: &str,
        key: &str,
        owner: &str,
    ) -> lease_api::Result<bool> {
        loop {
            match self.standing(session, statement).await? {
                Standing::Over => break,
                Standing::Ours => {
                    let kill = format!("KILL CONNECTION {}", session.id);
                    self.bounded("cancel", async {
                        let mut c = self.inner.conns.checkout().await?;
                        let r = sqlx::query(&kill).execute(c.conn()).await;
                        // 1094: no such session, gone meanwhile.
                        let r = match r {
                            Err(e) if crate::error::error_number(&e) == Some(1094) => Ok(()),
                            r => r.map(drop),
                        };
                        c.done(&r);
                        r
                    })
                    .await?;
                    tokio::time::sleep(GONE_POLL).await;
                }
                Standing::Elsewhere => {
                    // The statement's own limits end it: MariaDB's statement
                    // limit, InnoDB's lock wait (whole seconds, at least 1).
                    let limit = self.inner.response_timeout.max(Duration::from_secs(1));
                    tokio::time::sleep(limit * 2).await;
                    break;
                }
            }
        }
        let done = self
            .bounded("cancel", async {
                let mut c = self.inner.conns.checkout().await?;
                let r = sqlx::query(&self.inner.sql.release_owned)
                    .bind(self.inner.namespace.as_bytes())
                    .bind(key.as_bytes())
                    .bind(owner)
                    .execute(c.conn())
                    .await;
                c.done(&r);
                r
            })
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Where `session` stands, from one of our connections.
    async fn standing(&self, session: &Session, statement: &str) -> lease_api::Result<Standing> {
        let look = format!(
            "SELECT {SERVER_NAME} = ?, p.COMMAND, p.INFO
               FROM (SELECT 1) AS one
               LEFT JOIN information_schema.PROCESSLIST AS p ON p.ID = ?"
        );
        let (here, command, info) = self
            .bounded("cancel", async {
                let mut c = self.inner.conns.checkout().await?;
                let r = sqlx::query_as::<_, (i64, Option<String>, Option<String>)>(&look)
                    .bind(&session.server)
                    .bind(session.id)
                    .fetch_one(c.conn())
                    .await;
                c.done(&r);
                r
            })
            .await?;
        Ok(if here == 0 {
            Standing::Elsewhere
        } else {
            match command.as_deref() {
                None => Standing::Over,
                Some("Sleep") => Standing::Ours,
                Some(_) if info.as_deref() == Some(statement) => Standing::Ours,
                Some(_) => Standing::Over,
            }
        })
    }
}
