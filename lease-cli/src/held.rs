//! What `lease run` holds while the command runs: one key's guard, or a set
//! of keys renewed and lost together.

use leases::{Lease, LeaseGuard, LeaseKind, LeaseSetGuard, LostReason, Result};
use tokio::time::Instant;

/// One key, or every key of a set.
pub(crate) enum Held {
    One(LeaseGuard),
    Set(LeaseSetGuard),
}

impl Held {
    /// Resolves when the key, or any key of the set, is lost.
    pub(crate) async fn lost(&self) -> LostReason {
        match self {
            Held::One(g) => g.lost().await,
            Held::Set(g) => g.lost().await,
        }
    }

    pub(crate) fn is_lost(&self) -> bool {
        match self {
            Held::One(g) => g.is_lost(),
            Held::Set(g) => g.is_lost(),
        }
    }

    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        match self {
            Held::One(g) => g.lost_reason(),
            Held::Set(g) => g.lost_reason(),
        }
    }

    /// Until when every key is surely held, as last renewed.
    pub(crate) fn valid_until(&self) -> Instant {
        match self {
            Held::One(g) => g.lease().valid_until(),
            Held::Set(g) => g.valid_until(),
        }
    }

    /// Stops renewing and releases every key.
    pub(crate) async fn release(self) -> Result<()> {
        match self {
            Held::One(g) => g.release().await,
            Held::Set(g) => g.release().await,
        }
    }

    /// Stops renewing and leaves every key to run out by its TTL.
    pub(crate) async fn detach(self) {
        match self {
            Held::One(g) => {
                g.detach().await;
            }
            Held::Set(g) => {
                g.detach().await;
            }
        }
    }
}

/// The environment a command gets: `LEASE_KEY`, `LEASE_TOKEN` (of the first
/// key) and `LEASE_HOLDER`; a reader also `LEASE_WRITER_EPOCH`; with several keys also `LEASE_KEY_COUNT` and
/// `LEASE_KEY_<i>` / `LEASE_TOKEN_<i>` for i = 1..=count, in the order of
/// the `--key` options (a key may hold any character, so no list is joined).
pub(crate) fn environment(leases: &[Lease]) -> Vec<(String, String)> {
    let mut env = Vec::new();
    if let Some(first) = leases.first() {
        env.push(("LEASE_KEY".into(), first.key().as_str().to_owned()));
        env.push(("LEASE_TOKEN".into(), first.token().to_string()));
        env.push(("LEASE_HOLDER".into(), first.holder().to_owned()));
        if let LeaseKind::Read { writer_epoch } = first.kind() {
            env.push(("LEASE_WRITER_EPOCH".into(), writer_epoch.to_string()));
        }
    }
    if leases.len() > 1 {
        env.push(("LEASE_KEY_COUNT".into(), leases.len().to_string()));
        for (i, lease) in leases.iter().enumerate() {
            env.push((
                format!("LEASE_KEY_{}", i + 1),
                lease.key().as_str().to_owned(),
            ));
            env.push((format!("LEASE_TOKEN_{}", i + 1), lease.token().to_string()));
        }
    }
    env
}

/// The keys and tokens, for messages: `a (token 7)` or `a, b (tokens 7, 9)`.
pub(crate) fn describe_keys(leases: &[Lease]) -> String {
    let keys: Vec<&str> = leases.iter().map(|l| l.key().as_str()).collect();
    let tokens: Vec<String> = leases.iter().map(|l| l.token().to_string()).collect();
    if leases.len() == 1 {
        format!("{} (token {})", keys.join(", "), tokens.join(", "))
    } else {
        format!("{} (tokens {})", keys.join(", "), tokens.join(", "))
    }
}
