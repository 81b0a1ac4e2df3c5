//! A fence gate: the resource side of fencing tokens (C12).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::{FencingToken, LeaseKey};

/// A write was refused because a newer holder already wrote.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("stale fencing token {presented} for {key:?}: a holder with token {highest} already wrote")]
pub struct StaleToken {
    /// The key of the write.
    pub key: LeaseKey,
    /// The token the writer presented.
    pub presented: FencingToken,
    /// The highest token the gate has admitted for this key.
    pub highest: FencingToken,
}

/// Admits a write only if its token is >= the highest token seen for its key.
///
/// Put one in front of the resource a lease protects. A holder that paused past
/// its TTL and comes back with an old token is refused once the next holder has
/// written. The check and the write happen under one lock, so two writers can
/// never both pass with out-of-order tokens.
///
/// ```
/// use lease_api::{FenceGate, FencingToken, LeaseKey};
/// let gate = FenceGate::new();
/// let key = LeaseKey::new("ledger").unwrap();
/// assert!(gate.admit(&key, FencingToken(7)).is_ok());
/// assert!(gate.admit(&key, FencingToken(7)).is_ok()); // same holder writes again
/// assert!(gate.admit(&key, FencingToken(6)).is_err()); // a stale holder
/// ```
#[derive(Debug, Default)]
pub struct FenceGate {
    highest: Mutex<HashMap<LeaseKey, FencingToken>>,
}

impl FenceGate {
    /// An empty gate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `token` for `key` if it is not older than the highest seen.
    ///
    /// # Errors
    /// [`StaleToken`] when a higher token was already admitted for `key`.
    pub fn admit(&self, key: &LeaseKey, token: FencingToken) -> Result<(), StaleToken> {
        self.write(key, token, || ())
    }

    /// Runs `write` only if `token` is admitted, under the gate's lock.
    ///
    /// # Errors
    /// [`StaleToken`] (and `write` is not run) when a higher token was admitted.
    pub fn write<T>(
        &self,
        key: &LeaseKey,
        token: FencingToken,
        write: impl FnOnce() -> T,
    ) -> Result<T, StaleToken> {
        let mut map = self.highest.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&highest) = map.get(key)
            && token < highest
        {
            return Err(StaleToken {
                key: key.clone(),
                presented: token,
                highest,
            });
        }
        map.insert(key.clone(), token);
        Ok(write())
    }

    /// Runs `read` for a reader of `key`'s read/write lease whose
    /// [`writer_epoch`](crate::LeaseKind::Read) is `writer_epoch` (C19), unless
    /// a newer writer has already written through this gate: such a reader
    /// started before that writer and may read what it half wrote, or miss
    /// it. Records nothing: readers never fence each other out.
    ///
    /// ```
    /// # use lease_api::{FenceGate, FencingToken, LeaseKey};
    /// let gate = FenceGate::new();
    /// let key = LeaseKey::new("partitions")?;
    /// gate.write(&key, FencingToken(7), || "compacted").unwrap();
    /// // A reader that came after writer 7 reads; one from before it does not.
    /// assert_eq!(gate.read(&key, FencingToken(7), || "rows"), Ok("rows"));
    /// assert!(gate.read(&key, FencingToken(3), || "rows").is_err());
    /// # Ok::<(), lease_api::LeaseError>(())
    /// ```
    ///
    /// # Errors
    /// [`StaleToken`] when a writer newer than `writer_epoch` wrote; `read` does not run.
    pub fn read<T>(
        &self,
        key: &LeaseKey,
        writer_epoch: FencingToken,
        read: impl FnOnce() -> T,
    ) -> Result<T, StaleToken> {
        if let Some(highest) = self.highest(key)
            && writer_epoch < highest
        {
            return Err(StaleToken {
                key: key.clone(),
                presented: writer_epoch,
                highest,
            });
        }
        Ok(read())
    }

    /// The highest token admitted for `key`, if any.
    pub fn highest(&self, key: &LeaseKey) -> Option<FencingToken> {
        self.highest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn older_token_is_rejected_and_write_not_run() {
        let gate = FenceGate::new();
        let k = LeaseKey::new("k").unwrap();
        let other = LeaseKey::new("other").unwrap();
        assert_eq!(gate.write(&k, FencingToken(5), || 1), Ok(1));
        let mut ran = false;
        let err = gate.write(&k, FencingToken(4), || ran = true).unwrap_err();
        assert!(!ran);
        assert_eq!(err.highest, FencingToken(5));
        assert_eq!(err.presented, FencingToken(4));
        assert!(gate.admit(&k, FencingToken(6)).is_ok());
        assert!(gate.admit(&k, FencingToken(5)).is_err());
        // Keys are fenced independently.
        assert!(gate.admit(&other, FencingToken(1)).is_ok());
        assert_eq!(gate.highest(&k), Some(FencingToken(6)));
    }
}
