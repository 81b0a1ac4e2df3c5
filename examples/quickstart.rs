//! Three workers share four settlement batches through leases on the in-memory
//! store. One worker freezes past its TTL (think of a long GC pause): its guard
//! says the lease is lost, another worker takes the batch over with a higher
//! fencing token, and the frozen worker's late write is refused by the fence.
//!
//! Run: `cargo run --example quickstart`

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lease_api::{
    AcquireOptions, Capabilities, FenceGate, FencingToken, Lease, LeaseGuard, LeaseInfo, LeaseKey,
    LeaseProvider, MemoryProvider, Result, TryAcquire, acquire,
};
use tokio::time::{Instant, sleep};

const TTL: Duration = Duration::from_millis(400);
const WORK: Duration = Duration::from_millis(120);
const PAUSE: Duration = Duration::from_millis(1200);
const BATCHES: [&str; 4] = ["batch-1", "batch-2", "batch-3", "batch-4"];

/// The protected resource: a ledger that admits writes through a fence gate.
struct Ledger {
    gate: FenceGate,
    rows: Mutex<Vec<(String, &'static str, FencingToken)>>,
    rejected: Mutex<Vec<String>>,
}

impl Ledger {
    fn write(&self, who: &'static str, key: &LeaseKey, token: FencingToken) -> bool {
        let result = self.gate.write(key, token, || {
            lock(&self.rows).push((key.to_string(), who, token));
        });
        match result {
            Ok(()) => {
                say(who, &format!("wrote {key} with token {token}: accepted"));
                true
            }
            Err(stale) => {
                say(
                    who,
                    &format!("wrote {key} with token {token}: REJECTED by the fence ({stale})"),
                );
                lock(&self.rejected).push(format!("{who} {key} token {token}"));
                false
            }
        }
    }

    fn done(&self, key: &str) -> bool {
        lock(&self.rows).iter().any(|(k, _, _)| k == key)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

fn say(who: &str, what: &str) {
    let t = START.get().map(|s| s.elapsed()).unwrap_or_default();
    println!("[+{:>5.3}s] {who:<6} {what}", t.as_secs_f64());
}

/// Carol's view of the store: while she is frozen, nothing she sends gets out.
#[derive(Debug)]
struct FreezableLink {
    store: MemoryProvider,
    frozen: AtomicBool,
}

#[async_trait]
impl LeaseProvider for FreezableLink {
    fn capabilities(&self) -> &Capabilities {
        self.store.capabilities()
    }
    fn namespace(&self) -> &str {
        self.store.namespace()
    }
    async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        self.store.try_acquire(key, ttl).await
    }
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        while self.frozen.load(Ordering::SeqCst) {
            sleep(Duration::from_millis(5)).await;
        }
        self.store.extend(lease, ttl).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.store.release(lease).await
    }
    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>> {
        self.store.inspect(key).await
    }
}

async fn worker(
    name: &'static str,
    provider: Arc<dyn LeaseProvider>,
    ledger: Arc<Ledger>,
) -> Result<()> {
    let deadline = Instant::now() + PAUSE * 3;
    while Instant::now() < deadline {
        let Some(next) = BATCHES.iter().find(|b| !ledger.done(b)) else {
            return Ok(());
        };
        // Wait a little for a held batch, then look at the others again.
        let key = LeaseKey::new(next)?;
        let Some(lease) = acquire(&provider, &key, AcquireOptions::ttl(TTL).wait(TTL / 4)).await?
        else {
            continue;
        };
        if ledger.done(next) {
            provider.release(&lease).await?;
            continue;
        }
        say(name, &format!("acquired {key} (token {})", lease.token()));
        let guard = LeaseGuard::new(Arc::clone(&provider), lease);
        tokio::select! {
            reason = guard.lost() => say(name, &format!("lost {key} while working: {reason}")),
            _ = sleep(WORK) => {
                ledger.write(name, &key, guard.token());
            }
        }
        guard.release().await.ok();
    }
    Ok(())
}

#[tokio::main]
async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    START.get_or_init(Instant::now);
    println!(
        "lease quickstart: 3 workers, {} settlement batches, in-memory store, TTL {TTL:?}\n",
        BATCHES.len()
    );
    let store = MemoryProvider::new();
    let provider: Arc<dyn LeaseProvider> = Arc::new(store.clone());
    let ledger = Arc::new(Ledger {
        gate: FenceGate::new(),
        rows: Mutex::new(Vec::new()),
        rejected: Mutex::new(Vec::new()),
    });

    // Carol takes batch-3 first, then freezes before she can write.
    let carol_link = Arc::new(FreezableLink {
        store: store.clone(),
        frozen: AtomicBool::new(false),
    });
    let key3 = LeaseKey::new("batch-3")?;
    let lease = acquire(&carol_link, &key3, AcquireOptions::ttl(TTL))
        .await?
        .ok_or("batch-3 should be free at the start")?;
    say(
        "carol",
        &format!("acquired {key3} (token {})", lease.token()),
    );
    let carol_token = lease.token();
    let carol_guard = LeaseGuard::new(carol_link.clone(), lease);
    say(
        "carol",
        &format!("freezes for {PAUSE:?} (a stop-the-world pause): her renewals cannot get out"),
    );
    carol_link.frozen.store(true, Ordering::SeqCst);

    let carol = {
        let ledger = Arc::clone(&ledger);
        let link = Arc::clone(&carol_link);
        tokio::spawn(async move {
            let watcher = async {
                let reason = carol_guard.lost().await;
                say(
                    "carol",
                    &format!("guard fired the lost signal for batch-3: {reason}"),
                );
            };
            // The frozen job ignores everything until the pause ends...
            tokio::join!(watcher, sleep(PAUSE));
            link.frozen.store(false, Ordering::SeqCst);
            say(
                "carol",
                "wakes up; her guard says batch-3 is lost; a careless job writes anyway",
            );
            // ...and a careless job writes anyway. The fence is the last line.
            let accepted = ledger.write("carol", &key3, carol_token);
            (carol_guard.is_lost(), accepted)
        })
    };

    let alice = tokio::spawn(worker("alice", Arc::clone(&provider), Arc::clone(&ledger)));
    let bob = tokio::spawn(worker("bob", Arc::clone(&provider), Arc::clone(&ledger)));
    alice.await??;
    bob.await??;
    let (carol_knew, carol_accepted) = carol.await?;

    println!("\nLedger (each batch written once, by a live holder):");
    let rows = lock(&ledger.rows).clone();
    for (key, who, token) in &rows {
        println!("  {key:<8} by {who:<6} token {token}");
    }
    println!(
        "Rejected stale writes: {}",
        lock(&ledger.rejected).join(", ")
    );

    let mut keys: Vec<_> = rows.iter().map(|(k, _, _)| k.clone()).collect();
    keys.sort();
    keys.dedup();
    let ok =
        keys.len() == BATCHES.len() && rows.len() == BATCHES.len() && carol_knew && !carol_accepted;
    if !ok {
        return Err("the story did not go as the contract promises".into());
    }
    println!(
        "\nEvery batch was processed exactly once; the paused worker knew it had lost its lease, and its late write was refused."
    );
    Ok(())
}
