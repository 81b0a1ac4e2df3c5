//! Exit codes, and how errors map to them and are printed.

use std::process::ExitCode;
use std::time::Duration;

use leases::LeaseError;

pub(crate) const EXIT_USAGE: u8 = 64;
pub(crate) const EXIT_UNAVAILABLE: u8 = 69;
pub(crate) const EXIT_NOT_ACQUIRED: u8 = 75;
pub(crate) const EXIT_LOST: u8 = 79;
pub(crate) const EXIT_NOT_EXECUTABLE: u8 = 126;
pub(crate) const EXIT_NOT_FOUND: u8 = 127;
pub(crate) const EXIT_FREE: u8 = 3;
pub(crate) const EXIT_SUPERVISOR: u8 = 70;
/// The store refused our credentials, certificate or permissions (EX_CONFIG).
pub(crate) const EXIT_DENIED: u8 = 78;
/// How long `lease` waits at exit for background clean-ups (cancels of
/// acquires that timed out but may still run).
pub(crate) const FLUSH_LIMIT: Duration = Duration::from_secs(5);

/// Prints `msg` as `lease`'s error and returns `code`.
pub(crate) fn fail(code: u8, msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("lease: {msg}");
    ExitCode::from(code)
}

/// The exit code for a store or configuration error.
pub(crate) fn error_code(e: &LeaseError) -> u8 {
    match e {
        LeaseError::Unavailable { .. } | LeaseError::Timeout { .. } => EXIT_UNAVAILABLE,
        LeaseError::Backend { .. } => EXIT_UNAVAILABLE,
        LeaseError::Denied { .. } => EXIT_DENIED,
        _ => EXIT_USAGE,
    }
}

/// Like [`error_code`], with 79 for a lease that is no longer held.
pub(crate) fn lease_code(e: &LeaseError) -> u8 {
    if e.is_not_held() {
        EXIT_LOST
    } else {
        error_code(e)
    }
}

/// The error with each of its sources that adds something, for printing.
pub(crate) fn describe(e: &LeaseError) -> String {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        let text = s.to_string();
        if !msg.contains(&text) {
            msg.push_str(&format!(": {text}"));
        }
        src = s.source();
    }
    msg
}
