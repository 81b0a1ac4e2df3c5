//! The fenced sink: the resource the workers protect, independent of the
//! lease store. It accepts a write only when its token is greater than every
//! token it accepted before (or equal, from the grant that wrote it), and
//! records every attempt with its receive time. It also hears which workers
//! believe they hold the key, so the nemesis can aim at a holder, and tells the
//! workers when the run is over.
//!
//! The protocol is one line per request, one line per answer, over TCP on
//! loopback:
//! - `W worker inc grant seq token valid valid_until` → `A` (accepted) or
//!   `R` (refused);
//! - `Q worker inc grant seq token epoch valid valid_until`, a reader's read
//!   (C19) → `A` when no writer newer than the reader's writer epoch has
//!   written, else `R`. An admitted read raises the bar for writers: a write
//!   needs a token above every reader token that read (a writer from before
//!   a reader, come back from a pause, is refused), as `FenceGate::read` does;
//! - `H worker inc grant token long` (holding) and `E worker inc grant` (done)
//!   → `K`, or `S` once the run is over.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use crate::history::{GrantId, SinkRecord, mono_ns};

/// A worker that says it holds the key.
#[derive(Clone, Copy, Debug)]
pub struct Holding {
    /// Its grant.
    pub id: GrantId,
    /// Held by a renewing guard beyond the TTL.
    pub long: bool,
    /// When it said so.
    pub since: u64,
}

#[derive(Default)]
struct State {
    records: Vec<SinkRecord>,
    last: Option<(u64, GrantId)>,
    /// The highest reader token admitted to read.
    read_high: Option<u64>,
    holding: HashMap<u32, Holding>,
    grants: u64,
    stopping: bool,
}

/// A running sink; dropping it stops accepting connections.
pub struct Sink {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Sink {
    /// Starts a sink on a loopback port. `fenced: false` accepts every write
    /// (to show what the fence prevents).
    pub async fn start(fenced: bool) -> std::io::Result<Sink> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State::default()));
        let shared = Arc::clone(&state);
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let state = Arc::clone(&shared);
                tokio::spawn(async move {
                    let _ = serve(conn, state, fenced).await;
                });
            }
        });
        Ok(Sink { addr, state, task })
    }

    /// Where workers connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Grants the workers reported so far.
    pub fn grants(&self) -> u64 {
        self.state.lock().map(|s| s.grants).unwrap_or(0)
    }

    /// Workers that say they hold the key now, newest first.
    pub fn holders(&self) -> Vec<Holding> {
        let mut v: Vec<Holding> = self
            .state
            .lock()
            .map(|s| s.holding.values().copied().collect())
            .unwrap_or_default();
        v.sort_by_key(|h| std::cmp::Reverse(h.since));
        v
    }

    /// Forgets what `worker` said it held (it was killed).
    pub fn forget(&self, worker: u32) {
        if let Ok(mut s) = self.state.lock() {
            s.holding.remove(&worker);
        }
    }

    /// Ends the run: workers are told to stop at their next report.
    pub fn stop(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.stopping = true;
        }
    }

    /// Every write received so far, in receive order.
    pub fn records(&self) -> Vec<SinkRecord> {
        self.state
            .lock()
            .map(|s| s.records.clone())
            .unwrap_or_default()
    }
}

fn field(parts: &[&str], i: usize) -> Option<u64> {
    parts.get(i).and_then(|p| p.parse().ok())
}

fn grant_id(parts: &[&str]) -> Option<GrantId> {
    Some(GrantId {
        worker: u32::try_from(field(parts, 1)?).ok()?,
        inc: u32::try_from(field(parts, 2)?).ok()?,
        grant: field(parts, 3)?,
    })
}

async fn serve(conn: TcpStream, state: Arc<Mutex<State>>, fenced: bool) -> std::io::Result<()> {
    let _ = conn.set_nodelay(true);
    let (r, mut w) = conn.into_split();
    let mut lines = BufReader::new(r).lines();
    while let Some(line) = lines.next_line().await? {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let answer = {
            let Ok(mut s) = state.lock() else {
                return Ok(());
            };
            // Stamped under the lock: receive times follow the order in
            // which the fence decided.
            answer(&mut s, &parts, mono_ns(), fenced)
        };
        let Some(answer) = answer else {
            return Ok(()); // not our protocol: hang up
        };
        w.write_all(answer).await?;
    }
    Ok(())
}

fn answer(s: &mut State, parts: &[&str], recv: u64, fenced: bool) -> Option<&'static [u8]> {
    let id = grant_id(parts)?;
    match *parts.first()? {
        "W" => {
            let (seq, token, valid) = (field(parts, 4)?, field(parts, 5)?, field(parts, 6)?);
            let valid_until = field(parts, 7).unwrap_or(0);
            let accepted = !fenced
                || (match s.last {
                    None => true,
                    Some((t, by)) => token > t || (token == t && by == id),
                } && s.read_high.is_none_or(|r| token >= r));
            if accepted {
                s.last = Some((token, id));
            }
            s.records.push(SinkRecord {
                id,
                seq,
                token,
                valid_at_send: valid == 1,
                valid_until,
                recv,
                accepted,
                read: false,
            });
            Some(if accepted { b"A\n" } else { b"R\n" })
        }
        "Q" => {
            let (seq, token, epoch) = (field(parts, 4)?, field(parts, 5)?, field(parts, 6)?);
            let valid = field(parts, 7)?;
            let valid_until = field(parts, 8).unwrap_or(0);
            let accepted = !fenced || s.last.is_none_or(|(t, _)| epoch >= t);
            if accepted {
                s.read_high = s.read_high.max(Some(token));
            }
            s.records.push(SinkRecord {
                id,
                seq,
                token,
                valid_at_send: valid == 1,
                valid_until,
                recv,
                accepted,
                read: true,
            });
            Some(if accepted { b"A\n" } else { b"R\n" })
        }
        "H" => {
            let long = field(parts, 5)? == 1;
            s.grants += 1;
            s.holding.insert(
                id.worker,
                Holding {
                    id,
                    long,
                    since: recv,
                },
            );
            Some(if s.stopping { b"S\n" } else { b"K\n" })
        }
        "E" => {
            if s.holding.get(&id.worker).is_some_and(|h| h.id == id) {
                s.holding.remove(&id.worker);
            }
            Some(if s.stopping { b"S\n" } else { b"K\n" })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(s: &mut State, l: &str, fenced: bool) -> &'static [u8] {
        let parts: Vec<&str> = l.split_whitespace().collect();
        answer(s, &parts, 0, fenced).expect("a valid line")
    }

    #[test]
    fn the_fence_refuses_a_smaller_or_foreign_equal_token() {
        let mut s = State::default();
        assert_eq!(line(&mut s, "W 1 0 1 1 10 1", true), b"A\n");
        assert_eq!(
            line(&mut s, "W 1 0 1 2 10 1", true),
            b"A\n",
            "same grant again"
        );
        assert_eq!(
            line(&mut s, "W 2 0 1 1 10 1", true),
            b"R\n",
            "equal token, other grant"
        );
        assert_eq!(line(&mut s, "W 2 0 1 2 9 0", true), b"R\n");
        assert_eq!(line(&mut s, "W 2 0 2 1 11 1", true), b"A\n");
        assert_eq!(s.records.iter().filter(|r| r.accepted).count(), 3);
    }

    /// C19 at the sink: a reader from before the newest writer is refused; a
    /// writer from before a reader that read is refused; readers share.
    #[test]
    fn reads_are_fenced_by_epoch_and_fence_older_writers() {
        let mut s = State::default();
        assert_eq!(line(&mut s, "W 1 0 1 1 10 1", true), b"A\n");
        assert_eq!(line(&mut s, "Q 2 0 1 1 11 10 1", true), b"A\n");
        assert_eq!(line(&mut s, "Q 3 0 1 1 12 10 1", true), b"A\n");
        assert_eq!(
            line(&mut s, "Q 2 0 1 2 11 10 1", true),
            b"A\n",
            "readers share"
        );
        assert_eq!(
            line(&mut s, "W 1 0 1 2 10 0", true),
            b"R\n",
            "writer 10 after readers 11 and 12 read"
        );
        assert_eq!(line(&mut s, "W 4 0 1 1 13 1", true), b"A\n");
        assert_eq!(
            line(&mut s, "Q 3 0 1 2 12 10 0", true),
            b"R\n",
            "reader of epoch 10 after writer 13 wrote"
        );
        assert_eq!(line(&mut s, "Q 5 0 1 1 14 13 1", true), b"A\n");
        let reads = s.records.iter().filter(|r| r.read).count();
        assert_eq!(reads, 5);
    }

    #[test]
    fn unfenced_accepts_everything() {
        let mut s = State::default();
        assert_eq!(line(&mut s, "W 1 0 1 1 10 1", false), b"A\n");
        assert_eq!(line(&mut s, "W 2 0 1 1 3 1", false), b"A\n");
    }

    #[test]
    fn holders_are_tracked_and_stop_is_announced() {
        let mut s = State::default();
        assert_eq!(line(&mut s, "H 3 0 1 10 1", true), b"K\n");
        assert!(s.holding.get(&3).is_some_and(|h| h.long));
        s.stopping = true;
        assert_eq!(line(&mut s, "E 3 0 1", true), b"S\n");
        assert!(s.holding.is_empty());
        assert!(answer(&mut s, &["X"], 0, true).is_none());
    }
}
