//! Holder identity: who holds a lease, in words a person can act on.
//!
//! The owner id ([`OwnerId`](crate::lease::OwnerId)) is what the store compares; it is
//! random and says nothing to an operator. Next to it every backend records a
//! holder label, by default `user@host:pid` of the process, which
//! [`inspect`](crate::LeaseProvider::inspect) returns in
//! [`LeaseInfo::holder`](crate::LeaseInfo::holder) and the `lease` command shows
//! for a held key. It is informational: no backend compares it.

use std::sync::{Arc, OnceLock, RwLock};

use crate::{LeaseError, Result};

/// The longest holder label, in bytes.
pub const MAX_HOLDER_BYTES: usize = 200;

static HOLDER: RwLock<Option<Arc<str>>> = RwLock::new(None);
static DEFAULT: OnceLock<Arc<str>> = OnceLock::new();

/// The holder label leases taken from now on in this process record.
///
/// Unless [`set_holder`] was called it is `user@host:pid`, read from `USER`
/// (or `LOGNAME`) and the kernel's host name.
pub fn holder() -> Arc<str> {
    if let Ok(set) = HOLDER.read()
        && let Some(h) = set.as_ref()
    {
        return Arc::clone(h);
    }
    Arc::clone(DEFAULT.get_or_init(|| Arc::from(default_holder())))
}

/// Sets the holder label for leases taken from now on in this process (the
/// `lease` command's `--holder`). Leases already held keep theirs.
///
/// # Errors
/// [`LeaseError::Config`] for an empty label, one over [`MAX_HOLDER_BYTES`], or
/// one with control characters (it is shown on terminals and in logs).
pub fn set_holder(label: &str) -> Result<()> {
    validate_holder(label)?;
    let mut slot = HOLDER
        .write()
        .map_err(|_| LeaseError::Config("the holder label lock is poisoned".into()))?;
    *slot = Some(Arc::from(label));
    Ok(())
}

/// Checks a holder label without setting it (see [`set_holder`]).
///
/// # Errors
/// As [`set_holder`].
pub fn validate_holder(label: &str) -> Result<()> {
    if label.is_empty() {
        return Err(LeaseError::Config("the holder label is empty".into()));
    }
    if label.len() > MAX_HOLDER_BYTES {
        return Err(LeaseError::Config(format!(
            "the holder label is {} bytes; at most {MAX_HOLDER_BYTES} are allowed",
            label.len()
        )));
    }
    if label.chars().any(char::is_control) {
        return Err(LeaseError::Config(format!(
            "the holder label {label:?} contains a control character"
        )));
    }
    Ok(())
}

fn default_holder() -> String {
    let user = ["USER", "LOGNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "unknown".into());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    let label = format!("{user}@{host}:{}", std::process::id());
    // Environment values can hold anything; keep the label printable and short.
    let mut clean: String = label
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    while clean.len() > MAX_HOLDER_BYTES {
        clean.pop();
    }
    clean
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_names_user_host_and_pid_and_is_valid() {
        let d = default_holder();
        assert!(d.ends_with(&format!(":{}", std::process::id())), "{d}");
        assert!(d.contains('@'), "{d}");
        validate_holder(&d).unwrap();
    }

    #[test]
    fn bad_labels_are_refused() {
        assert!(validate_holder("").is_err());
        assert!(validate_holder("a\nb").is_err());
        assert!(validate_holder(&"x".repeat(MAX_HOLDER_BYTES + 1)).is_err());
        validate_holder("ops: nightly job #1 (ü)").unwrap();
    }
}
