//! The connections the lease statements run on.
//!
//! sqlx's pool pings every connection when it goes back to the pool (a `Sync`
//! and its `ReadyForQuery`), unconditionally: with it, every acquire, extend and
//! release cost two round trips on the wire, one of them after the answer. These
//! slots hand out plain connections instead, so an operation is exactly its one
//! statement: the client writes one message batch (Bind, Execute, Close, Sync)
//! and reads one answer. What the release ping protected against is handled
//! here directly:
//!
//! - a connection whose statement was cut off (a timeout dropped the future, an
//!   I/O or protocol error, the server ending the session) is closed, never
//!   reused, because its protocol state is unknown;
//! - a connection that sat idle for [`PING_IF_IDLE_FOR`] is pinged before use,
//!   because only an idle one can have been cut without us noticing (a server
//!   restart, `pg_terminate_backend`, a proxy's idle timeout).
//!
//! The pool stays for what is neither hot nor one statement: LISTEN, the
//! migration, the probe and [`begin_fenced`](crate::PostgresProvider::begin_fenced).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sqlx::Connection;
use sqlx::postgres::{PgConnection, PgDatabaseError, PgSeverity};
use tokio::sync::{Mutex, MutexGuard};
use tokio::time::Instant;

use crate::hosts::Hosts;

/// A connection idle this long is pinged before it is used again.
pub(crate) const PING_IF_IDLE_FOR: Duration = Duration::from_secs(1);

struct Open {
    conn: PgConnection,
    last_used: Instant,
    /// The server session behind `conn`, read once when it was made.
    session: Session,
}

pub(crate) struct Conns {
    slots: Box<[Mutex<Option<Open>>]>,
    next: AtomicUsize,
    hosts: Arc<Hosts>,
    /// `statement_timeout` for every connection, in milliseconds.
    statement_ms: String,
}

/// One slot, checked out: its connection is taken out of the slot and only put
/// back by [`Checkout::done`]. Dropped without it (the statement's future was
/// dropped, or it failed in a way that leaves the protocol state unknown), the
/// connection is closed and the slot left empty.
pub(crate) struct Checkout<'a> {
    slot: MutexGuard<'a, Option<Open>>,
    open: Open,
}

impl Conns {
    /// `size` slots on connections made with `options`. Each statement on
    /// them is limited on the server to `statement_limit` (the provider's
    /// response timeout): when the client gives up on a statement it closes
    /// the connection, but the server does not notice while the statement
    /// waits (on a row lock, say). Without the limit, such orphans would pile
    /// up past the server's connection limit under retries, and commit late
    /// (an acquire nobody holds, announced to nobody).
    pub(crate) fn new(hosts: Arc<Hosts>, size: u32, statement_limit: Duration) -> Self {
        let size = usize::try_from(size.max(1)).unwrap_or(1);
        // With several hosts the primary may wait for a synchronous standby
        // at commit. A statement_timeout that fires during that wait makes
        // PostgreSQL report the commit as done (with only a WARNING) though
        // no standby has it: a token a promotion could hand out again. So the
        // server's limit is twice the client's, and the client gives up (and
        // hands out nothing) first.
        let statement_limit = if hosts.is_multi() {
            statement_limit * 2
        } else {
            statement_limit
        };
        let ms = statement_limit.as_millis().max(1);
        Conns {
            slots: (0..size).map(|_| Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
            hosts,
            statement_ms: ms.to_string(),
        }
    }

    /// A free slot with a live connection: an open one if any is free, else a
    /// free empty slot (connecting), else the next slot in turn (waiting).
    pub(crate) async fn checkout(&self) -> Result<Checkout<'_>, sqlx::Error> {
        let n = self.slots.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let order = || (0..n).map(move |i| &self.slots[(start + i) % n]);
        let mut slot = None;
        let mut empty = None;
        for s in order() {
            if let Ok(g) = s.try_lock() {
                if g.is_some() {
                    slot = Some(g);
                    break;
                }
                if empty.is_none() {
                    empty = Some(g);
                }
            }
        }
        let slot = match slot.or(empty) {
            Some(g) => g,
            None => self.slots[start].lock().await,
        };
        let mut slot = slot;
        let mut open = slot.take();
        if let Some(o) = open.as_mut()
            && o.last_used.elapsed() >= PING_IF_IDLE_FOR
            && o.conn.ping().await.is_err()
        {
            open = None;
        }
        let open = match open {
            Some(o) => o,
            None => {
                let mut conn = self
                    .hosts
                    .connect_primary(|o| {
                        o.options([("statement_timeout", self.statement_ms.as_str())])
                    })
                    .await?;
                let session = Session::of(&mut conn).await?;
                Open {
                    conn,
                    last_used: Instant::now(),
                    session,
                }
            }
        };
        Ok(Checkout { slot, open })
    }
}

impl Checkout<'_> {
    /// The connection, for one statement.
    pub(crate) fn conn(&mut self) -> &mut PgConnection {
        &mut self.open.conn
    }

    /// The server session the connection talks to.
    pub(crate) fn session(&self) -> Session {
        self.open.session
    }

    /// Hands the connection back after its statement answered with `result`:
    /// kept after a success or an ordinary database error (the protocol is in
    /// step), closed after anything else.
    pub(crate) fn done<T>(self, result: &Result<T, sqlx::Error>) {
        let keep = match result {
            Ok(_) => true,
            Err(e) => in_step(e),
        };
        let Checkout { mut slot, mut open } = self;
        if keep {
            open.last_used = Instant::now();
            *slot = Some(open);
        }
    }
}

/// Whether the connection is still in step after `e`: an ordinary error
/// from the server, which undid the statement and leaves the session as it
/// was. Not after a FATAL or PANIC error (the session ends whatever its
/// code), an admin shutdown or connection error (57P*, 08*), or 25006 (a
/// read-only transaction, on a primary demoted to a standby: the next
/// connection looks for the new primary); nor after any client-side error.
pub(crate) fn in_step(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(d) = e else {
        return false;
    };
    let fatal = d
        .try_downcast_ref::<PgDatabaseError>()
        .is_some_and(|p| matches!(p.severity(), PgSeverity::Fatal | PgSeverity::Panic));
    !fatal
        && !d
            .code()
            .is_some_and(|c| c.starts_with("57P") || c.starts_with("08") || c.as_ref() == "25006")
}

/// One server session: its process id and its start in microseconds since
/// the epoch (a process id alone may be given to a later session).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Session {
    pub(crate) pid: i32,
    pub(crate) started: i64,
}

impl Session {
    /// The session `conn` talks to.
    pub(crate) async fn of(conn: &mut PgConnection) -> Result<Self, sqlx::Error> {
        let (pid, started) = sqlx::query_as::<_, (i32, i64)>(
            "SELECT pid, (extract(epoch from backend_start) * 1000000)::bigint
               FROM pg_stat_activity WHERE pid = pg_backend_pid()",
        )
        .fetch_one(conn)
        .await?;
        Ok(Session { pid, started })
    }
}
