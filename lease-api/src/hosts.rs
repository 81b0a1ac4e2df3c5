//! Rotating among several hosts of one store (a Galera cluster's nodes,
//! PostgreSQL's primary and standbys): which host a connection tries first.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// The host a connection attempt starts from, and how an attempt on one
/// host moves it on: [`HostCursor::attempt`] hands out a [`HostAttempt`]
/// that steps the cursor past its host when the host failed, or when the
/// attempt is dropped after the host had half its patience to answer. The
/// second case is what keeps a black-holed host (it accepts and never
/// answers) from staying first for ever when the caller's own deadline
/// drops every attempt on it.
///
/// ```
/// use std::time::Duration;
/// use lease_api::backend::HostCursor;
///
/// let hosts = HostCursor::new(3, Duration::ZERO);
/// let attempt = hosts.attempt();
/// assert_eq!(attempt.host(), 0);
/// attempt.failed(); // the host did not answer
/// assert_eq!(hosts.current(), 1);
/// hosts.attempt().succeeded();
/// assert_eq!(hosts.current(), 1);
/// ```
#[derive(Debug)]
pub struct HostCursor {
    current: AtomicUsize,
    n: usize,
    patience: Duration,
}

/// One attempt on the cursor's current host; see [`HostCursor`].
#[derive(Debug)]
#[must_use = "an attempt steps past its host when dropped unresolved"]
pub struct HostAttempt<'a> {
    cursor: &'a HostCursor,
    host: usize,
    started: Instant,
    resolved: bool,
}

impl HostCursor {
    /// A cursor over `n` hosts (at least one), starting at the first. A
    /// host whose attempt is dropped after `patience / 2` is stepped past.
    pub fn new(n: usize, patience: Duration) -> Self {
        HostCursor {
            current: AtomicUsize::new(0),
            n: n.max(1),
            patience,
        }
    }

    /// The host the next attempt starts from.
    pub fn current(&self) -> usize {
        self.current.load(Ordering::Relaxed) % self.n
    }

    /// An attempt on the current host.
    pub fn attempt(&self) -> HostAttempt<'_> {
        self.attempt_on(self.current())
    }

    /// An attempt on `host` (modulo the number of hosts): for a caller that
    /// walks the hosts from where it started, whatever other attempts do
    /// to the cursor meanwhile.
    pub fn attempt_on(&self, host: usize) -> HostAttempt<'_> {
        HostAttempt {
            cursor: self,
            host: host % self.n,
            started: Instant::now(),
            resolved: false,
        }
    }

    /// Every host once, for one caller that tries them in turn until one
    /// serves; see [`HostWalk`].
    pub fn walk(&self) -> HostWalk<'_> {
        HostWalk {
            cursor: self,
            tried: vec![false; self.n],
            last: None,
        }
    }

    fn step_past(&self, host: usize) {
        let _ = self.current.compare_exchange(
            host,
            (host + 1) % self.n,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }
}

impl HostAttempt<'_> {
    /// The host this attempt is on.
    pub fn host(&self) -> usize {
        self.host
    }

    /// The host answered: later attempts start from it.
    pub fn succeeded(mut self) {
        self.resolved = true;
        self.cursor.current.store(self.host, Ordering::Relaxed);
    }

    /// The host failed: later attempts start from the next one (unless
    /// another attempt moved the cursor meanwhile).
    pub fn failed(mut self) {
        self.resolved = true;
        self.cursor.step_past(self.host);
    }
}

impl Drop for HostAttempt<'_> {
    fn drop(&mut self) {
        // Cut short by the caller: step past only a host that had long
        // enough to answer (a good host whose turn came as the caller's
        // deadline ran out keeps its place).
        if !self.resolved && self.started.elapsed() >= self.cursor.patience / 2 {
            self.cursor.step_past(self.host);
        }
    }
}

/// One caller's pass over the hosts: each host at most once, starting from
/// the cursor. Next comes where the cursor points now, when this walk has
/// not tried that host (another caller found it serving meanwhile), else
/// the next host in order it has not tried. Following the cursor alone
/// could try a host twice (concurrent failures move it back) and never
/// reach the one that serves; walking in order alone would pass by a host
/// another caller just found serving.
///
/// ```
/// use std::time::Duration;
/// use lease_api::backend::HostCursor;
///
/// let hosts = HostCursor::new(2, Duration::ZERO);
/// let mut walk = hosts.walk();
/// let first = walk.next_attempt().unwrap();
/// assert_eq!(first.host(), 0);
/// first.failed();
/// // Another caller fails on host 1 meanwhile: the cursor is back at 0.
/// hosts.attempt_on(1).failed();
/// assert_eq!(walk.next_attempt().unwrap().host(), 1);
/// assert!(walk.next_attempt().is_none());
/// ```
#[derive(Debug)]
pub struct HostWalk<'a> {
    cursor: &'a HostCursor,
    tried: Vec<bool>,
    last: Option<usize>,
}

impl<'a> HostWalk<'a> {
    /// An attempt on the next host to try, or `None` once every host was.
    pub fn next_attempt(&mut self) -> Option<HostAttempt<'a>> {
        let n = self.tried.len();
        let now = self.cursor.current();
        let host = if self.tried[now] {
            let from = self.last.unwrap_or(now);
            (1..=n).map(|d| (from + d) % n).find(|&h| !self.tried[h])?
        } else {
            now
        };
        self.tried[host] = true;
        self.last = Some(host);
        Some(self.cursor.attempt_on(host))
    }
}

/// Splits `scheme://user:pw@h1:p1,h2:p2/db?params` into one URL per host,
/// each with the scheme, user information, path and parameters of the
/// whole. A URL with one host comes back as it is.
///
/// # Errors
/// What is wrong, for the caller's own message: no scheme, or an empty
/// host in the list.
pub fn split_host_list(url: &str) -> std::result::Result<Vec<String>, &'static str> {
    let (scheme, rest) = url.split_once("://").ok_or("no scheme")?;
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), authority),
    };
    if !hosts.contains(',') {
        return Ok(vec![url.to_owned()]);
    }
    hosts
        .split(',')
        .map(|h| {
            let h = h.trim();
            if h.is_empty() {
                Err("an empty host in the host list")
            } else {
                Ok(format!("{scheme}://{userinfo}{h}{tail}"))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_lists_split_into_one_url_per_host() {
        assert_eq!(
            split_host_list("mysql://u:p@a:1, b:2,c/db?ssl-mode=required").unwrap(),
            [
                "mysql://u:p@a:1/db?ssl-mode=required",
                "mysql://u:p@b:2/db?ssl-mode=required",
                "mysql://u:p@c/db?ssl-mode=required"
            ]
        );
        assert_eq!(
            split_host_list("postgres://a/db").unwrap(),
            ["postgres://a/db"]
        );
        assert!(split_host_list("mysql://a,,b/db").is_err());
        assert!(split_host_list("a,b").is_err());
    }

    #[test]
    fn a_walk_tries_each_host_once_and_follows_a_host_found_serving() {
        let hosts = HostCursor::new(3, Duration::ZERO);
        let mut walk = hosts.walk();
        let a = walk.next_attempt().unwrap();
        assert_eq!(a.host(), 0);
        a.failed();
        // Another caller found host 2 serving: the walk goes there next,
        // past host 1.
        hosts.attempt_on(2).succeeded();
        let b = walk.next_attempt().unwrap();
        assert_eq!(b.host(), 2);
        b.failed();
        // The cursor is at 0 again (2 failed): tried, so on to 1.
        assert_eq!(hosts.current(), 0);
        assert_eq!(walk.next_attempt().unwrap().host(), 1);
        assert!(walk.next_attempt().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_attempt_steps_past_only_a_host_that_had_time() {
        let hosts = HostCursor::new(2, Duration::from_secs(2));
        drop(hosts.attempt());
        assert_eq!(hosts.current(), 0, "a host given no time keeps its place");
        let attempt = hosts.attempt();
        tokio::time::advance(Duration::from_secs(1)).await;
        drop(attempt);
        assert_eq!(
            hosts.current(),
            1,
            "a host that had time to answer is passed"
        );
        hosts.attempt().failed();
        assert_eq!(hosts.current(), 0, "the cursor wraps");
    }
}
