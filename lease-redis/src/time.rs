//! Durations as one node needs them: its timeouts, and milliseconds for
//! Redis. A leaf module.

use std::time::Duration;

/// Timeouts of one node.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timeouts {
    pub connect: Duration,
    pub response: Duration,
}

/// `ttl` in whole milliseconds, as `PX` and the scripts take it.
pub(crate) fn millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)
}
