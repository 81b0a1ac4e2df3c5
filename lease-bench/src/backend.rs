//! One backend's benchmark, run in its own process: operation latencies
//! against the raw store commands and the peer lock, round trips on the
//! wire, handoff, contention and many held leases.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use leases::{
    AcquireOptions, LeaseGuard, LeaseKey, LeaseProvider, Result as LeaseResult, Store, TryAcquire,
    acquire,
};
use tokio::time::Instant;

use crate::contention::contention;
use crate::measure::{Counting, peak_rss_mib, proc_cpu_seconds};
use crate::results::{BackendResult, Many, RoundTrips, stats};
use crate::stores::{key, store_url};
use crate::{across, proxy, raw};

/// A progress bar on stderr.
pub(crate) struct Progress {
    pub(crate) done: usize,
    pub(crate) total: usize,
}

impl Progress {
    fn step(&mut self, what: &str) {
        self.done += 1;
        let width = 30;
        let filled = (width * self.done / self.total.max(1)).min(width);
        eprint!(
            "\r[{}{}] {:>3}/{} {:<48}",
            "#".repeat(filled),
            ".".repeat(width - filled),
            self.done,
            self.total,
            what
        );
        if self.done == self.total {
            eprintln!();
        }
    }
}

/// How many keys the uncontended rounds cycle through.
const REUSED_KEYS: usize = 16;

pub(crate) struct Sizes {
    pub(crate) ops: usize,
    pub(crate) handoffs: usize,
    pub(crate) contention: Duration,
    pub(crate) many: Vec<usize>,
    pub(crate) many_for: Duration,
}

pub(crate) async fn bench_backend(
    name: &str,
    sizes: &Sizes,
    progress: &mut Progress,
) -> LeaseResult<BackendResult> {
    let store = Store::parse(&store_url(name))?;
    let ns = format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let memory = leases::MemoryStore::new();
    let build = || -> LeaseResult<Arc<dyn LeaseProvider>> {
        if store == Store::Memory {
            Ok(Arc::new(memory.provider(&ns)?))
        } else {
            store.build(&ns, Duration::from_secs(2), Duration::from_secs(5))
        }
    };
    let p = build()?;
    let ttl = p.capabilities().practical_ttl(Duration::from_secs(10));
    let mut r = BackendResult {
        backend: name.into(),
        ..BackendResult::default()
    };
    // Warm up connections, scripts, tables and the reused keys.
    for i in 0..REUSED_KEYS {
        if let Some(l) = p
            .try_acquire(&key("uncontended", i), ttl)
            .await?
            .into_lease()
        {
            p.release(&l).await?;
        }
    }

    progress.step(&format!("{name}: acquire, extend, release"));
    let (mut acq, mut ext, mut rel, mut both) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // Keys are reused, as a service's resources are (a settlement batch, a
    // cron slice); each is free again when its turn comes.
    for i in 0..sizes.ops {
        let k = key("uncontended", i % REUSED_KEYS);
        let t = Instant::now();
        let lease = p
            .try_acquire(&k, ttl)
            .await?
            .into_lease()
            .ok_or_else(|| leases::LeaseError::protocol("held"))?;
        let t1 = Instant::now();
        let lease = p.extend(&lease, ttl).await?;
        let t2 = Instant::now();
        p.release(&lease).await?;
        let t3 = Instant::now();
        acq.push(t1 - t);
        ext.push(t2 - t1);
        rel.push(t3 - t2);
        both.push((t1 - t) + (t3 - t2));
    }
    r.acquire = stats(&acq);
    r.extend = stats(&ext);
    r.release = stats(&rel);
    r.acquire_release = stats(&both);

    progress.step(&format!("{name}: raw store commands"));
    if let Some(mut raw) = raw::raw_for(name, &store).await? {
        r.raw_name = Some(raw.name().into());
        let (mut acq, mut ext, mut rel) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..sizes.ops {
            let k = format!("{ns}-raw-{}", i % REUSED_KEYS);
            let t = Instant::now();
            raw.acquire(&k, ttl).await?;
            let t1 = Instant::now();
            raw.extend(&k, ttl).await?;
            let t2 = Instant::now();
            raw.release(&k).await?;
            let t3 = Instant::now();
            acq.push(t1 - t);
            ext.push(t2 - t1);
            rel.push(t3 - t2);
        }
        let both: Vec<Duration> = acq.iter().zip(&rel).map(|(a, b)| *a + *b).collect();
        r.raw_acquire = Some(stats(&acq));
        r.raw_extend = Some(stats(&ext));
        r.raw_release = Some(stats(&rel));
        r.raw_acquire_release = Some(stats(&both));
        progress.step(&format!("{name}: raw handoff"));
        r.raw_handoff = raw
            .handoff(&format!("{ns}-raw-handoff"), sizes.handoffs)
            .await?
            .map(|h| stats(&h));
    } else {
        progress.step(&format!("{name}: (no raw handoff)"));
    }

    progress.step(&format!("{name}: round trips on the wire"));
    // A file has no wire to count turns on.
    if !matches!(store, Store::Memory | Store::Sqlite(_)) {
        r.round_trips = Some(round_trips(name, &ns, ttl, sizes.ops.min(200)).await?);
    }

    progress.step(&format!("{name}: peer lock"));
    if let Some(mut peer) = raw::peer_for(name, &store).await? {
        r.peer_name = Some(peer.name().into());
        let mut both = Vec::new();
        for i in 0..sizes.ops {
            let k = format!("{ns}-peer-{}", i % REUSED_KEYS);
            let t = Instant::now();
            peer.lock(&k).await?;
            peer.unlock(&k).await?;
            both.push(t.elapsed());
        }
        r.peer_acquire_release = Some(stats(&both));
        progress.step(&format!("{name}: peer handoff"));
        r.peer_handoff = Some(stats(
            &peer
                .handoff(&format!("{ns}-peer-handoff"), sizes.handoffs)
                .await?,
        ));
    } else {
        progress.step(&format!("{name}: (no peer)"));
    }

    progress.step(&format!("{name}: handoff"));
    let waiter_p = build()?;
    let mut hand = Vec::new();
    let hk = key("handoff", 0);
    for _ in 0..sizes.handoffs {
        let held = p
            .try_acquire(&hk, ttl)
            .await?
            .into_lease()
            .ok_or_else(|| leases::LeaseError::protocol("held"))?;
        let (w, k) = (Arc::clone(&waiter_p), hk.clone());
        let waiter = tokio::spawn(async move {
            let got = acquire(
                &w,
                &k,
                AcquireOptions::ttl(ttl).wait(Duration::from_secs(30)),
            )
            .await;
            (Instant::now(), got)
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        let t0 = Instant::now();
        p.release(&held).await?;
        let (t1, got) = waiter
            .await
            .map_err(|e| leases::LeaseError::protocol(e.to_string()))?;
        let lease = got?.ok_or_else(|| leases::LeaseError::protocol("waiter gave up"))?;
        hand.push(t1 - t0);
        waiter_p.release(&lease).await?;
    }
    r.handoff = stats(&hand);

    for keys in [1usize, 64] {
        progress.step(&format!("{name}: contention, 64 tasks on {keys} key(s)"));
        r.contention.push(
            contention(
                &p,
                &format!("contention-{keys}"),
                keys,
                ttl,
                sizes.contention,
            )
            .await?,
        );
    }

    if store == Store::Memory {
        // The in-memory store lives in one process.
        progress.step(&format!("{name}: (no contention across processes)"));
    } else {
        progress.step(&format!("{name}: contention, 64 tasks in 8 processes"));
        r.contention.push(
            across::contention(name, &ns, "contention-procs", 1, 8, ttl, sizes.contention).await?,
        );
        if matches!(store, Store::Sqlite(_)) {
            r.raw_contention.push(
                across::contention(
                    "flock",
                    &ns,
                    "contention-procs",
                    1,
                    8,
                    ttl,
                    sizes.contention,
                )
                .await?,
            );
        }
    }

    for &n in &sizes.many {
        progress.step(&format!("{name}: {n} held leases"));
        match many(&p, n, sizes.many_for).await {
            Ok(m) => r.many.push(m),
            Err(e) => r.errors.push(format!("{n} held leases: {e}")),
        }
    }
    r.peak_rss_mib = peak_rss_mib();
    Ok(r)
}

/// Acquire, extend and release of `n` keys each, through proxies that count
/// turns on the wire; ours and the raw floor.
async fn round_trips(name: &str, ns: &str, ttl: Duration, n: usize) -> LeaseResult<RoundTrips> {
    let (url, proxies) = proxy::proxied(&store_url(name)).await?;
    let store = Store::parse(&url)?;
    let p = store.build(
        &format!("{ns}-rt"),
        Duration::from_secs(2),
        Duration::from_secs(5),
    )?;
    let keys: Vec<LeaseKey> = (0..n).map(|i| key("rt", i)).collect();
    // Warm up: connections, scripts, statements, the table, and every key
    // (a key's first use costs more on ZooKeeper: its key node is created
    // once, see "first use" in the report).
    let mut first_use = 0.0;
    for k in &keys {
        let t = proxy::turns_per_node(&proxies);
        let got = p.try_acquire(k, ttl).await?.into_lease();
        first_use += proxy::turns_per_node(&proxies) - t;
        if let Some(l) = got {
            p.release(&l).await?;
        }
    }
    let first_use = first_use / n.max(1) as f64;
    let per_op = |before: f64| (proxy::turns_per_node(&proxies) - before) / n as f64;
    let t = proxy::turns_per_node(&proxies);
    let mut leases = Vec::with_capacity(n);
    for k in &keys {
        leases.push(
            p.try_acquire(k, ttl)
                .await?
                .into_lease()
                .ok_or_else(|| leases::LeaseError::protocol("held"))?,
        );
    }
    let acquire = per_op(t);
    let t = proxy::turns_per_node(&proxies);
    for l in &mut leases {
        *l = p.extend(l, ttl).await?;
    }
    let extend = per_op(t);
    let t = proxy::turns_per_node(&proxies);
    for l in &leases {
        p.release(l).await?;
    }
    let release = per_op(t);
    let raw = match raw::raw_for(name, &store).await? {
        Some(mut raw) => {
            let raw_keys: Vec<String> = (0..n).map(|i| format!("{ns}-rt-raw-{i}")).collect();
            for k in &raw_keys {
                raw.acquire(k, ttl).await?;
                raw.release(k).await?;
            }
            let mut out = [0.0; 3];
            for (phase, slot) in out.iter_mut().enumerate() {
                let t = proxy::turns_per_node(&proxies);
                for k in &raw_keys {
                    match phase {
                        0 => raw.acquire(k, ttl).await?,
                        1 => raw.extend(k, ttl).await?,
                        _ => raw.release(k).await?,
                    }
                }
                *slot = (proxy::turns_per_node(&proxies) - t) / n.max(1) as f64;
            }
            Some(out)
        }
        None => None,
    };
    Ok(RoundTrips {
        ours: [acquire, extend, release],
        first_use,
        raw,
    })
}

async fn many(p: &Arc<dyn LeaseProvider>, n: usize, hold_for: Duration) -> LeaseResult<Many> {
    let counting = Arc::new(Counting::new(Arc::clone(p)));
    let ttl = p.capabilities().practical_ttl(Duration::from_secs(6));
    let mut guards = Vec::with_capacity(n);
    let mut failed = 0;
    for chunk in (0..n).collect::<Vec<_>>().chunks(64) {
        let leases = futures_util::future::join_all(chunk.iter().map(|&i| {
            let c = Arc::clone(&counting);
            async move { c.try_acquire(&key("many", i), ttl).await }
        }))
        .await;
        for l in leases {
            match l {
                Ok(TryAcquire::Acquired(l)) => guards.push(LeaseGuard::new(
                    Arc::clone(&counting) as Arc<dyn LeaseProvider>,
                    l,
                )),
                _ => failed += 1,
            }
        }
    }
    let cpu0 = proc_cpu_seconds();
    counting.hook().extends.store(0, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(hold_for).await;
    let secs = started.elapsed().as_secs_f64();
    let renewals = counting.hook().extends.load(Ordering::Relaxed) as f64;
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    let cpu = proc_cpu_seconds() - cpu0;
    let period = (ttl / 3).as_secs_f64();
    for g in guards {
        let _ = g.release().await;
    }
    Ok(Many {
        leases: n - failed,
        seconds: secs,
        renewals_per_sec: renewals / secs,
        store_calls_per_renewal_period: renewals / secs * period,
        lost,
        cpu_seconds: cpu,
        peak_rss_mib: peak_rss_mib(),
    })
}
