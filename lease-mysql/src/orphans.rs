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
//! the acquire won is released. An acquire whose answer came but never
//! reached its caller (the answer could not be read) releases what it won
//! too, without a kill.
//!
//! A session is told by its connection id, the server's name and the
//! client's address, and killed only from a connection to the same server,
//! only while it sleeps (the statement still on its way) or runs the
//! statement: behind a pooler that shares server sessions between clients,
//! one that runs something else is no longer ours.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use lease_api::backend::{deadline_in, poll_until, retry_until, spawn_tracked};

use crate::MysqlProvider;
use crate::conns::{SERVER_NAME, Session, in_step};

/// How long a cancel keeps trying while the store does not answer, or the
/// session does not go. A cancel that gives up leaves at most one lease,
/// which runs out by its TTL.
const CANCEL_RETRY_FOR: Duration = Duration::from_secs(600);

/// The first wait between looks at whether a killed session has gone; it
/// doubles up to a second.
const GONE_POLL: Duration = Duration::from_millis(20);

/// An acquire statement on its way. Dropped before its caller has the
/// answer, it cancels the acquire in the background (see the module docs).
pub(crate) struct Flight<'a> {
    provider: &'a MysqlProvider,
    /// The statement's text, to tell it on the server.
    statement: &'a str,
    key: &'a str,
    owner: &'a str,
    stage: Mutex<Stage>,
}

/// Where an acquire statement stands.
#[derive(Clone, Debug)]
enum Stage {
    /// Not sent, or settled: the caller has the answer, or the statement
    /// was undone (the server answered with an error).
    Quiet,
    /// Sent on this session, no answer yet: its outcome is unknown.
    Sent(Session),
    /// Answered, not yet handed to the caller.
    Answered,
}

/// Where the session an acquire was sent on stands, seen from a connection.
enum Standing {
    /// Gone, or running something else (behind a pooler): nothing of the
    /// acquire can still run on it.
    Over,
    /// Sleeping (the statement still on its way) or running the statement:
    /// killed by this look.
    Killed,
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
            stage: Mutex::new(Stage::Quiet),
        }
    }

    fn set(&self, stage: Stage) {
        *self.stage.lock().unwrap_or_else(PoisonError::into_inner) = stage;
    }

    /// The statement is about to be sent on `session`.
    pub(crate) fn sent(&self, session: &Session) {
        self.set(Stage::Sent(session.clone()));
    }

    /// The statement ended with `result`. With an answer, it is answered;
    /// with an ordinary error from the server, it was undone. Anything else
    /// (an I/O error, the session killed or timed out) leaves its outcome
    /// unknown, as a timeout does.
    pub(crate) fn answered<T>(&self, result: &Result<T, sqlx::Error>) {
        match result {
            Ok(_) => self.set(Stage::Answered),
            Err(e) if in_step(e) => self.set(Stage::Quiet),
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
        let stage = self.stage.get_mut().unwrap_or_else(PoisonError::into_inner);
        let session = match std::mem::replace(stage, Stage::Quiet) {
            Stage::Quiet => return,
            Stage::Sent(session) => Some(session),
            Stage::Answered => None,
        };
        let provider = self.provider.clone();
        let (statement, key, owner) = (
            self.statement.to_owned(),
            self.key.to_owned(),
            self.owner.to_owned(),
        );
        let work = async move { provider.cancel(session, statement, key, owner).await };
        if !spawn_tracked(&self.provider.inner.cleanups, work) {
            tracing::warn!(
                "an acquire without its answer could not be cancelled outside a runtime; if it ran, its lease runs out by its TTL"
            );
        }
    }
}

/// Whether `info` (a session's statement, as the process list shows it) is
/// `statement`: the same text, or, where the server shows a prepared
/// statement with its values in place, the same text up to its first value.
fn same_statement(info: &str, statement: &str) -> bool {
    info == statement
        || statement
            .split_once('?')
            .is_some_and(|(head, _)| !head.is_empty() && info.starts_with(head))
}

impl MysqlProvider {
    /// Kills `session` (when the statement's outcome is unknown) and waits
    /// until it has gone, then releases what the acquire won. Tries again
    /// while the store does not answer.
    async fn cancel(
        &self,
        session: Option<Session>,
        statement: String,
        key: String,
        owner: String,
    ) {
        let Ok(_turn) = self.inner.cancel_turns.acquire().await else {
            return;
        };
        let give_up = deadline_in(CANCEL_RETRY_FOR);
        let tries = retry_until(give_up, || {
            self.end_then_release(session.as_ref(), &statement, &key, &owner, give_up)
        });
        match tries.await {
            Ok(true) => {
                tracing::info!(server = %self.inner.display, key, "released the lease of an acquire that had no answer");
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(server = %self.inner.display, error = %e, "could not cancel an acquire that had no answer; if it ran, its lease runs out by its TTL");
            }
        }
    }

    /// One try of [`cancel`](Self::cancel): whether a lease was released.
    async fn end_then_release(
        &self,
        session: Option<&Session>,
        statement: &str,
        key: &str,
        owner: &str,
        give_up: tokio::time::Instant,
    ) -> lease_api::Result<bool> {
        if let Some(session) = session {
            let gone = || async {
                Ok(match self.kill_if_ours(session, statement).await? {
                    Standing::Over => true,
                    Standing::Killed => false,
                    Standing::Elsewhere => {
                        // The statement's own limits end it: MariaDB's
                        // statement limit, InnoDB's lock wait (whole
                        // seconds, at least 1).
                        let limit = self.inner.response_timeout.max(Duration::from_secs(1));
                        tokio::time::sleep(limit * 2).await;
                        true
                    }
                })
            };
            poll_until("cancel (the session did not end)", GONE_POLL, give_up, gone).await?;
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

    /// Looks at `session` and, where it is still ours, kills it, both on
    /// one connection (so on one server).
    async fn kill_if_ours(
        &self,
        session: &Session,
        statement: &str,
    ) -> lease_api::Result<Standing> {
        let look = format!(
            "SELECT {SERVER_NAME} = ?, p.COMMAND, p.INFO
               FROM (SELECT 1) AS one
               LEFT JOIN information_schema.PROCESSLIST AS p ON p.ID = ? AND p.HOST <=> ?"
        );
        let kill = format!("KILL CONNECTION {}", session.id);
        self.bounded("cancel", async {
            let mut c = self.inner.conns.checkout().await?;
            let r = sqlx::query_as::<_, (i64, Option<String>, Option<String>)>(&look)
                .bind(&session.server)
                .bind(session.id)
                .bind(&session.client)
                .fetch_one(c.conn())
                .await;
            let standing = match &r {
                Err(_) => None,
                Ok((0, _, _)) => Some(Standing::Elsewhere),
                Ok((_, None, _)) => Some(Standing::Over),
                Ok((_, Some(command), info)) => {
                    let ours = command == "Sleep"
                        || info
                            .as_deref()
                            .is_some_and(|i| same_statement(i, statement));
                    Some(if ours {
                        Standing::Killed
                    } else {
                        Standing::Over
                    })
                }
            };
            let r = match (r, standing) {
                (Ok(_), Some(Standing::Killed)) => {
                    match sqlx::query(&kill).execute(c.conn()).await {
                        // 1094: no such session, gone meanwhile.
                        Err(e) if crate::error::error_number(&e) == Some(1094) => {
                            Ok(Standing::Over)
                        }
                        Err(e) => Err(e),
                        Ok(_) => Ok(Standing::Killed),
                    }
                }
                (Ok(_), Some(s)) => Ok(s),
                (Err(e), _) => Err(e),
                (Ok(_), None) => Ok(Standing::Over),
            };
            c.done(&r);
            r
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::same_statement;

    #[test]
    fn a_statement_is_known_by_its_text_or_its_text_up_to_its_first_value() {
        let s = "INSERT INTO t (a, b) VALUES (?, ?)";
        assert!(same_statement(s, s));
        assert!(same_statement("INSERT INTO t (a, b) VALUES ('x', 1)", s));
        assert!(!same_statement("UPDATE t SET a = 1", s));
        assert!(!same_statement("", s));
        assert!(!same_statement("anything", "?"));
    }
}
