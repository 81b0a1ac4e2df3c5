//! What the library records through the `metrics` facade (with the
//! `metrics` feature; nothing without it). A leaf module: the guard, the
//! session, `acquire` and `Observed` all report through it.

use std::time::Duration;

use crate::LeaseError;

/// The outcome label of an error.
pub(crate) fn error_outcome(e: &LeaseError) -> &'static str {
    match e {
        LeaseError::Lost { .. } => "lost",
        LeaseError::NotHeld { .. } => "not_held",
        LeaseError::Unavailable { .. } => "unavailable",
        LeaseError::Timeout { .. } => "timeout",
        LeaseError::Denied { .. } => "denied",
        LeaseError::InvalidKey { .. } | LeaseError::InvalidTtl { .. } | LeaseError::Config(_) => {
            "invalid"
        }
        _ => "error",
    }
}

#[cfg(feature = "metrics")]
mod m {
    use super::Duration;

    pub(crate) fn call(
        backend: &'static str,
        op: &'static str,
        outcome: &'static str,
        d: Duration,
    ) {
        metrics::histogram!("lease_store_call_seconds", "backend" => backend, "op" => op, "outcome" => outcome)
            .record(d.as_secs_f64());
    }
    pub(crate) fn acquire(
        backend: &'static str,
        outcome: &'static str,
        d: Duration,
        waited: Duration,
    ) {
        metrics::histogram!("lease_acquire_seconds", "backend" => backend, "outcome" => outcome)
            .record(d.as_secs_f64());
        metrics::histogram!("lease_acquire_wait_seconds", "backend" => backend)
            .record(waited.as_secs_f64());
    }
    pub(crate) fn renewal(backend: &'static str, ok: bool) {
        if ok {
            metrics::counter!("lease_renewals_total", "backend" => backend).increment(1);
        } else {
            metrics::counter!("lease_renewal_failures_total", "backend" => backend).increment(1);
        }
    }
    pub(crate) fn lost(backend: &'static str, reason: &'static str) {
        metrics::counter!("lease_lost_total", "backend" => backend, "reason" => reason)
            .increment(1);
    }
}

#[cfg(not(feature = "metrics"))]
mod m {
    use super::Duration;

    pub(crate) fn call(_: &'static str, _: &'static str, _: &'static str, _: Duration) {}
    pub(crate) fn acquire(_: &'static str, _: &'static str, _: Duration, _: Duration) {}
    pub(crate) fn renewal(_: &'static str, _: bool) {}
    pub(crate) fn lost(_: &'static str, _: &'static str) {}
}

pub(crate) use m::{
    acquire as record_acquire, call, lost as record_lost, renewal as record_renewal,
};
