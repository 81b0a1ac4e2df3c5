//! The in-memory provider's read/write leases (C19): one entry per key, with
//! its writer, its readers and its waiting writers, decided under the
//! store's lock.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::lease::{LeaseKind, OwnerId};
use crate::rw_rules;
use crate::{FencingToken, Lease, LeaseError, LeaseInfo, LeaseKey, Result, RwInfo, TryAcquire};

struct RwHolder {
    owner: OwnerId,
    token: u64,
    expires_at: Instant,
    label: Arc<str>,
}

impl RwHolder {
    fn info(&self, now: Instant) -> LeaseInfo {
        LeaseInfo::new(
            FencingToken(self.token),
            self.expires_at - now,
            Some(self.owner),
            Some(self.label.to_string()),
        )
    }
}

/// One key's read/write lease.
pub(crate) struct RwEntry {
    writer: Option<RwHolder>,
    readers: HashMap<OwnerId, RwHolder>,
    /// Waiting writers, until when their record keeps readers out.
    waiting: HashMap<OwnerId, Instant>,
    /// The last writer's token: kept while the entry lives, so a sweep
    /// keeps entries that have one.
    writer_epoch: u64,
    pub(crate) notify: Arc<Notify>,
}

impl RwEntry {
    pub(crate) fn new() -> Self {
        RwEntry {
            writer: None,
            readers: HashMap::new(),
            waiting: HashMap::new(),
            writer_epoch: 0,
            notify: Arc::new(Notify::new()),
        }
    }

    /// Forgets what expired; the waiters are woken when something did.
    fn prune(&mut self, now: Instant) {
        let before = (
            self.writer.is_some(),
            self.readers.len(),
            self.waiting.len(),
        );
        self.writer = self.writer.take().filter(|w| w.expires_at > now);
        self.readers.retain(|_, r| r.expires_at > now);
        self.waiting.retain(|_, until| *until > now);
        if before
            != (
                self.writer.is_some(),
                self.readers.len(),
                self.waiting.len(),
            )
        {
            self.notify.notify_waiters();
        }
    }

    /// Nothing held, nobody waiting or watching, and no writer epoch to keep.
    pub(crate) fn is_idle(&mut self, now: Instant) -> bool {
        self.prune(now);
        self.writer.is_none()
            && self.readers.is_empty()
            && self.waiting.is_empty()
            && self.writer_epoch == 0
            && Arc::strong_count(&self.notify) == 1
    }

    pub(crate) fn read(
        &mut self,
        key: &LeaseKey,
        ttl: Duration,
        now: Instant,
        label: Arc<str>,
        next_token: impl FnOnce() -> u64,
    ) -> TryAcquire {
        self.prune(now);
        if let Some(until) = rw_rules::read_refused_until(
            self.writer.as_ref().map(|w| w.expires_at),
            self.waiting.values().copied(),
        ) {
            return TryAcquire::Held {
                remaining: Some(until - now),
            };
        }
        let owner = OwnerId::random();
        let token = next_token();
        self.readers.insert(
            owner,
            RwHolder {
                owner,
                token,
                expires_at: now + ttl,
                label: Arc::clone(&label),
            },
        );
        let kind = LeaseKind::Read {
            writer_epoch: FencingToken(self.writer_epoch),
        };
        TryAcquire::Acquired(
            Lease::new(key.clone(), FencingToken(token), owner, ttl, now)
                .with_holder(label)
                .with_kind(kind),
        )
    }

    pub(crate) fn write(
        &mut self,
        key: &LeaseKey,
        ttl: Duration,
        now: Instant,
        (waiting, label): (Option<OwnerId>, Arc<str>),
        next_token: impl FnOnce() -> u64,
    ) -> TryAcquire {
        self.prune(now);
        let last = rw_rules::write_refused_until(
            self.writer
                .iter()
                .chain(self.readers.values())
                .map(|h| h.expires_at),
        );
        if let Some(last) = last {
            if let Some(id) = waiting {
                self.waiting.insert(id, now + ttl);
            }
            return TryAcquire::Held {
                remaining: Some(last - now),
            };
        }
        if let Some(id) = waiting {
            self.waiting.remove(&id);
        }
        let owner = OwnerId::random();
        let token = next_token();
        self.writer_epoch = token;
        self.writer = Some(RwHolder {
            owner,
            token,
            expires_at: now + ttl,
            label: Arc::clone(&label),
        });
        TryAcquire::Acquired(
            Lease::new(key.clone(), FencingToken(token), owner, ttl, now)
                .with_holder(label)
                .with_kind(LeaseKind::Write),
        )
    }

    fn holder_of(&mut self, lease: &Lease, now: Instant) -> Option<&mut RwHolder> {
        let h = match lease.kind() {
            LeaseKind::Read { .. } => self.readers.get_mut(&lease.owner()),
            LeaseKind::Write => self.writer.as_mut(),
            LeaseKind::Exclusive => None,
        };
        h.filter(|h| {
            h.expires_at > now && h.owner == lease.owner() && h.token == lease.token().get()
        })
    }

    pub(crate) fn extend(&mut self, lease: &Lease, ttl: Duration, now: Instant) -> Result<Lease> {
        match self.holder_of(lease, now) {
            Some(h) => {
                h.expires_at = now + ttl;
                Ok(lease.renewed(ttl, now))
            }
            None => Err(LeaseError::lost(lease)),
        }
    }

    pub(crate) fn release(&mut self, lease: &Lease, now: Instant) -> Result<()> {
        if self.holder_of(lease, now).is_none() {
            return Err(LeaseError::not_held(lease));
        }
        match lease.kind() {
            LeaseKind::Read { .. } => {
                self.readers.remove(&lease.owner());
            }
            _ => self.writer = None,
        }
        self.notify.notify_waiters();
        Ok(())
    }

    pub(crate) fn withdraw(&mut self, waiting: OwnerId) {
        if self.waiting.remove(&waiting).is_some() {
            self.notify.notify_waiters();
        }
    }

    pub(crate) fn info(&mut self, now: Instant) -> RwInfo {
        self.prune(now);
        let mut readers: Vec<LeaseInfo> = self.readers.values().map(|r| r.info(now)).collect();
        readers.sort_by_key(|r| r.token);
        let mut info = RwInfo::default();
        info.writer = self.writer.as_ref().map(|w| w.info(now));
        info.readers = readers;
        info.writers_waiting = self.waiting.len();
        info.writer_epoch = FencingToken(self.writer_epoch);
        info
    }
}
