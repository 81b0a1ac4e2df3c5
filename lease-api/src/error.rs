//! The one error type of the contract (C14).

use std::time::Duration;

use crate::{FencingToken, LeaseKey};

/// A boxed error from a store client, kept as the `source` of a [`LeaseError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong with a lease operation (contract clause C14).
///
/// "The key is held by someone else" is **not** an error: `try_acquire` reports it
/// as [`TryAcquire::Held`](crate::TryAcquire::Held).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// The key is empty, longer than 512 bytes, or contains NUL (C1).
    #[error("invalid lease key: {reason}")]
    InvalidKey {
        /// Why the key was refused.
        reason: String,
    },
    /// The TTL is zero, below the provider's minimum, or above its maximum (C3).
    #[error("invalid TTL {ttl:?}: {reason}")]
    InvalidTtl {
        /// The TTL that was asked for.
        ttl: Duration,
        /// Why it was refused.
        reason: String,
    },
    /// `extend` on a lease that is no longer held by this owner: it expired, or
    /// another holder took the key (C5, C6).
    #[error("lease on {key:?} with token {token} is lost: it expired or another holder took it")]
    Lost {
        /// The key of the lease.
        key: LeaseKey,
        /// The token of the lease that was lost.
        token: FencingToken,
    },
    /// `release` of a lease that is not held by this owner (already released,
    /// expired, or taken over) (C5, C7).
    #[error("lease on {key:?} with token {token} is not held by this owner")]
    NotHeld {
        /// The key of the lease.
        key: LeaseKey,
        /// The token of the lease that was not held.
        token: FencingToken,
    },
    /// The store could not be reached, or stopped answering (C14).
    #[error("store unavailable: {message}")]
    Unavailable {
        /// What failed, in words.
        message: String,
        /// The client's error, when there is one.
        #[source]
        source: Option<BoxError>,
    },
    /// The store did not answer one operation within its request timeout. The
    /// operation may still have been applied: providers make sure it leaves no
    /// lease behind. Transient.
    #[error("{operation} timed out after {after:?}")]
    Timeout {
        /// The operation that timed out.
        operation: &'static str,
        /// How long it was given.
        after: Duration,
    },
    /// The provider was configured wrongly (bad URL, bad identifier, ...).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The store refused who we are: a wrong user or password, a server
    /// certificate that is not trusted or does not match the host, or a
    /// missing permission. Not transient: a person must fix the credentials,
    /// the CA or the grants (the `lease` command exits 78).
    #[error("access denied: {message}")]
    Denied {
        /// What was refused, in words (never the secret itself).
        message: String,
        /// The client's error, when there is one.
        #[source]
        source: Option<BoxError>,
    },
    /// The store refused the operation or answered with something the
    /// provider did not expect (a missing table, a wrong data type, a script
    /// error). Not transient: retrying will not help.
    #[error("store error: {message}")]
    Backend {
        /// What failed, in words.
        message: String,
        /// The client's error, when there is one.
        #[source]
        source: Option<BoxError>,
    },
}

impl LeaseError {
    /// An [`LeaseError::Unavailable`] with a client error as its source.
    pub fn unavailable(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        LeaseError::Unavailable {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// A [`LeaseError::Backend`] with a client error as its source.
    pub fn backend(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        LeaseError::Backend {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// [`LeaseError::Lost`] for `lease`: this owner no longer holds it.
    pub fn lost(lease: &crate::Lease) -> Self {
        LeaseError::Lost {
            key: lease.key().clone(),
            token: lease.token(),
        }
    }

    /// [`LeaseError::NotHeld`] for `lease`: a release found it not held.
    pub fn not_held(lease: &crate::Lease) -> Self {
        LeaseError::NotHeld {
            key: lease.key().clone(),
            token: lease.token(),
        }
    }

    /// A [`LeaseError::Denied`] with a client error as its source.
    pub fn denied(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        LeaseError::Denied {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// A [`LeaseError::Backend`] without a source.
    pub fn protocol(message: impl Into<String>) -> Self {
        LeaseError::Backend {
            message: message.into(),
            source: None,
        }
    }

    /// True for `Lost` and `NotHeld`: this owner does not hold the lease.
    pub fn is_not_held(&self) -> bool {
        matches!(self, LeaseError::Lost { .. } | LeaseError::NotHeld { .. })
    }

    /// True for errors that may go away by retrying: `Unavailable` and
    /// `Timeout`. Everything else (bad input, configuration, a `Backend` error
    /// such as a refused password, a missing permission, a missing table or a
    /// wrong data type) needs a person to fix it, so [`acquire`](crate::acquire)
    /// returns it at once instead of retrying for its whole wait. Adapters class
    /// connection loss, timeouts and "server busy, try again" answers as
    /// `Unavailable`.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            LeaseError::Unavailable { .. } | LeaseError::Timeout { .. }
        )
    }

    /// A [`LeaseError::Timeout`]: `operation` got no answer within `after`.
    pub fn timeout(operation: &'static str, after: std::time::Duration) -> Self {
        LeaseError::Timeout { operation, after }
    }
}

/// Shorthand for results of lease operations.
pub type Result<T, E = LeaseError> = std::result::Result<T, E>;
