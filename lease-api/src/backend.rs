//! Helpers for backend authors: what a `LeaseProvider` implementation needs
//! and a user of leases does not (the crate root holds the user side).

pub use crate::caps::ProbedCapabilities;
pub use crate::hub::WatchHub;
pub use crate::key::validate_purge_prefix;
pub use crate::lease::drift_margin;
pub use crate::provider::NotifyWatch;

/// True when `e`, or an error that caused it, is a TLS handshake refusal: a
/// server certificate that is not trusted or does not name the host, or a
/// server that refused our client certificate. Clients often keep rustls's
/// error behind a type-erased wrapper, so this reads rustls's own wording
/// along the `source()` chain. Such a failure is a matter of configuration
/// ([`LeaseError::Denied`](crate::LeaseError::Denied)), not of reachability.
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
