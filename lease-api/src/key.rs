//! Validated lease keys (contract clause C1).

use std::fmt;
use std::sync::Arc;

use crate::LeaseError;

/// The longest key, in bytes of UTF-8.
pub const MAX_KEY_BYTES: usize = 512;

/// A validated key: UTF-8, 1..=512 bytes, no NUL (C1).
///
/// Every other string is a legal key (`/`, `..`, `*`, `{}`, quotes, spaces,
/// emoji); providers must map distinct keys to distinct store entries. Cloning is
/// cheap (a reference count).
///
/// ```
/// use lease_api::LeaseKey;
/// let key = LeaseKey::new("batches/2026-12-02")?;
/// assert_eq!(key.as_str(), "batches/2026-12-02");
/// assert!(LeaseKey::new("").is_err());
/// assert!(LeaseKey::new("a\0b").is_err());
/// # Ok::<(), lease_api::LeaseError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseKey(Arc<str>);

impl LeaseKey {
    /// Validates `key`.
    ///
    /// # Errors
    /// [`LeaseError::InvalidKey`] when the key is empty, longer than
    /// [`MAX_KEY_BYTES`], or contains a NUL character.
    pub fn new(key: impl AsRef<str>) -> Result<Self, LeaseError> {
        let key = key.as_ref();
        if key.is_empty() {
            return Err(LeaseError::InvalidKey {
                reason: "the key is empty".into(),
            });
        }
        if key.len() > MAX_KEY_BYTES {
            return Err(LeaseError::InvalidKey {
                reason: format!(
                    "the key is {} bytes long; at most {MAX_KEY_BYTES} are allowed",
                    key.len()
                ),
            });
        }
        if let Some(at) = key.find('\0') {
            return Err(LeaseError::InvalidKey {
                reason: format!("the key contains a NUL character at byte {at}"),
            });
        }
        Ok(LeaseKey(Arc::from(key)))
    }

    /// The name of the queue in which fair waiters of this key's read/write
    /// lease (C19) stand: a queue of its own, apart from the fair waiters of
    /// the plain lease. It is longer than [`MAX_KEY_BYTES`], so no key a
    /// caller can make names it: the key, `\u{1}rw`, then `_` up to 513 bytes.
    pub(crate) fn read_write_queue(&self) -> LeaseKey {
        let mut name = format!("{}\u{1}rw", self.0);
        let pad = (MAX_KEY_BYTES + 1).saturating_sub(name.len());
        name.extend(std::iter::repeat_n('_', pad));
        LeaseKey(Arc::from(name))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for LeaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for LeaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for LeaseKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl TryFrom<&str> for LeaseKey {
    type Error = LeaseError;
    fn try_from(value: &str) -> Result<Self, Self::Error> {
        LeaseKey::new(value)
    }
}

impl TryFrom<String> for LeaseKey {
    type Error = LeaseError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        LeaseKey::new(value)
    }
}

impl std::str::FromStr for LeaseKey {
    type Err = LeaseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        LeaseKey::new(s)
    }
}

/// Checks a namespace: the same rules as a key, but at most 128 bytes.
///
/// # Errors
/// [`LeaseError::Config`] naming what is wrong.
pub fn validate_namespace(namespace: &str) -> Result<(), LeaseError> {
    if namespace.is_empty() || namespace.len() > 128 || namespace.contains('\0') {
        return Err(LeaseError::Config(format!(
            "namespace {namespace:?} must be 1..=128 bytes of UTF-8 without NUL"
        )));
    }
    Ok(())
}

/// Checks the namespace prefix given to a backend's `purge_namespaces`: it
/// must name something, since an empty prefix would match every namespace.
///
/// # Errors
/// [`LeaseError::Config`](crate::LeaseError::Config) for an empty prefix.
pub fn validate_purge_prefix(prefix: &str) -> crate::Result<()> {
    if prefix.is_empty() {
        return Err(crate::LeaseError::Config(
            "refusing to purge with an empty namespace prefix: it would match every namespace"
                .into(),
        ));
    }
    Ok(())
}

/// Checks a set of keys for a multi-key acquire (C18): at least one key, at
/// most `max_keys`, none twice. Every provider's
/// [`try_acquire_all`](crate::LeaseProvider::try_acquire_all) calls it before
/// touching the store, so a bad set changes nothing.
///
/// # Errors
/// [`LeaseError::Config`] naming what is wrong.
pub fn validate_key_set(keys: &[LeaseKey], max_keys: usize) -> Result<(), LeaseError> {
    if keys.is_empty() {
        return Err(LeaseError::Config(
            "an empty set of keys: name at least one key to acquire".into(),
        ));
    }
    if keys.len() > max_keys {
        return Err(LeaseError::Config(format!(
            "{} keys in one set, but this provider takes at most {max_keys} at once",
            keys.len()
        )));
    }
    let mut seen = std::collections::HashSet::with_capacity(keys.len());
    for key in keys {
        if !seen.insert(key) {
            return Err(LeaseError::Config(format!(
                "the key {key} appears twice in the set; name each key once"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_unusual_keys() {
        for k in [
            "/",
            "..",
            "a/../b",
            "*?[]{}",
            "'\"",
            " ",
            "🔒",
            "\u{1F600}x",
        ] {
            assert_eq!(LeaseKey::new(k).unwrap().as_str(), k);
        }
        let max = "é".repeat(MAX_KEY_BYTES / 2);
        assert_eq!(LeaseKey::new(&max).unwrap().as_str().len(), MAX_KEY_BYTES);
    }

    #[test]
    fn rejects_empty_long_and_nul_keys() {
        for bad in [String::new(), "x".repeat(MAX_KEY_BYTES + 1), "a\0".into()] {
            let err = LeaseKey::new(&bad).unwrap_err();
            assert!(matches!(err, LeaseError::InvalidKey { .. }), "{err}");
        }
        let msg = LeaseKey::new("x".repeat(600)).unwrap_err().to_string();
        assert!(msg.contains("600 bytes"), "{msg}");
    }

    #[test]
    fn namespaces_are_checked() {
        assert!(validate_namespace("lease").is_ok());
        assert!(validate_namespace("").is_err());
        assert!(validate_namespace(&"n".repeat(129)).is_err());
    }
}
