//! The state a lease session's handles and its renewal loop share.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::LeaseProvider;
use crate::held::Shared;
use crate::session_adapters::SessionAcquirer;
use crate::session_store::SessionStore;

/// What the renewal loop must know about leases added since it last looked.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Added {
    pub(crate) window: Duration,
    pub(crate) earliest_valid_until: Instant,
}

pub(crate) struct Inner {
    pub(crate) provider: Arc<dyn LeaseProvider>,
    pub(crate) store: Arc<dyn SessionStore>,
    pub(crate) acquirer: Arc<SessionAcquirer>,
    pub(crate) ttl: Duration,
    pub(crate) parallel: usize,
    pub(crate) leases: Mutex<HashMap<u64, Arc<Shared>>>,
    pub(crate) next_id: AtomicU64,
    /// Leases added since the loop last looked: the shortest validity window
    /// and the earliest validity among them.
    pub(crate) pending: Mutex<Option<Added>>,
    pub(crate) added: Notify,
    pub(crate) stop: CancellationToken,
    pub(crate) rounds: AtomicU64,
    pub(crate) renew_calls: AtomicU64,
    pub(crate) lost: AtomicU64,
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseSession")
            .field("store", &self.store)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}
