//! Observability: a tracing span on every store call, and metrics behind the
//! `metrics` feature (through the `metrics` facade crate, so any recorder such
//! as a Prometheus exporter picks them up).
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `lease_store_call_seconds` | histogram | backend, op, outcome | one store call through [`Observed`] |
//! | `lease_acquire_seconds` | histogram | backend, outcome | an [`acquire`](crate::acquire), waiting included |
//! | `lease_acquire_wait_seconds` | histogram | backend | the part of it spent waiting for the key |
//! | `lease_renewals_total` | counter | backend | guard renewals that succeeded |
//! | `lease_renewal_failures_total` | counter | backend | guard renewals that failed (retried until validity ends) |
//! | `lease_lost_total` | counter | backend, reason | guards whose lost signal fired (`revoked`: the store said so; `expired`: renewals failed until local validity ran out) |
//!
//! Outcomes: `acquired`, `held`, `ok`, `free`, `lost`, `not_held`, `unavailable`,
//! `timeout`, `denied`, `invalid`, `error` (and `not_acquired` for an acquire
//! whose wait ran out). No label or field ever holds a URL or a secret.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use tracing::Instrument;

use crate::session_store::SessionStore;
use crate::watch::KeyWatch;
use crate::{Capabilities, Lease, LeaseInfo, LeaseKey, LeaseProvider, Result, TryAcquire};

use crate::record::{call as record_call, error_outcome};

/// Wraps any provider so that every store call runs in a `lease.store`
/// tracing span (fields: backend, op, key, token, outcome, elapsed) and, with
/// the `metrics` feature, lands in `lease_store_call_seconds`. The `lease`
/// facade wraps every provider it builds; wrap providers you build yourself
/// with [`Observed::new`].
pub struct Observed<P: ?Sized> {
    inner: Arc<P>,
}

impl<P: ?Sized> Observed<P> {
    /// Observes `inner`.
    pub fn new(inner: Arc<P>) -> Self {
        Observed { inner }
    }

    /// The wrapped provider.
    pub fn inner(&self) -> &Arc<P> {
        &self.inner
    }
}

impl<P: LeaseProvider + ?Sized> fmt::Debug for Observed<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.inner, f)
    }
}

impl<P: LeaseProvider + ?Sized> Observed<P> {
    async fn observe<T>(
        &self,
        op: &'static str,
        key: &LeaseKey,
        token: Option<u64>,
        call: impl std::future::Future<Output = Result<T>>,
        ok_outcome: impl FnOnce(&T) -> (&'static str, Option<u64>),
    ) -> Result<T> {
        let backend = self.inner.capabilities().backend;
        let span = tracing::debug_span!(
            "lease.store",
            backend,
            op,
            key = %key,
            token = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        if let Some(t) = token {
            span.record("token", t);
        }
        let started = Instant::now();
        let result = call.instrument(span.clone()).await;
        let elapsed = started.elapsed();
        let outcome = match &result {
            Ok(v) => {
                let (outcome, token) = ok_outcome(v);
                if let Some(t) = token {
                    span.record("token", t);
                }
                outcome
            }
            Err(e) => error_outcome(e),
        };
        span.record("outcome", outcome);
        span.in_scope(|| {
            tracing::debug!(
                outcome,
                elapsed_us = elapsed.as_micros() as u64,
                "store call"
            );
        });
        record_call(backend, op, outcome, elapsed);
        result
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<P: LeaseProvider + ?Sized> LeaseProvider for Observed<P> {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }

    fn namespace(&self) -> &str {
        self.inner.namespace()
    }

    fn watch_reports_state(&self) -> bool {
        self.inner.watch_reports_state()
    }

    async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        self.observe(
            "acquire",
            key,
            None,
            self.inner.try_acquire(key, ttl),
            |r| match r {
                TryAcquire::Acquired(l) => ("acquired", Some(l.token().get())),
                TryAcquire::Held { .. } => ("held", None),
            },
        )
        .await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let token = Some(lease.token().get());
        self.observe(
            "extend",
            lease.key(),
            token,
            self.inner.extend(lease, ttl),
            |_| ("ok", None),
        )
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let token = Some(lease.token().get());
        self.observe(
            "release",
            lease.key(),
            token,
            self.inner.release(lease),
            |_| ("ok", None),
        )
        .await
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>> {
        self.observe("inspect", key, None, self.inner.inspect(key), |i| match i {
            Some(info) => ("held", Some(info.token.get())),
            None => ("free", None),
        })
        .await
    }

    async fn watch(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        self.observe("watch", key, None, self.inner.watch(key), |_| ("ok", None))
            .await
    }

    async fn flush(&self, limit: Duration) {
        self.inner.flush(limit).await;
    }

    fn wait_queue(&self) -> Option<&dyn crate::queue::WaitQueue> {
        self.inner.wait_queue()
    }

    async fn extend_many(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        let started = Instant::now();
        let result = self.inner.extend_many(leases).await;
        tracing::debug!(
            backend = self.inner.capabilities().backend,
            leases = leases.len(),
            ok = result.is_ok(),
            elapsed = ?started.elapsed(),
            "lease extend_many"
        );
        result
    }

    fn batch_limit(&self) -> usize {
        self.inner.batch_limit()
    }

    async fn session_store(&self, ttl: Duration) -> Result<Option<Arc<dyn SessionStore>>> {
        self.inner.session_store(ttl).await
    }
}
