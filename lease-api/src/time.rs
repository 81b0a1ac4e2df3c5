//! Instant arithmetic that saturates instead of panicking.

use std::time::Duration;

use tokio::time::Instant;

/// About 30 years: what "never" means for a deadline (tokio uses the same horizon).
const FAR_FUTURE: Duration = Duration::from_secs(30 * 365 * 24 * 3600);

/// `at + d`, or a deadline far in the future when that would overflow, so a
/// huge duration (`Duration::MAX`, "wait forever") never panics.
pub fn deadline_after(at: Instant, d: Duration) -> Instant {
    at.checked_add(d)
        .or_else(|| at.checked_add(FAR_FUTURE))
        .unwrap_or(at)
}

/// `now + d`, saturating like [`deadline_after`].
pub fn deadline_in(d: Duration) -> Instant {
    deadline_after(Instant::now(), d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_durations_saturate() {
        let now = Instant::now();
        assert!(deadline_after(now, Duration::MAX) > now + Duration::from_secs(3600 * 24 * 365));
        assert_eq!(
            deadline_after(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
        assert!(deadline_in(Duration::MAX) > now);
    }
}
