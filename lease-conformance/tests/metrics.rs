//! What the helpers record through the `metrics` facade (lease-api's
//! `metrics` feature), read back with a small in-test recorder.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_api::{
    AcquireOptions, GuardConfig, LeaseGuard, LeaseKey, LeaseProvider, MemoryStore, Observed,
    acquire,
};
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

/// Counts increments and histogram samples per metric name and labels.
#[derive(Default, Clone)]
struct Tally(Arc<Mutex<HashMap<String, f64>>>);

impl Tally {
    fn id(key: &Key) -> String {
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        format!("{}{{{}}}", key.name(), labels.join(","))
    }
    fn get(&self, id: &str) -> f64 {
        self.0.lock().unwrap().get(id).copied().unwrap_or(0.0)
    }
    fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.0.lock().unwrap().keys().cloned().collect();
        v.sort();
        v
    }
}

struct Handle(Tally, String);

impl metrics::CounterFn for Handle {
    fn increment(&self, value: u64) {
        *self.0.0.lock().unwrap().entry(self.1.clone()).or_default() += value as f64;
    }
    fn absolute(&self, value: u64) {
        self.0
            .0
            .lock()
            .unwrap()
            .insert(self.1.clone(), value as f64);
    }
}

impl metrics::HistogramFn for Handle {
    /// Histograms count their samples.
    fn record(&self, _value: f64) {
        *self.0.0.lock().unwrap().entry(self.1.clone()).or_default() += 1.0;
    }
}

impl Recorder for Tally {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(Arc::new(Handle(self.clone(), Tally::id(key))))
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(Arc::new(Handle(self.clone(), Tally::id(key))))
    }
}

#[test]
fn acquires_calls_renewals_failures_and_losses_are_recorded() {
    let tally = Tally::default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    metrics::with_local_recorder(&tally, || {
        rt.block_on(async {
            let store = MemoryStore::new();
            let provider: Arc<dyn LeaseProvider> =
                Arc::new(Observed::new(Arc::new(store.provider("m").unwrap())));
            let key = LeaseKey::new("k").unwrap();
            let ttl = Duration::from_secs(3);
            let lease = acquire(&provider, &key, AcquireOptions::ttl(ttl))
                .await
                .unwrap()
                .unwrap();
            // Held: a second acquire without waiting is not acquired.
            assert!(
                acquire(&provider, &key, AcquireOptions::ttl(ttl))
                    .await
                    .unwrap()
                    .is_none()
            );
            let guard =
                LeaseGuard::with_config(Arc::clone(&provider), lease, GuardConfig::default());
            tokio::time::sleep(ttl * 3).await;
            assert!(!guard.is_lost());
            // The store goes down: renewals fail until local validity ends.
            store.set_down(true);
            let reason = tokio::time::timeout(ttl * 2, guard.lost()).await.unwrap();
            assert!(reason.to_string().contains("unavailable"), "{reason}");
        });
    });
    let names = tally.names();
    for (id, at_least) in [
        (
            "lease_acquire_seconds{backend=memory,outcome=acquired}",
            1.0,
        ),
        (
            "lease_acquire_seconds{backend=memory,outcome=not_acquired}",
            1.0,
        ),
        ("lease_acquire_wait_seconds{backend=memory}", 2.0),
        (
            "lease_store_call_seconds{backend=memory,op=acquire,outcome=acquired}",
            1.0,
        ),
        (
            "lease_store_call_seconds{backend=memory,op=acquire,outcome=held}",
            1.0,
        ),
        (
            "lease_store_call_seconds{backend=memory,op=extend,outcome=ok}",
            3.0,
        ),
        (
            "lease_store_call_seconds{backend=memory,op=extend,outcome=unavailable}",
            1.0,
        ),
        ("lease_renewals_total{backend=memory}", 3.0),
        ("lease_renewal_failures_total{backend=memory}", 1.0),
        ("lease_lost_total{backend=memory,reason=expired}", 1.0),
    ] {
        assert!(
            tally.get(id) >= at_least,
            "{id}: {} in {names:#?}",
            tally.get(id)
        );
    }
}
