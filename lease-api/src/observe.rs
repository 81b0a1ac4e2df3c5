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

use std::sync::Arc;
use std::time::Duration;

use tracing::Span;

use crate::hook::{Answer, Hook, Op, Outcome};
use crate::layered::Layered;
use crate::record::{call as record_call, error_outcome};
use crate::{LeaseKey, LeaseProvider, TryAcquire, TryAcquireAll};

/// Wraps any provider so that every store call runs in a `lease.store`
/// tracing span (fields: backend, op, key, token, outcome, elapsed) and, with
/// the `metrics` feature, lands in `lease_store_call_seconds`. The `lease`
/// facade wraps every provider it builds; wrap providers you build yourself
/// with [`Observed::new`].
///
/// A [`Layered`] provider with the [`ObserveHook`].
pub type Observed<P> = Layered<P, ObserveHook>;

impl<P: LeaseProvider + ?Sized> Layered<P, ObserveHook> {
    /// Observes `inner`.
    pub fn new(inner: Arc<P>) -> Self {
        let backend = inner.capabilities().backend;
        Layered::with_hook(inner, ObserveHook { backend })
    }
}

/// The hook of an [`Observed`] provider: a `lease.store` span and a
/// `lease_store_call_seconds` sample per `try_acquire` (op `acquire`),
/// `extend`, `release`, `inspect` and `watch`, and a debug event per
/// `extend_many`. Built by [`Observed::new`].
#[derive(Clone, Copy, Debug)]
pub struct ObserveHook {
    backend: &'static str,
}

/// The op label, key and token (when the call carries one) of a call that
/// gets a span; `None` for the calls that do not.
fn traced<'a>(op: &Op<'a>) -> Option<(&'static str, &'a LeaseKey, Option<u64>)> {
    match *op {
        Op::TryAcquire { key, .. } => Some(("acquire", key, None)),
        Op::TryAcquireAll { keys, .. } => keys.first().map(|key| ("acquire_all", key, None)),
        Op::TryAcquireRead { key, .. } => Some(("acquire_read", key, None)),
        Op::TryAcquireWrite { key, .. } => Some(("acquire_write", key, None)),
        Op::Extend { lease, .. } => Some(("extend", lease.key(), Some(lease.token().get()))),
        Op::Release { lease } => Some(("release", lease.key(), Some(lease.token().get()))),
        Op::Inspect { key } => Some(("inspect", key, None)),
        Op::Watch { key } => Some(("watch", key, None)),
        _ => None,
    }
}

impl Hook for ObserveHook {
    fn span(&self, op: &Op<'_>) -> Span {
        let Some((op, key, token)) = traced(op) else {
            return Span::none();
        };
        let span = tracing::debug_span!(
            "lease.store",
            backend = self.backend,
            op,
            key = %key,
            token = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        if let Some(t) = token {
            span.record("token", t);
        }
        span
    }

    fn after(&self, op: &Op<'_>, outcome: Outcome<'_>, elapsed: Duration, span: &Span) {
        if let Op::ExtendMany { leases } = op {
            tracing::debug!(
                backend = self.backend,
                leases = leases.len(),
                ok = outcome.is_ok(),
                elapsed = ?elapsed,
                "lease extend_many"
            );
            return;
        }
        let Some((op, ..)) = traced(op) else {
            return;
        };
        let (outcome, token) = match outcome {
            Ok(Answer::TryAcquire(TryAcquire::Acquired(l))) => ("acquired", Some(l.token().get())),
            Ok(Answer::TryAcquire(TryAcquire::Held { .. })) => ("held", None),
            Ok(Answer::TryAcquireAll(TryAcquireAll::Acquired(l))) => {
                ("acquired", l.first().map(|l| l.token().get()))
            }
            Ok(Answer::TryAcquireAll(TryAcquireAll::Held { .. })) => ("held", None),
            Ok(Answer::Holder(Some(info))) => ("held", Some(info.token.get())),
            Ok(Answer::Holder(None)) => ("free", None),
            Ok(_) => ("ok", None),
            Err(e) => (error_outcome(e), None),
        };
        if let Some(t) = token {
            span.record("token", t);
        }
        span.record("outcome", outcome);
        span.in_scope(|| {
            tracing::debug!(
                outcome,
                elapsed_us = elapsed.as_micros() as u64,
                "store call"
            );
        });
        record_call(self.backend, op, outcome, elapsed);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use std::time::Duration;

    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Metadata, Subscriber};

    use super::*;
    use crate::{LeaseError, MemoryProvider};

    type Fields = BTreeMap<String, String>;

    struct Visitor<'a>(&'a mut Fields);

    impl Visit for Visitor<'_> {
        fn record_str(&mut self, field: &Field, value: &str) {
            self.0.insert(field.name().into(), value.into());
        }
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0.insert(field.name().into(), format!("{value:?}"));
        }
    }

    /// Writes down every span (its name and fields as recorded) and every
    /// event (its fields and the span it happened in).
    #[derive(Default)]
    struct Capture {
        spans: Mutex<Vec<(&'static str, Fields)>>,
        events: Mutex<Vec<(Option<usize>, Fields)>>,
        entered: Mutex<Vec<usize>>,
    }

    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn index(id: &Id) -> usize {
        (id.into_u64() - 1) as usize
    }

    impl Subscriber for Capture {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, span: &Attributes<'_>) -> Id {
            let mut fields = Fields::new();
            span.record(&mut Visitor(&mut fields));
            let mut spans = lock(&self.spans);
            spans.push((span.metadata().name(), fields));
            Id::from_u64(spans.len() as u64)
        }
        fn record(&self, span: &Id, values: &Record<'_>) {
            values.record(&mut Visitor(&mut lock(&self.spans)[index(span)].1));
        }
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            let mut fields = Fields::new();
            event.record(&mut Visitor(&mut fields));
            let parent = event
                .parent()
                .map(index)
                .or_else(|| lock(&self.entered).last().copied());
            lock(&self.events).push((parent, fields));
        }
        fn enter(&self, span: &Id) {
            lock(&self.entered).push(index(span));
        }
        fn exit(&self, _: &Id) {
            lock(&self.entered).pop();
        }
    }

    fn fields(pairs: &[(&str, &str)]) -> Fields {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Observed's spans and events, field for field: one `lease.store` span
    /// per try_acquire, extend, release, inspect and watch with a `store
    /// call` event in it, one `lease extend_many` event, nothing else.
    #[tokio::test(flavor = "current_thread")]
    async fn observed_spans_and_events_keep_their_names_and_fields() {
        let capture = Arc::new(Capture::default());
        let _default = tracing::subscriber::set_default(Arc::clone(&capture));
        let memory = Arc::new(MemoryProvider::new());
        let p: Arc<dyn LeaseProvider> = Arc::new(Observed::new(Arc::clone(&memory)));
        let k = LeaseKey::new("k").unwrap();
        let ttl = Duration::from_secs(5);

        let lease = p.try_acquire(&k, ttl).await.unwrap().into_lease().unwrap();
        let t = lease.token().get().to_string();
        assert!(!p.try_acquire(&k, ttl).await.unwrap().is_acquired());
        let lease = p.extend(&lease, ttl).await.unwrap();
        p.extend_many(std::slice::from_ref(&lease)).await.unwrap();
        p.inspect(&k).await.unwrap();
        p.watch(&k).await.unwrap();
        p.flush(Duration::from_millis(1)).await;
        p.wait_queue().unwrap().join(&k, ttl, 1).await.unwrap();
        p.release(&lease).await.unwrap();
        p.inspect(&k).await.unwrap();
        assert!(matches!(
            p.extend(&lease, ttl).await,
            Err(LeaseError::Lost { .. })
        ));

        let span = |op: &str, token: Option<&str>, outcome: &str| {
            let mut f = fields(&[
                ("backend", "memory"),
                ("op", op),
                ("key", "k"),
                ("outcome", outcome),
            ]);
            if let Some(t) = token {
                f.insert("token".into(), t.into());
            }
            ("lease.store", f)
        };
        let spans = lock(&capture.spans).clone();
        assert_eq!(
            spans,
            [
                span("acquire", Some(&t), "acquired"),
                span("acquire", None, "held"),
                span("extend", Some(&t), "ok"),
                span("inspect", Some(&t), "held"),
                span("watch", None, "ok"),
                span("release", Some(&t), "ok"),
                span("inspect", None, "free"),
                span("extend", Some(&t), "lost"),
            ]
        );

        let mut events = lock(&capture.events).clone();
        let many = events.remove(3);
        assert_eq!(many.0, None);
        assert!(many.1.contains_key("elapsed"), "{many:?}");
        let mut many = many.1;
        many.remove("elapsed");
        assert_eq!(
            many,
            fields(&[
                ("backend", "memory"),
                ("leases", "1"),
                ("ok", "true"),
                ("message", "lease extend_many"),
            ])
        );
        assert_eq!(events.len(), spans.len());
        for (i, (parent, mut f)) in events.into_iter().enumerate() {
            assert_eq!(parent, Some(i), "the event of call {i} is in its span");
            assert!(f.remove("elapsed_us").is_some(), "{f:?}");
            assert_eq!(
                f,
                fields(&[
                    ("outcome", &spans[i].1["outcome"]),
                    ("message", "store call")
                ])
            );
        }
    }
}
