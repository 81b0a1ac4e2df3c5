//! `SessionConfig`: how a lease session holds its leases, and the renewal
//! timing derived from it.

use std::time::Duration;

use tokio::time::Instant;

use crate::Lease;

/// How a [`LeaseSession`](crate::LeaseSession) holds its leases.
///
/// ```
/// use std::time::Duration;
/// use lease_api::SessionConfig;
///
/// let config = SessionConfig::ttl(Duration::from_secs(30)).renew_every(Duration::from_secs(5));
/// assert_eq!(config.ttl, Duration::from_secs(30));
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SessionConfig {
    /// The TTL of every lease of the session.
    pub ttl: Duration,
    /// How often the session renews all its leases. Default: a third of the
    /// validity window, as [`LeaseGuard`](crate::LeaseGuard) does.
    pub renew_every: Option<Duration>,
    /// After a failed renewal round, retry after this long. Default: a tenth
    /// of the validity window, between 10 ms and 1 s.
    pub retry_every: Option<Duration>,
    /// Fire a lease's lost signal this long before its local validity ends
    /// when renewals keep failing. Default: a tenth of the window, at most 1 s.
    pub lost_margin: Option<Duration>,
    /// How many renewal calls run at once. Default 4.
    pub parallel_batches: usize,
}

impl SessionConfig {
    /// Leases of `ttl`, with defaults for everything else.
    pub fn ttl(ttl: Duration) -> Self {
        SessionConfig {
            ttl,
            renew_every: None,
            retry_every: None,
            lost_margin: None,
            parallel_batches: 4,
        }
    }

    /// Sets [`renew_every`](Self::renew_every).
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    /// Sets [`retry_every`](Self::retry_every).
    pub fn retry_every(mut self, every: Duration) -> Self {
        self.retry_every = Some(every);
        self
    }

    /// Sets [`lost_margin`](Self::lost_margin).
    pub fn lost_margin(mut self, margin: Duration) -> Self {
        self.lost_margin = Some(margin);
        self
    }

    /// Sets [`parallel_batches`](Self::parallel_batches) (at least 1).
    pub fn parallel_batches(mut self, n: usize) -> Self {
        self.parallel_batches = n.max(1);
        self
    }
}

/// When a session renews its leases and when it gives one up as lost,
/// derived from the shortest validity window among them (what the renewal
/// loop runs; public for the `lease-model` checker, which explores it).
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub(crate) window: Duration,
    pub(crate) renew_every: Duration,
    pub(crate) retry_every: Duration,
    pub(crate) lost_margin: Duration,
}

impl Timing {
    /// The timing of a guard whose validity window is `window`, as
    /// [`LeaseGuard`](crate::LeaseGuard) derives it.
    pub fn new(window: Duration, config: &SessionConfig) -> Self {
        let lost_margin = config
            .lost_margin
            .unwrap_or((window / 10).min(Duration::from_secs(1)))
            .min(window / 2);
        let renew_every = config
            .renew_every
            .unwrap_or(window / 3)
            .min(window.saturating_sub(lost_margin) / 2)
            .max(Duration::from_millis(1));
        let retry_every = config
            .retry_every
            .unwrap_or((window / 10).clamp(Duration::from_millis(10), Duration::from_secs(1)))
            .max(Duration::from_millis(1));
        Timing {
            window,
            renew_every,
            retry_every,
            lost_margin,
        }
    }

    /// How long after a round's start the next round runs.
    pub fn renew_every(&self) -> Duration {
        self.renew_every
    }

    /// How long after a failed round the next one runs.
    pub fn retry_every(&self) -> Duration {
        self.retry_every
    }

    /// When `lease`'s lost signal fires unless a renewal moved its validity.
    pub fn fire_at(&self, lease: &Lease) -> Instant {
        self.fire_at_of(lease.valid_until())
    }

    /// When a lease valid until `valid_until` fires: the lost margin before.
    pub fn fire_at_of(&self, valid_until: Instant) -> Instant {
        valid_until
            .checked_sub(self.lost_margin)
            .unwrap_or(valid_until)
    }
}
