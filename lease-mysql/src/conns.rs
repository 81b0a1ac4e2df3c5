//! The connections the lease statements run on.
//!
//! sqlx's pool pings every connection when it goes back to the pool, a
//! second round trip per operation. These slots hand out plain connections
//! instead, so an operation is exactly its one statement. What the ping
//! protected against is handled here:
//!
//! - a connection whose statement was cut off (a timeout dropped the future,
//!   an I/O or protocol error) is closed, never reused, because its protocol
//!   state is unknown;
//! - a connection that sat idle for [`PING_IF_IDLE_FOR`] is pinged before
//!   use, because only an idle one can have been cut without us noticing (a
//!   server restart, `KILL`, `wait_timeout`, a proxy's idle timeout).
//!
//! Every connection is set up with the session settings the provider relies
//! on (see [`session_setup`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sqlx::Connection;
use sqlx::mysql::MySqlConnection;

use crate::hosts::Hosts;
use tokio::sync::{Mutex, MutexGuard};
use tokio::time::Instant;

/// A connection idle this long is pinged before it is used again.
pub(crate) const PING_IF_IDLE_FOR: Duration = Duration::from_secs(1);

struct Open {
    conn: MySqlConnection,
    last_used: Instant,
    /// The server session behind `conn`, read once when it was made.
    session: Session,
}

pub(crate) struct Conns {
    slots: Box<[Mutex<Option<Open>>]>,
    next: AtomicUsize,
    hosts: Arc<Hosts>,
    setup: String,
}

/// One slot, checked out: its connection is taken out of the slot and only
/// put back by [`Checkout::done`]. Dropped without it, the connection is
/// closed and the slot left empty.
pub(crate) struct Checkout<'a> {
    slot: MutexGuard<'a, Option<Open>>,
    open: Open,
}

/// The session settings every connection gets, in one statement:
///
/// - `STRICT_ALL_TABLES`: a value that does not fit is an error, never
///   silently cut (a key, a token), whatever the server's default mode;
/// - without MariaDB's `SIMULTANEOUS_ASSIGNMENT`: the acquire's
///   `ON DUPLICATE KEY UPDATE` relies on each assignment seeing the columns
///   assigned before it (see `sql::WON`);
/// - `innodb_lock_wait_timeout`: a statement waiting on a row lock (a
///   fenced transaction holding the row) gives up within the response
///   timeout (whole seconds, at least 1);
/// - on MariaDB (the `/*M! */` comment is run by MariaDB only),
///   `max_statement_time`: the server ends a statement the client has given
///   up on. MySQL has no such limit for writes. Either way an acquire left
///   without its answer is cancelled too (`orphans.rs`): the limits count
///   from the statement's arrival, after the client's timer started.
pub(crate) fn session_setup(limit: Duration) -> String {
    let lock_wait = limit.as_secs().max(1);
    let statement = limit.as_secs_f64().max(0.001);
    format!(
        "SET SESSION sql_mode = REPLACE(CONCAT(@@SESSION.sql_mode, ',STRICT_ALL_TABLES'), 'SIMULTANEOUS_ASSIGNMENT', ''), \
         innodb_lock_wait_timeout = {lock_wait} /*M!, max_statement_time = {statement:.3} */"
    )
}

impl Conns {
    pub(crate) fn new(hosts: Arc<Hosts>, size: u32, statement_limit: Duration) -> Self {
        let size = usize::try_from(size.max(1)).unwrap_or(1);
        Conns {
            slots: (0..size).map(|_| Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
            hosts,
            setup: session_setup(statement_limit),
        }
    }

    /// A free slot with a live connection: an open one if any is free, else
    /// a free empty slot (connecting), else the next slot in turn (waiting).
    pub(crate) async fn checkout(&self) -> Result<Checkout<'_>, sqlx::Error> {
        let n = self.slots.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let mut slot = None;
        let mut empty = None;
        for i in 0..n {
            if let Ok(g) = self.slots[(start + i) % n].try_lock() {
                if g.is_some() {
                    slot = Some(g);
                    break;
                }
                if empty.is_none() {
                    empty = Some(g);
                }
            }
        }
        let mut slot = match slot.or(empty) {
            Some(g) => g,
            None => self.slots[start].lock().await,
        };
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
                let mut conn = self.connect().await?;
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

    /// A new connection with the session settings, to the first host that
    /// answers and is ready.
    pub(crate) async fn connect(&self) -> Result<MySqlConnection, sqlx::Error> {
        self.hosts.connect(&self.setup).await
    }
}

impl Checkout<'_> {
    /// The connection, for one statement.
    pub(crate) fn conn(&mut self) -> &mut MySqlConnection {
        &mut self.open.conn
    }

    /// The server session the connection talks to.
    pub(crate) fn session(&self) -> &Session {
        &self.open.session
    }

    /// Hands the connection back after its statement answered with `result`:
    /// kept after a success or an ordinary database error (the protocol is
    /// in step), closed after anything else.
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
/// was. Not after 1927 (connection killed), 1053 (server shutdown),
/// 2006/2013 (gone), 1969, 1317 or 3024 (statement time exceeded, query
/// interrupted: the session lives, but the answer was an interruption,
/// which may come after the commit, so start clean), 1047 (a Galera node
/// outside the primary component: the next connection moves on), 1290,
/// 1836 or 4031 (read-only, or the session timed out); nor after any
/// client-side error.
pub(crate) fn in_step(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(_))
        && !matches!(
            crate::error::error_number(e),
            Some(1927 | 1053 | 2006 | 2013 | 1969 | 1317 | 3024 | 1047 | 1290 | 1836 | 4031)
        )
}

/// One server session: its connection id (never given again by a running
/// server) and the server's name (ids are per server; nodes of a cluster
/// hand out the same ones).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Session {
    pub(crate) id: u64,
    pub(crate) server: String,
    /// The client's address as the server sees it (`host:port` over TCP):
    /// a session given the same id after a restart has another port.
    pub(crate) client: Option<String>,
}

/// The server's name, as [`Session::server`] holds it.
pub(crate) const SERVER_NAME: &str = "CONCAT(@@hostname, ':', @@port, ':', @@server_id)";

impl Session {
    /// The session `conn` talks to.
    pub(crate) async fn of(conn: &mut MySqlConnection) -> Result<Self, sqlx::Error> {
        let (id, server, client) = sqlx::query_as::<_, (u64, String, Option<String>)>(&format!(
            "SELECT CONNECTION_ID(), {SERVER_NAME},
                    (SELECT HOST FROM information_schema.PROCESSLIST WHERE ID = CONNECTION_ID())"
        ))
        .fetch_one(conn)
        .await?;
        Ok(Session { id, server, client })
    }
}
