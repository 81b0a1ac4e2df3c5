//! Helpers for backend authors: what a `LeaseProvider` implementation needs
//! and a user of leases does not (the crate root holds the user side).

pub use crate::caps::{DEFAULT_MAX_TTL, ProbedCapabilities};
pub use crate::error::BoxError;
pub use crate::holder::{MAX_HOLDER_BYTES, validate_holder};
pub use crate::hub::WatchHub;
pub use crate::key::{MAX_KEY_BYTES, validate_namespace, validate_purge_prefix};
pub use crate::layered::{Answer, Hook, Layered, Op, Outcome};
pub use crate::lease::{LeaseHandle, OwnerId, drift_margin};
pub use crate::memory::DEFAULT_NAMESPACE;
pub use crate::observe::ObserveHook;
pub use crate::queue::{MAX_TICKET_TTL, Place, Ticket, WaitQueue};
pub use crate::session_store::SessionStore;
pub use crate::time::{deadline_after, deadline_in};
pub use crate::watch::{KeyWatch, MAX_BLIND_WAIT, NotifyWatch, ReadyWatch, SleepWatch};

use std::future::Future;
use std::time::Duration;

use crate::LeaseError;

/// Bounds one store call by `limit`: the call's own error goes through
/// `map_err`, and running out of time is [`LeaseError::Timeout`] naming
/// `operation`. Every provider bounds its calls with this, so a store that
/// stops answering is reported the same way on every backend.
///
/// # Errors
/// `map_err` of the call's error, or `Timeout` after `limit`.
pub async fn bounded<T, E>(
    operation: &'static str,
    limit: Duration,
    call: impl Future<Output = Result<T, E>>,
    map_err: impl FnOnce(E) -> LeaseError,
) -> crate::Result<T> {
    match tokio::time::timeout(limit, call).await {
        Ok(r) => r.map_err(map_err),
        Err(_) => Err(LeaseError::timeout(operation, limit)),
    }
}

/// True when `e`, or an error that caused it, is a TLS handshake refusal: a
/// server certificate that is not trusted or does not name the host, or a
/// server that refused our client certificate. Clients often keep rustls's
/// error behind a type-erased wrapper, so this reads rustls's own wording
/// along the `source()` chain. Such a failure is a matter of configuration
/// ([`LeaseError::Denied`]), not of reachability.
pub fn is_tls_refusal(e: &(dyn std::error::Error + 'static)) -> bool {
    const MARKS: [&str; 5] = [
        "invalid peer certificate",
        "received fatal alert",
        "peer is incompatible",
        "peer sent no certificates",
        "certificate verify failed",
    ];
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        let text = err.to_string();
        if MARKS.iter().any(|m| text.contains(m)) {
            return true;
        }
        cur = err.source();
    }
    false
}
