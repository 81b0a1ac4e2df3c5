//! The in-memory provider: the whole contract inside one process.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::key::validate_namespace;
use crate::lease::{LeaseKind, OwnerId};
use crate::memory_rw::RwEntry;
use crate::queue::{Place, Ticket, WaitQueue};
use crate::queue_rules::{self, Standing};
use crate::watch::KeyWatch;
use crate::watch::NotifyWatch;
use crate::{
    Capabilities, ExpiryClock, FencingToken, Lease, LeaseError, LeaseInfo, LeaseKey, LeaseProvider,
    Notifications, Result, RwInfo, TokenDurability, TryAcquire, TryAcquireAll,
};

/// The default namespace of every provider.
pub const DEFAULT_NAMESPACE: &str = "lease";

/// How many operations pass between sweeps of expired, unwatched entries.
const SWEEP_EVERY: u64 = 1024;

struct Holder {
    owner: OwnerId,
    token: u64,
    expires_at: Instant,
    label: Arc<str>,
}

struct Entry {
    holder: Option<Holder>,
    notify: Arc<Notify>,
}

impl Entry {
    fn live_holder(&self, now: Instant) -> Option<&Holder> {
        self.holder.as_ref().filter(|h| h.expires_at > now)
    }
}

/// A fair waiter's ticket: it ends at `expires_at` unless refreshed, and
/// `left` wakes the waiter behind it.
struct Waiter {
    expires_at: Instant,
    mark: u64,
    left: Arc<Notify>,
}

impl queue_rules::QueuedTicket<Instant> for Waiter {
    fn mark(&self) -> u64 {
        self.mark
    }
    fn expires_at(&self) -> Instant {
        self.expires_at
    }
}

type Queue = BTreeMap<u64, Waiter>;

#[derive(Default)]
struct State {
    entries: HashMap<(Arc<str>, LeaseKey), Entry>,
    queues: HashMap<(Arc<str>, LeaseKey), Queue>,
    rw: HashMap<(Arc<str>, LeaseKey), RwEntry>,
    last_token: u64,
    last_ticket: u64,
    ops: u64,
}

impl State {
    /// Drops entries nobody holds or watches, so memory follows live leases.
    fn maybe_sweep(&mut self, now: Instant) {
        self.ops += 1;
        if !self.ops.is_multiple_of(SWEEP_EVERY) {
            return;
        }
        self.entries
            .retain(|_, e| e.live_holder(now).is_some() || Arc::strong_count(&e.notify) > 1);
        self.rw.retain(|_, e| !e.is_idle(now));
        self.queues.retain(|_, q| {
            expire_tickets(q, now);
            !q.is_empty()
        });
    }
}

/// Drops the tickets past their TTL, waking whoever waits behind them.
fn expire_tickets(queue: &mut Queue, now: Instant) {
    queue.retain(|_, w| {
        let live = queue_rules::is_live(w, now);
        if !live {
            w.left.notify_waiters();
        }
        live
    });
}

/// One in-memory lease store. Every [`MemoryProvider`] made from the same store
/// sees the same leases, like connections to one server; clones are cheap.
#[derive(Clone, Default)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
    down: Arc<AtomicBool>,
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore").finish_non_exhaustive()
    }
}

impl MemoryStore {
    /// A new, empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// A provider on this store in `namespace`.
    ///
    /// # Errors
    /// [`LeaseError::Config`] for an empty or over-long namespace.
    pub fn provider(&self, namespace: &str) -> Result<MemoryProvider> {
        validate_namespace(namespace)?;
        Ok(MemoryProvider {
            store: self.clone(),
            namespace: Arc::from(namespace),
            caps: Arc::new(memory_capabilities()),
        })
    }

    /// Deletes the entries of every namespace whose name starts with `prefix`
    /// (waking their waiters) and returns how many went. Tokens keep growing:
    /// the counter is the store's, not the key's.
    ///
    /// # Errors
    /// `Config` for an empty prefix; `Unavailable` while the store is down.
    pub fn purge_namespaces(&self, prefix: &str) -> Result<u64> {
        crate::key::validate_purge_prefix(prefix)?;
        let mut state = self.lock()?;
        let before = state.entries.len();
        state.entries.retain(|(ns, _), e| {
            let keep = !ns.starts_with(prefix);
            if !keep {
                e.notify.notify_waiters();
            }
            keep
        });
        state.queues.retain(|(ns, _), q| {
            let keep = !ns.starts_with(prefix);
            if !keep {
                q.values().for_each(|w| w.left.notify_waiters());
            }
            keep
        });
        let rw_before = state.rw.len();
        state.rw.retain(|(ns, _), e| {
            let keep = !ns.starts_with(prefix);
            if !keep {
                e.notify.notify_waiters();
            }
            keep
        });
        let gone = (before - state.entries.len()) + (rw_before - state.rw.len());
        Ok(u64::try_from(gone).unwrap_or(u64::MAX))
    }

    /// Marks the store as down (or up again). While down, every operation of
    /// every provider on it fails with [`LeaseError::Unavailable`], the way a
    /// networked store fails when it cannot be reached: a fault to inject into
    /// tests of code that uses leases. Leases keep expiring meanwhile.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    fn lock(&self) -> Result<MutexGuard<'_, State>> {
        if self.down.load(Ordering::SeqCst) {
            return Err(LeaseError::Unavailable {
                message: "the in-memory store is marked down (MemoryStore::set_down)".into(),
                source: None,
            });
        }
        // No code path panics while holding this lock; if one ever did, the map
        // is still structurally sound, so keep serving.
        Ok(self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

fn memory_capabilities() -> Capabilities {
    Capabilities::new(
        "memory",
        ExpiryClock::ProcessMonotonic,
        Notifications::Native("in-process notify"),
    )
    .with_fair_waiting(true)
    .with_multi_key(crate::caps::MultiKey::atomic(crate::caps::DEFAULT_MAX_KEYS))
    .with_shared_leases(true)
    .with_durable_tokens(TokenDurability::Volatile(
        "tokens live in process memory and start again at 1 in a new process".into(),
    ))
}

/// The in-memory reference provider: the complete contract in one process.
///
/// It is the embedded default (no server needed) and the reference every other
/// backend is compared with. Time is tokio time, so tests can pause and advance
/// the clock. Releases wake waiters through [`tokio::sync::Notify`]; expiry is
/// noticed by waiters at the holder's remaining TTL. Tokens come from one counter
/// per store, so they increase across keys, namespaces and providers.
///
/// ```
/// # async fn demo() -> lease_api::Result<()> {
/// use std::time::Duration;
/// use lease_api::{LeaseKey, LeaseProvider, MemoryProvider};
///
/// let provider = MemoryProvider::new();
/// let key = LeaseKey::new("settlement-batch-7")?;
/// let lease = provider.try_acquire(&key, Duration::from_secs(5)).await?.into_lease().unwrap();
/// assert!(!provider.try_acquire(&key, Duration::from_secs(5)).await?.is_acquired());
/// provider.release(&lease).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MemoryProvider {
    store: MemoryStore,
    namespace: Arc<str>,
    caps: Arc<Capabilities>,
}

impl fmt::Debug for MemoryProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryProvider")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Default for MemoryProvider {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryProvider {
    /// Extends `lease` to `sent_at + ttl` inside a held lock section.
    fn extend_locked(
        &self,
        state: &mut State,
        lease: &Lease,
        ttl: Duration,
        sent_at: Instant,
    ) -> Result<Lease> {
        if lease.kind() != LeaseKind::Exclusive {
            return match state.rw.get_mut(&self.entry_key(lease.key())) {
                Some(e) => e.extend(lease, ttl, sent_at),
                None => Err(LeaseError::lost(lease)),
            };
        }
        let holder = state
            .entries
            .get_mut(&self.entry_key(lease.key()))
            .and_then(|e| e.holder.as_mut())
            .filter(|h| {
                h.expires_at > sent_at && h.owner == lease.owner() && h.token == lease.token().0
            });
        match holder {
            Some(h) => {
                h.expires_at = sent_at + ttl;
                Ok(lease.renewed(ttl, sent_at))
            }
            None => Err(LeaseError::lost(lease)),
        }
    }

    /// A provider on a new store of its own, in the default namespace.
    pub fn new() -> Self {
        MemoryProvider {
            store: MemoryStore::new(),
            namespace: Arc::from(DEFAULT_NAMESPACE),
            caps: Arc::new(memory_capabilities()),
        }
    }

    /// The store this provider works on, to make more providers on it.
    pub fn store(&self) -> &MemoryStore {
        &self.store
    }

    fn entry_key(&self, key: &LeaseKey) -> (Arc<str>, LeaseKey) {
        (Arc::clone(&self.namespace), key.clone())
    }
}

#[async_trait]
impl LeaseProvider for MemoryProvider {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn namespace(&self) -> &str {
        &self.namespace
    }

    async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        let ttl = self.caps.grant_ttl(ttl)?;
        let sent_at = Instant::now();
        let mut state = self.store.lock()?;
        state.maybe_sweep(sent_at);
        state.last_token += 1;
        let token = state.last_token;
        let entry = state
            .entries
            .entry(self.entry_key(key))
            .or_insert_with(|| Entry {
                holder: None,
                notify: Arc::new(Notify::new()),
            });
        if let Some(h) = entry.live_holder(sent_at) {
            let remaining = h.expires_at - sent_at;
            // Hand the unused token back; tokens stay strictly increasing either way.
            state.last_token -= 1;
            return Ok(TryAcquire::Held {
                remaining: Some(remaining),
            });
        }
        let owner = OwnerId::random();
        let label = crate::holder();
        entry.holder = Some(Holder {
            owner,
            token,
            expires_at: sent_at + ttl,
            label: Arc::clone(&label),
        });
        Ok(TryAcquire::Acquired(
            Lease::new(key.clone(), FencingToken(token), owner, ttl, sent_at).with_holder(label),
        ))
    }

    /// Every key in one lock section: nobody ever sees the set half held.
    async fn try_acquire_all(&self, keys: &[LeaseKey], ttl: Duration) -> Result<TryAcquireAll> {
        crate::key::validate_key_set(keys, self.caps.multi_key.max_keys)?;
        let ttl = self.caps.grant_ttl(ttl)?;
        let sent_at = Instant::now();
        let mut state = self.store.lock()?;
        state.maybe_sweep(sent_at);
        for key in keys {
            if let Some(h) = state
                .entries
                .get(&self.entry_key(key))
                .and_then(|e| e.live_holder(sent_at))
            {
                return Ok(TryAcquireAll::Held {
                    key: key.clone(),
                    remaining: Some(h.expires_at - sent_at),
                });
            }
        }
        let label = crate::holder();
        let mut leases = Vec::with_capacity(keys.len());
        for key in keys {
            state.last_token += 1;
            let token = state.last_token;
            let owner = OwnerId::random();
            let entry = state
                .entries
                .entry(self.entry_key(key))
                .or_insert_with(|| Entry {
                    holder: None,
                    notify: Arc::new(Notify::new()),
                });
            entry.holder = Some(Holder {
                owner,
                token,
                expires_at: sent_at + ttl,
                label: Arc::clone(&label),
            });
            leases.push(
                Lease::new(key.clone(), FencingToken(token), owner, ttl, sent_at)
                    .with_holder(Arc::clone(&label)),
            );
        }
        Ok(TryAcquireAll::Acquired(leases))
    }

    async fn try_acquire_read(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        let ttl = self.caps.grant_ttl(ttl)?;
        let now = Instant::now();
        let mut state = self.store.lock()?;
        state.maybe_sweep(now);
        let State { rw, last_token, .. } = &mut *state;
        let entry = rw.entry(self.entry_key(key)).or_insert_with(RwEntry::new);
        Ok(entry.read(key, ttl, now, crate::holder(), || {
            *last_token += 1;
            *last_token
        }))
    }

    async fn try_acquire_write(
        &self,
        key: &LeaseKey,
        ttl: Duration,
        waiting: Option<OwnerId>,
    ) -> Result<TryAcquire> {
        let ttl = self.caps.grant_ttl(ttl)?;
        let now = Instant::now();
        let mut state = self.store.lock()?;
        state.maybe_sweep(now);
        let State { rw, last_token, .. } = &mut *state;
        let entry = rw.entry(self.entry_key(key)).or_insert_with(RwEntry::new);
        Ok(entry.write(key, ttl, now, (waiting, crate::holder()), || {
            *last_token += 1;
            *last_token
        }))
    }

    async fn withdraw_writer(&self, key: &LeaseKey, waiting: OwnerId) -> Result<()> {
        let mut state = self.store.lock()?;
        if let Some(e) = state.rw.get_mut(&self.entry_key(key)) {
            e.withdraw(waiting);
        }
        Ok(())
    }

    async fn inspect_rw(&self, key: &LeaseKey) -> Result<RwInfo> {
        let now = Instant::now();
        let mut state = self.store.lock()?;
        Ok(state
            .rw
            .get_mut(&self.entry_key(key))
            .map(|e| e.info(now))
            .unwrap_or_default())
    }

    async fn watch_rw(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        let notify = {
            let mut state = self.store.lock()?;
            let entry = state
                .rw
                .entry(self.entry_key(key))
                .or_insert_with(RwEntry::new);
            Arc::clone(&entry.notify)
        };
        Ok(Box::new(NotifyWatch::new(notify)))
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let ttl = self.caps.grant_ttl(ttl)?;
        let sent_at = Instant::now();
        let mut state = self.store.lock()?;
        self.extend_locked(&mut state, lease, ttl, sent_at)
    }

    /// Every lease in one lock section.
    async fn extend_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        let sent_at = Instant::now();
        let mut state = self.store.lock()?;
        Ok(leases
            .iter()
            .map(|lease| {
                let ttl = self.caps.grant_ttl(lease.ttl())?;
                self.extend_locked(&mut state, lease, ttl, sent_at)
            })
            .collect())
    }

    fn batch_limit(&self) -> usize {
        10_000
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let now = Instant::now();
        let mut state = self.store.lock()?;
        if lease.kind() != LeaseKind::Exclusive {
            return match state.rw.get_mut(&self.entry_key(lease.key())) {
                Some(e) => e.release(lease, now),
                None => Err(LeaseError::not_held(lease)),
            };
        }
        let entry = state.entries.get_mut(&self.entry_key(lease.key()));
        match entry {
            Some(e)
                if e.live_holder(now)
                    .is_some_and(|h| h.owner == lease.owner() && h.token == lease.token().0) =>
            {
                e.holder = None;
                e.notify.notify_waiters();
                Ok(())
            }
            _ => Err(LeaseError::not_held(lease)),
        }
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>> {
        let now = Instant::now();
        let state = self.store.lock()?;
        Ok(state
            .entries
            .get(&self.entry_key(key))
            .and_then(|e| e.live_holder(now))
            .map(|h| LeaseInfo {
                token: FencingToken(h.token),
                remaining: h.expires_at - now,
                owner: Some(h.owner),
                holder: Some(h.label.to_string()),
            }))
    }

    async fn watch(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        let notify = {
            let mut state = self.store.lock()?;
            let entry = state
                .entries
                .entry(self.entry_key(key))
                .or_insert_with(|| Entry {
                    holder: None,
                    notify: Arc::new(Notify::new()),
                });
            Arc::clone(&entry.notify)
        };
        Ok(Box::new(NotifyWatch::new(notify)))
    }

    fn wait_queue(&self) -> Option<&dyn WaitQueue> {
        Some(self)
    }
}

#[async_trait]
impl WaitQueue for MemoryProvider {
    /// A retried join renews the live ticket of its mark.
    fn retried_join_finds_its_ticket(&self) -> bool {
        true
    }

    async fn join(&self, key: &LeaseKey, ttl: Duration, mark: u64) -> Result<Ticket> {
        let ttl = self.caps.grant_ttl(ttl)?;
        let now = Instant::now();
        let mut state = self.store.lock()?;
        let entry_key = self.entry_key(key);
        // A join again with a live ticket's mark gets that ticket.
        if let Some(q) = state.queues.get_mut(&entry_key)
            && let Some(seq) = queue_rules::rejoin_of(q, mark, now)
            && let Some(w) = q.get_mut(&seq)
        {
            w.expires_at = now + ttl;
            return Ok(Ticket::new(key.clone(), seq, mark));
        }
        state.last_ticket += 1;
        let seq = state.last_ticket;
        state.queues.entry(entry_key).or_default().insert(
            seq,
            Waiter {
                expires_at: now + ttl,
                mark,
                left: Arc::new(Notify::new()),
            },
        );
        Ok(Ticket::new(key.clone(), seq, mark))
    }

    async fn place(&self, ticket: &Ticket) -> Result<Place> {
        let now = Instant::now();
        let mut state = self.store.lock()?;
        let Some(queue) = state.queues.get_mut(&self.entry_key(ticket.key())) else {
            return Ok(Place::Gone);
        };
        expire_tickets(queue, now);
        Ok(
            match queue_rules::standing(queue, ticket.seq(), ticket.mark()) {
                Standing::Gone => Place::Gone,
                Standing::First => Place::First,
                Standing::Behind(seq) => match queue.get(&seq) {
                    Some(w) => Place::Behind {
                        ahead: Ticket::new(ticket.key().clone(), seq, w.mark),
                        remaining: Some(w.expires_at - now),
                    },
                    None => Place::Gone,
                },
            },
        )
    }

    async fn watch_ticket(&self, ahead: &Ticket) -> Result<Box<dyn KeyWatch>> {
        let state = self.store.lock()?;
        let left = state
            .queues
            .get(&self.entry_key(ahead.key()))
            .and_then(|q| q.get(&ahead.seq()))
            .filter(|w| w.mark == ahead.mark())
            .map(|w| Arc::clone(&w.left));
        Ok(match left {
            Some(left) => Box::new(NotifyWatch::new(left)),
            None => Box::new(crate::watch::ReadyWatch),
        })
    }

    async fn refresh(&self, ticket: &Ticket, ttl: Duration) -> Result<bool> {
        let ttl = self.caps.grant_ttl(ttl)?;
        let now = Instant::now();
        let mut state = self.store.lock()?;
        let waiter = state
            .queues
            .get_mut(&self.entry_key(ticket.key()))
            .filter(|q| queue_rules::refreshable(q, ticket.seq(), ticket.mark(), now))
            .and_then(|q| q.get_mut(&ticket.seq()));
        Ok(match waiter {
            Some(w) => {
                w.expires_at = now + ttl;
                true
            }
            None => false,
        })
    }

    async fn leave(&self, ticket: &Ticket) -> Result<()> {
        let mut state = self.store.lock()?;
        let entry_key = self.entry_key(ticket.key());
        if let Some(queue) = state.queues.get_mut(&entry_key) {
            if queue_rules::is_own(queue, ticket.seq(), ticket.mark())
                && let Some(w) = queue.remove(&ticket.seq())
            {
                w.left.notify_waiters();
            }
            if queue.is_empty() {
                state.queues.remove(&entry_key);
            }
        }
        Ok(())
    }
}
