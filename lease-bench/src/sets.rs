//! The sets section (docs/SETS.md): what a set of keys costs against one
//! key, per backend, and what the one-step set saves against taking the keys
//! one by one in key order.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use leases::backend::acquire_in_key_order;
use leases::{
    LeaseError, LeaseKey, LeaseProvider, Result as LeaseResult, Store, TryAcquireAll, release_all,
};
use serde::Serialize;
use tokio::time::Instant;

use crate::results::{Stats, stats};
use crate::stores::store_url;

/// One backend's figures: acquire plus release, microseconds.
#[derive(Clone, Debug, Serialize)]
pub struct SetRun {
    pub backend: String,
    pub atomic: bool,
    pub one_key: Stats,
    pub two_keys: Stats,
    pub eight_keys: Stats,
    /// Eight keys taken one by one in key order (the fallback), for
    /// comparison with the store's one step.
    pub eight_in_key_order: Stats,
    /// A reader of the key's read/write lease, acquire plus release (none
    /// where the backend has no read/write leases).
    pub read: Option<Stats>,
    /// Its writer, acquire plus release.
    pub write: Option<Stats>,
}

async fn take_set(
    p: &Arc<dyn LeaseProvider>,
    keys: &[LeaseKey],
    ttl: Duration,
    in_key_order: bool,
) -> LeaseResult<Duration> {
    let t = Instant::now();
    let taken = if in_key_order {
        acquire_in_key_order(&**p, keys, ttl).await?
    } else {
        p.try_acquire_all(keys, ttl).await?
    };
    let TryAcquireAll::Acquired(leases) = taken else {
        return Err(LeaseError::protocol("a bench key was held"));
    };
    release_all(&**p, &leases).await?;
    Ok(t.elapsed())
}

async fn measure(name: &str, ops: usize) -> LeaseResult<SetRun> {
    let store = Store::parse(&store_url(name))?;
    let ns = format!("sets-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let p: Arc<dyn LeaseProvider> = if store == Store::Memory {
        Arc::new(leases::MemoryProvider::new())
    } else {
        store.build(&ns, Duration::from_secs(2), Duration::from_secs(5))?
    };
    let ttl = p.capabilities().practical_ttl(Duration::from_secs(10));
    let keys: Vec<LeaseKey> = (0..8)
        .map(|i| LeaseKey::new(format!("set/{i}")))
        .collect::<LeaseResult<_>>()?;
    // Warm up connections, scripts and rows.
    for _ in 0..3 {
        take_set(&p, &keys, ttl, false).await?;
        take_set(&p, &keys, ttl, true).await?;
    }
    let mut one = Vec::with_capacity(ops);
    let mut two = Vec::with_capacity(ops);
    let mut eight = Vec::with_capacity(ops);
    let mut ordered = Vec::with_capacity(ops);
    let shared = p.capabilities().shared_leases;
    let (mut reads, mut writes) = (Vec::with_capacity(ops), Vec::with_capacity(ops));
    let rw_key = LeaseKey::new("set/rw")?;
    // Interleaved, so a drift of the machine's load hits every column alike.
    for _ in 0..ops {
        let t = Instant::now();
        let lease = p
            .try_acquire(&keys[0], ttl)
            .await?
            .into_lease()
            .ok_or_else(|| LeaseError::protocol("a bench key was held"))?;
        p.release(&lease).await?;
        one.push(t.elapsed());
        two.push(take_set(&p, &keys[..2], ttl, false).await?);
        eight.push(take_set(&p, &keys, ttl, false).await?);
        ordered.push(take_set(&p, &keys, ttl, true).await?);
        if shared {
            for (write, out) in [(false, &mut reads), (true, &mut writes)] {
                let t = Instant::now();
                let taken = if write {
                    p.try_acquire_write(&rw_key, ttl, None).await?
                } else {
                    p.try_acquire_read(&rw_key, ttl).await?
                };
                let lease = taken
                    .into_lease()
                    .ok_or_else(|| LeaseError::protocol("the bench's read/write key was held"))?;
                p.release(&lease).await?;
                out.push(t.elapsed());
            }
        }
    }
    let strip = |mut s: Stats| {
        s.samples_us.clear();
        s
    };
    Ok(SetRun {
        backend: name.into(),
        atomic: p.capabilities().multi_key.atomic,
        one_key: strip(stats(&one)),
        two_keys: strip(stats(&two)),
        eight_keys: strip(stats(&eight)),
        eight_in_key_order: strip(stats(&ordered)),
        read: shared.then(|| strip(stats(&reads))),
        write: shared.then(|| strip(stats(&writes))),
    })
}

/// Runs every backend and writes SETS.md and sets.json into `out`.
///
/// # Errors
/// A backend that fails, or a file that cannot be written.
pub async fn run(backends: &[String], smoke: bool, out: &Path) -> LeaseResult<()> {
    let ops = if smoke { 20 } else { 500 };
    let mut runs = Vec::new();
    for name in backends {
        eprintln!("lease-bench: sets: {name}");
        runs.push(measure(name, ops).await?);
    }
    let io = |e: std::io::Error| LeaseError::protocol(format!("writing the report: {e}"));
    std::fs::create_dir_all(out).map_err(io)?;
    let json = serde_json::to_string_pretty(&runs)
        .map_err(|e| LeaseError::protocol(format!("encoding the report: {e}")))?;
    std::fs::write(out.join("sets.json"), json).map_err(io)?;
    std::fs::write(out.join("SETS.md"), report(&runs, ops)).map_err(io)?;
    Ok(())
}

fn report(runs: &[SetRun], ops: usize) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Sets of keys and read/write leases against one key\n\n\
         Generated by `lease-bench --sets` ({ops} rounds per backend, on the loopback \
         stores of `scripts/stores`, one task, no contention). Each figure is one \
         acquire plus its release, in microseconds (p50 / p99). A set's release is \
         `release_all`: one release per key, all at once. The column of 8 keys in key order takes the same \
         eight keys one after another in key order, which is what a backend without \
         one-step sets does (and what Redis Cluster, Redlock and the advisory mode do); \
         the ratio is that against the one-step set. The read/write columns take \
         one key's read/write lease as a reader and as its writer (the ratio is against \
         the plain lease of one key).\n"
    );
    let _ = writeln!(
        s,
        "| backend | one step | 1 key | 2 keys | 8 keys | 8 keys in key order | reader | writer |\n| --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    // Sub-10 µs figures (memory) keep a decimal.
    let us = |v: f64| {
        if v < 10.0 {
            format!("{v:.1}")
        } else {
            format!("{v:.0}")
        }
    };
    for r in runs {
        let rw = |x: &Option<Stats>| match x {
            Some(x) => format!(
                "{} / {} ({:.1}x)",
                us(x.p50_us),
                us(x.p99_us),
                if r.one_key.p50_us > 0.0 {
                    x.p50_us / r.one_key.p50_us
                } else {
                    0.0
                }
            ),
            None => "-".into(),
        };
        let ratio = |x: &Stats| {
            if r.one_key.p50_us > 0.0 {
                x.p50_us / r.one_key.p50_us
            } else {
                0.0
            }
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} / {} | {} / {} ({:.1}x) | {} / {} ({:.1}x) | {} / {} ({:.1}x the one-step set) | {} | {} |",
            r.backend,
            if r.atomic { "yes" } else { "no" },
            us(r.one_key.p50_us),
            us(r.one_key.p99_us),
            us(r.two_keys.p50_us),
            us(r.two_keys.p99_us),
            ratio(&r.two_keys),
            us(r.eight_keys.p50_us),
            us(r.eight_keys.p99_us),
            ratio(&r.eight_keys),
            us(r.eight_in_key_order.p50_us),
            us(r.eight_in_key_order.p99_us),
            if r.eight_keys.p50_us > 0.0 {
                r.eight_in_key_order.p50_us / r.eight_keys.p50_us
            } else {
                0.0
            },
            rw(&r.read),
            rw(&r.write),
        );
    }
    s
}
