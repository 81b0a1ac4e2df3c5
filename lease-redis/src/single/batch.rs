//! `ExtendBatch`: the arguments of one batched extend, and one answer per
//! lease. Shared with Redlock.

use std::time::Duration;

use lease_api::{Capabilities, Lease, LeaseKey, Result};

use crate::scripts::held_by;
use crate::time::millis;

/// The arguments of one [`EXTEND_MANY`](crate::scripts::EXTEND_MANY) call: only leases with a valid TTL
/// go to the server (C3); the others are answered with their TTL error.
pub(crate) struct ExtendBatch {
    keys: Vec<String>,
    args: Vec<String>,
    ttls: Vec<Result<Duration>>,
}

impl ExtendBatch {
    pub(crate) fn new(
        caps: &Capabilities,
        leases: &[Lease],
        redis_key: impl Fn(&LeaseKey) -> String,
    ) -> Self {
        let ttls: Vec<Result<Duration>> = leases.iter().map(|l| caps.grant_ttl(l.ttl())).collect();
        let mut keys = Vec::with_capacity(leases.len());
        let mut args = Vec::with_capacity(leases.len() * 2);
        for (lease, ttl) in leases.iter().zip(&ttls) {
            if let Ok(ttl) = ttl {
                keys.push(redis_key(lease.key()));
                args.push(held_by(lease));
                args.push(millis(*ttl).to_string());
            }
        }
        ExtendBatch { keys, args, ttls }
    }

    /// How many leases go to the server.
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The longest TTL sent.
    pub(crate) fn longest_ttl(&self) -> Duration {
        self.ttls
            .iter()
            .filter_map(|t| t.as_ref().ok())
            .copied()
            .max()
            .unwrap_or_default()
    }

    pub(crate) fn refs(&self) -> (Vec<&str>, Vec<&str>) {
        (
            self.keys.iter().map(String::as_str).collect(),
            self.args.iter().map(String::as_str).collect(),
        )
    }

    /// One answer per lease: `sent` is called, in order, for each lease that
    /// went to the server, with its granted TTL.
    pub(crate) fn answer(
        self,
        leases: &[Lease],
        mut sent: impl FnMut(&Lease, Duration) -> Result<Lease>,
    ) -> Vec<Result<Lease>> {
        leases
            .iter()
            .zip(self.ttls)
            .map(|(lease, ttl)| sent(lease, ttl?))
            .collect()
    }
}
