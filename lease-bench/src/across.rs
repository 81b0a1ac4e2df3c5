//! Contention across processes: the same 64 tasks, spread over several
//! copies of this program that share one store (and, for SQLite, one file),
//! the way cron jobs or workers on one host compete. Also the one-host floor
//! for it: the same loop over `flock(2)` on one lock file.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leases::{LeaseProvider, Result as LeaseResult, Store};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::common::err;
use crate::results::Contention;

pub use crate::common::DIR_ENV;

/// What one child process runs.
#[derive(Debug, Serialize, Deserialize)]
pub struct Spec {
    /// A backend name of `store_url`, or `flock` for the floor.
    pub backend: String,
    pub namespace: String,
    pub prefix: String,
    pub keys: usize,
    /// Task numbers of this process (the key of task t is t % keys).
    pub first_task: usize,
    pub tasks: usize,
    pub ttl_ms: u64,
    /// Every process starts and stops on the same wall-clock instants.
    pub start_unix_ms: u64,
    pub stop_unix_ms: u64,
}

/// What one child process counted.
#[derive(Debug, Serialize, Deserialize)]
pub struct Counted {
    pub acquisitions: u64,
    pub longest_wait_us: u64,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The monotonic instant of a wall-clock time in this process.
fn instant_of(unix_ms_at: u64) -> Instant {
    Instant::now() + Duration::from_millis(unix_ms_at.saturating_sub(unix_ms()))
}

/// `processes` copies of this program, 64 tasks in all, on `backend` (or
/// `flock`), for `run_for`.
pub async fn contention(
    backend: &str,
    namespace: &str,
    prefix: &str,
    keys: usize,
    processes: usize,
    ttl: Duration,
    run_for: Duration,
) -> LeaseResult<Contention> {
    let exe = std::env::current_exe().map_err(err)?;
    let per = 64 / processes.max(1);
    // Time for every child to start and connect before the common start.
    let start = unix_ms() + 2_000;
    let stop = start + u64::try_from(run_for.as_millis()).unwrap_or(u64::MAX);
    let mut children = Vec::new();
    for i in 0..processes {
        let spec = Spec {
            backend: backend.into(),
            namespace: namespace.into(),
            prefix: prefix.into(),
            keys,
            first_task: i * per,
            tasks: per,
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            start_unix_ms: start,
            stop_unix_ms: stop,
        };
        let json = std::env::temp_dir().join(format!(
            "lease-bench-contend-{}.json",
            uuid::Uuid::new_v4().simple()
        ));
        let child = tokio::process::Command::new(&exe)
            .arg("--contend-child")
            .arg(serde_json::to_string(&spec).map_err(err)?)
            .arg("--child-json")
            .arg(&json)
            .env(DIR_ENV, crate::common::sqlite_dir())
            .kill_on_drop(true)
            .spawn()
            .map_err(err)?;
        children.push((child, json));
    }
    let (mut total, mut longest) = (0, 0);
    let mut failed = None;
    for (mut child, json) in children {
        let status = child.wait().await.map_err(err)?;
        let read = std::fs::read(&json);
        let _ = std::fs::remove_file(&json);
        match read
            .ok()
            .and_then(|b| serde_json::from_slice::<Counted>(&b).ok())
        {
            Some(c) if status.success() => {
                total += c.acquisitions;
                longest = longest.max(c.longest_wait_us);
            }
            _ => failed = Some(format!("a contending process ended with {status}")),
        }
    }
    if let Some(f) = failed {
        return Err(err(f));
    }
    Ok(Contention {
        tasks: per * processes,
        processes,
        keys,
        acquisitions_per_sec: total as f64 / run_for.as_secs_f64(),
        longest_wait_ms: longest as f64 / 1000.0,
    })
}

/// The child's side: runs its tasks and returns what they counted.
pub async fn child(spec: &Spec) -> LeaseResult<Counted> {
    let start = instant_of(spec.start_unix_ms);
    let stop = instant_of(spec.stop_unix_ms);
    let (acquisitions, longest_wait_us) = if spec.backend == "flock" {
        tokio::time::sleep_until(start).await;
        flock_loop(spec, stop).await?
    } else {
        let store = Store::parse(&crate::stores::store_url(&spec.backend))?;
        let p: Arc<dyn LeaseProvider> = store.build(
            &spec.namespace,
            Duration::from_secs(2),
            Duration::from_secs(5),
        )?;
        // Connect before the start, as the in-process run does.
        p.inspect(&crate::stores::key(
            &spec.prefix,
            spec.first_task % spec.keys.max(1),
        ))
        .await?;
        tokio::time::sleep_until(start).await;
        crate::contention::contend(
            &p,
            &spec.prefix,
            spec.first_task..spec.first_task + spec.tasks,
            spec.keys,
            Duration::from_millis(spec.ttl_ms),
            stop,
        )
        .await
    };
    Ok(Counted {
        acquisitions,
        longest_wait_us,
    })
}

fn lock_path(spec: &Spec, task: usize) -> PathBuf {
    crate::common::sqlite_dir().join(format!(
        "{}-{}-{}.lock",
        spec.namespace,
        spec.prefix,
        task % spec.keys.max(1)
    ))
}

/// One thread per task, blocking in `flock(2)` on its own open file of the
/// key's lock file, as `flock(1)` does.
async fn flock_loop(spec: &Spec, stop: Instant) -> LeaseResult<(u64, u64)> {
    let stop = stop.into_std();
    let mut threads = Vec::new();
    for t in spec.first_task..spec.first_task + spec.tasks {
        let path = lock_path(spec, t);
        threads.push(tokio::task::spawn_blocking(
            move || -> LeaseResult<(u64, u64)> {
                let (mut count, mut longest) = (0u64, 0u64);
                while std::time::Instant::now() < stop {
                    let file = std::fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .create(true)
                        .truncate(false)
                        .open(&path)
                        .map_err(err)?;
                    let started = std::time::Instant::now();
                    let locked = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
                        .map_err(|(_, e)| err(e))?;
                    longest = longest
                        .max(u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX));
                    count += 1;
                    locked.unlock().map_err(|(_, e)| err(e))?;
                }
                Ok((count, longest))
            },
        ));
    }
    let (mut count, mut longest) = (0, 0);
    for t in threads {
        let (c, l) = t.await.map_err(err)??;
        count += c;
        longest = longest.max(l);
    }
    Ok((count, longest))
}
