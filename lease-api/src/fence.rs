//! A fence gate: the resource side of fencing tokens (C12).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::{FencingToken, LeaseKey};

/// A write or read was refused because a newer holder already used the resource.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "stale fencing token {presented} for {key:?}: a holder with token {highest} already wrote or read"
)]
pub struct StaleToken {
    /// The key of the write.
    pub key: LeaseKey,
    /// The token the writer presented.
    pub presented: FencingToken,
    /// The token that shut the caller out: the highest writer token the gate
    /// admitted for this key, or, for a writer refused after a newer reader,
    /// that reader's token.
    pub highest: FencingToken,
}

/// What a gate admitted for one key.
#[derive(Clone, Copy, Debug, Default)]
struct Seen {
    /// The highest token admitted to write (plain holders and writers).
    written: Option<FencingToken>,
    /// The highest reader token admitted to read (C19).
    read: Option<FencingToken>,
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
    seen: Mutex<HashMap<LeaseKey, Seen>>,
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
        let mut map = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let seen = map.entry(key.clone()).or_default();
        // A writer's token is above every earlier reader's (C19): one below a
        // reader that already read is a writer from before that reader. (Equal
        // is the holder itself: a token is one grant's.)
        let refused_by = match (seen.written, seen.read) {
            (Some(w), _) if token < w => Some(w),
            (_, Some(r)) if token < r => Some(r),
            _ => None,
        };
        if let Some(highest) = refused_by {
            return Err(StaleToken {
                key: key.clone(),
                presented: token,
                highest,
            });
        }
        seen.written = Some(token);
        Ok(write())
    }

    /// Runs `read` for a reader of `key`'s read/write lease (C19) holding
    /// `token` with [`writer_epoch`](crate::LeaseKind::Read) `writer_epoch`,
    /// unless a newer writer has already written through this gate: such a
    /// reader started before that writer and may read what it half wrote, or
    /// miss it. An admitted read records `token`, so a writer from before this
    /// reader (a paused one that comes back) can no longer write under it.
    /// Readers never fence each other out.
    ///
    /// ```
    /// # use lease_api::{FenceGate, FencingToken, LeaseKey};
    /// let gate = FenceGate::new();
    /// let key = LeaseKey::new("partitions")?;
    /// gate.write(&key, FencingToken(7), || "compacted").unwrap();
    /// // A reader that came after writer 7 reads; one from before it does not.
    /// assert_eq!(gate.read(&key, FencingToken(8), FencingToken(7), || "rows"), Ok("rows"));
    /// assert!(gate.read(&key, FencingToken(5), FencingToken(3), || "rows").is_err());
    /// // Writer 7 paused past its lease, and reader 8 read since: 7 may not write.
    /// assert!(gate.write(&key, FencingToken(7), || "late").is_err());
    /// # Ok::<(), lease_api::LeaseError>(())
    /// ```
    ///
    /// # Errors
    /// [`StaleToken`] when a writer newer than `writer_epoch` wrote; `read` does not run.
    pub fn read<T>(
        &self,
        key: &LeaseKey,
        token: FencingToken,
        writer_epoch: FencingToken,
        read: impl FnOnce() -> T,
    ) -> Result<T, StaleToken> {
        let mut map = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let seen = map.entry(key.clone()).or_default();
        if let Some(highest) = seen.written
            && writer_epoch < highest
        {
            return Err(StaleToken {
                key: key.clone(),
                presented: writer_epoch,
                highest,
            });
        }
        seen.read = seen.read.max(Some(token));
        Ok(read())
    }

    /// The highest token admitted to write `key`, if any.
    pub fn highest(&self, key: &LeaseKey) -> Option<FencingToken> {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .and_then(|s| s.written)
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

    /// C19: readers share, a reader from before the newest writer is refused,
    /// and a writer from before a reader that read is refused.
    #[test]
    fn readers_and_writers_fence_each_other_by_the_token_rule() {
        let gate = FenceGate::new();
        let k = LeaseKey::new("k").unwrap();
        assert!(gate.write(&k, FencingToken(10), || ()).is_ok());
        assert!(
            gate.read(&k, FencingToken(11), FencingToken(10), || ())
                .is_ok()
        );
        assert!(
            gate.read(&k, FencingToken(12), FencingToken(10), || ())
                .is_ok()
        );
        // An older reader of the same epoch still reads: readers never fence readers.
        assert!(
            gate.read(&k, FencingToken(11), FencingToken(10), || ())
                .is_ok()
        );
        // Writer 10 comes back after the readers read.
        let mut ran = false;
        let err = gate.write(&k, FencingToken(10), || ran = true).unwrap_err();
        assert!(!ran);
        assert_eq!(err.highest, FencingToken(12));
        assert!(gate.write(&k, FencingToken(13), || ()).is_ok());
        let err = gate
            .read(&k, FencingToken(12), FencingToken(10), || ())
            .unwrap_err();
        assert_eq!(err.highest, FencingToken(13));
        assert_eq!(gate.highest(&k), Some(FencingToken(13)));
        // A reader does not count as a write.
        let other = LeaseKey::new("other").unwrap();
        assert!(
            gate.read(&other, FencingToken(3), FencingToken(0), || ())
                .is_ok()
        );
        assert_eq!(gate.highest(&other), None);
    }
}
