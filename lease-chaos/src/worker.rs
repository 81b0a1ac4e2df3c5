//! One worker process: acquire the shared key, do a short job, write the
//! result to the fenced sink with the token, release; some rounds hold the
//! lease with a renewing [`LeaseGuard`] for longer than the TTL and write
//! several times. With a read share, every round takes the key's read/write
//! lease (C19) instead: as a reader, whose job reads through the sink with its
//! writer epoch, or as the writer. Every operation goes to the worker's log, one JSON line
//! each, written before the next operation starts (a `kill -9` loses at most
//! the operation in flight).

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use leases::{
    AcquireOptions, Lease, LeaseGuard, LeaseKey, LeaseKind, LeaseProvider, StoreConfig, acquire,
    acquire_read, acquire_write,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use crate::history::{Event, GrantId, Role, WriteOutcome, instant_ns, mono_ns};

/// What a worker is told by the controller.
#[derive(Clone, Debug, clap::Args)]
pub struct WorkerArgs {
    /// The store URL (already pointed at this worker's proxies).
    #[arg(long)]
    pub url: String,
    /// The lease namespace.
    #[arg(long)]
    pub ns: String,
    /// The shared key.
    #[arg(long)]
    pub key: String,
    /// This worker's slot.
    #[arg(long)]
    pub worker: u32,
    /// The slot's process incarnation.
    #[arg(long, default_value_t = 0)]
    pub inc: u32,
    /// The sink's address.
    #[arg(long)]
    pub sink: SocketAddr,
    /// Where to append the log.
    #[arg(long)]
    pub log: PathBuf,
    /// The lease TTL.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub ttl: Duration,
    /// The job's length in a short round.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub job: Duration,
    /// The share of rounds held by a guard for longer than the TTL.
    #[arg(long)]
    pub long_share: f64,
    /// The seed of this worker's choices.
    #[arg(long)]
    pub seed: u64,
    /// Above 0, every round takes the key's read/write lease: as a reader
    /// with this probability, else as the writer.
    #[arg(long, default_value_t = 0.0)]
    pub read_share: f64,
}

/// The role `lease` was granted.
fn role_of(lease: &Lease) -> Role {
    match lease.kind() {
        LeaseKind::Read { writer_epoch } => Role::Reader {
            epoch: writer_epoch.get(),
        },
        LeaseKind::Write => Role::Writer,
        LeaseKind::Exclusive => Role::Exclusive,
    }
}

struct SinkConn {
    lines: tokio::io::Lines<BufReader<OwnedReadHalf>>,
    w: OwnedWriteHalf,
}

impl SinkConn {
    /// Sends one line, returns the answer (`None`: the sink is gone).
    async fn ask(&mut self, line: String) -> Option<String> {
        self.w.write_all(line.as_bytes()).await.ok()?;
        self.lines.next_line().await.ok()?
    }
}

struct Log(std::fs::File);

impl Log {
    fn put(&mut self, e: &Event) {
        if let Ok(mut line) = serde_json::to_vec(e) {
            line.push(b'\n');
            let _ = self.0.write_all(&line);
        }
    }
}

/// Runs a worker until the sink says the run is over (or goes away).
///
/// # Errors
/// When the log cannot be opened, the sink cannot be reached or the store URL
/// or key is invalid.
pub async fn run_worker(args: WorkerArgs) -> Result<(), String> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.log)
        .map_err(|e| format!("cannot open the log {}: {e}", args.log.display()))?;
    let mut log = Log(file);
    let conn = TcpStream::connect(args.sink)
        .await
        .map_err(|e| format!("cannot reach the sink at {}: {e}", args.sink))?;
    let _ = conn.set_nodelay(true);
    let (r, w) = conn.into_split();
    let mut sink = SinkConn {
        lines: BufReader::new(r).lines(),
        w,
    };
    let request = (args.ttl / 2).max(Duration::from_millis(500));
    let provider = StoreConfig::new(args.url.clone())
        .namespace(args.ns.clone())
        .timeouts(Duration::from_secs(2), request)
        .build()
        .map_err(|e| e.to_string())?;
    let key = LeaseKey::new(&args.key).map_err(|e| e.to_string())?;
    let mut rng = StdRng::seed_from_u64(
        args.seed ^ (u64::from(args.worker) << 32) ^ u64::from(args.inc).rotate_left(48),
    );
    let mut grant = 0u64;
    loop {
        let rw = args.read_share > 0.0;
        let reader = rw && rng.random_bool(args.read_share.clamp(0.0, 1.0));
        let options = AcquireOptions::ttl(args.ttl).wait(args.ttl * 3);
        let invoke = mono_ns();
        let got = if reader {
            acquire_read(&provider, &key, options).await
        } else if rw {
            acquire_write(&provider, &key, options).await
        } else {
            acquire(&provider, &key, options).await
        };
        let lease = match got {
            Ok(Some(lease)) => lease,
            other => {
                let error = match other {
                    Err(e) => e.to_string(),
                    _ => "the wait ran out".to_string(),
                };
                log.put(&Event::AcquireFailed {
                    worker: args.worker,
                    inc: args.inc,
                    invoke,
                    done: mono_ns(),
                    error,
                });
                // Still running? (A stopped run answers S to a ping.)
                let ping = format!("E {} {} 0\n", args.worker, args.inc);
                if sink.ask(ping).await.as_deref() != Some("K") {
                    return Ok(());
                }
                continue;
            }
        };
        grant += 1;
        let id = GrantId {
            worker: args.worker,
            inc: args.inc,
            grant,
        };
        let long = rng.random_bool(args.long_share.clamp(0.0, 1.0));
        log.put(&Event::Grant {
            id,
            invoke,
            ok: mono_ns(),
            token: lease.token().get(),
            valid_until: instant_ns(lease.valid_until()),
            long,
            role: role_of(&lease),
        });
        let said = format!(
            "H {} {} {} {} {}\n",
            id.worker,
            id.inc,
            id.grant,
            lease.token().get(),
            u8::from(long)
        );
        let stop = sink.ask(said).await.as_deref() != Some("K");
        let gone = if long && !stop {
            let hold = args.ttl.mul_f64(rng.random_range(1.2..2.0));
            hold_long(&provider, lease, id, hold, args.ttl, &mut sink, &mut log).await
        } else {
            tokio::time::sleep(args.job).await;
            let gone = write(&mut sink, &mut log, id, 1, &lease, lease.is_valid()).await;
            let invoke = mono_ns();
            let ok = provider.release(&lease).await.is_ok();
            log.put(&Event::Release {
                id,
                invoke,
                done: mono_ns(),
                valid_until: instant_ns(lease.valid_until()),
                ok,
            });
            gone
        };
        let done = format!("E {} {} {}\n", id.worker, id.inc, id.grant);
        if stop || gone || sink.ask(done).await.as_deref() != Some("K") {
            return Ok(());
        }
    }
}

/// Writes the job's result under `lease` (a reader reads instead), the
/// worker believing it `valid`; true when the sink is gone.
async fn write(
    sink: &mut SinkConn,
    log: &mut Log,
    id: GrantId,
    seq: u64,
    lease: &Lease,
    valid: bool,
) -> bool {
    let invoke = mono_ns();
    let valid_until = instant_ns(lease.valid_until());
    let (id_s, token, valid_s) = (
        format!("{} {} {} {seq}", id.worker, id.inc, id.grant),
        lease.token().get(),
        u8::from(valid),
    );
    let read = lease.kind().is_read();
    let line = match lease.kind() {
        LeaseKind::Read { writer_epoch } => format!(
            "Q {id_s} {token} {} {valid_s} {valid_until}\n",
            writer_epoch.get()
        ),
        _ => format!("W {id_s} {token} {valid_s} {valid_until}\n"),
    };
    let answer = sink.ask(line).await;
    let outcome = match answer.as_deref() {
        Some("A") => WriteOutcome::Accepted,
        Some("R") => WriteOutcome::Refused,
        _ => WriteOutcome::Error,
    };
    log.put(&Event::Write {
        id,
        seq,
        token: lease.token().get(),
        valid_at_send: valid,
        valid_until,
        invoke,
        done: mono_ns(),
        outcome,
        read,
    });
    outcome == WriteOutcome::Error
}

/// A long round: a renewing guard holds the lease for `hold`, the job writes
/// every quarter TTL until the hold ends or the lost signal fires.
async fn hold_long(
    provider: &Arc<dyn LeaseProvider>,
    lease: Lease,
    id: GrantId,
    hold: Duration,
    ttl: Duration,
    sink: &mut SinkConn,
    log: &mut Log,
) -> bool {
    let started = tokio::time::Instant::now();
    let guard = LeaseGuard::new(Arc::clone(provider), lease);
    let lost_at = Arc::new(AtomicU64::new(0));
    let watcher = {
        let (token, at) = (guard.lost_token(), Arc::clone(&lost_at));
        tokio::spawn(async move {
            token.cancelled().await;
            at.store(mono_ns(), Ordering::SeqCst);
        })
    };
    let mut seq = 0;
    let gone = loop {
        tokio::time::sleep(ttl / 4).await;
        seq += 1;
        let current = guard.lease();
        // The job does not look at the lost signal before writing: like a
        // process paused mid-job, it sends what it computed, and the fence
        // decides. Its belief at send time is logged.
        let valid = current.is_valid() && !guard.is_lost();
        let gone = write(sink, log, id, seq, &current, valid).await;
        if gone || guard.is_lost() || started.elapsed() >= hold {
            break gone;
        }
    };
    watcher.abort();
    let at = lost_at.load(Ordering::SeqCst);
    if at != 0 || guard.is_lost() {
        let reason = guard
            .lost_reason()
            .map_or_else(|| "lost".to_string(), |r| r.to_string());
        log.put(&Event::Lost {
            id,
            at: if at == 0 { mono_ns() } else { at },
            reason,
        });
    }
    let valid_until = instant_ns(guard.lease().valid_until());
    let invoke = mono_ns();
    let ok = guard.release().await.is_ok();
    log.put(&Event::Release {
        id,
        invoke,
        done: mono_ns(),
        valid_until,
        ok,
    });
    gone
}
