//! One PostgreSQL server, or several of which one is the writable primary.
//!
//! `postgres://user@h1:p1,h2:p2/db` names a primary and its standbys in any
//! order, as libpq's multi-host URLs do. Every new connection is checked
//! with `SELECT pg_is_in_recovery()` (libpq's
//! `target_session_attrs=read-write`, which also passes over a primary made
//! read-only): a standby, or a host that does not answer within the connect
//! timeout, is passed over for the next, even when the caller's own
//! deadline cuts the attempt short. The host
//! that answered as primary is tried first from then on. After a promotion,
//! connections to the old primary fail (it is gone) or are refused writes
//! (`25006`, it was demoted); either closes them, and the next connection
//! finds the new primary.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lease_api::{LeaseError, Result};
use sqlx::ConnectOptions;
use sqlx::postgres::{PgConnectOptions, PgConnection};

/// libpq's read-write test: false on a standby, and on a primary made
/// read-only (as switchovers and full disks do).
pub(crate) async fn is_writable(conn: &mut PgConnection) -> std::result::Result<bool, sqlx::Error> {
    let read_only: bool = sqlx::query_scalar(
        "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only')::bool",
    )
    .fetch_one(conn)
    .await?;
    Ok(!read_only)
}

#[derive(Debug)]
pub(crate) struct Hosts {
    options: Vec<PgConnectOptions>,
    /// The host that last answered as the primary (tried first).
    current: AtomicUsize,
    connect_timeout: Duration,
    /// How long a host may take before a caller that gives up on it moves
    /// past it: the shorter of the connect and response timeouts.
    patience: Duration,
}

/// Splits `postgres://user:pw@h1:p1,h2:p2/db?params` into one URL per host.
/// A URL with one host comes back as it is.
fn split_hosts(url: &str) -> Result<Vec<String>> {
    let bad = |why: &str| {
        LeaseError::Config(format!(
            "invalid PostgreSQL URL ({why}); expected postgres://user[:password]@host[:port][,host[:port]...]/database"
        ))
    };
    let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
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
            if h.trim().is_empty() {
                Err(bad("an empty host in the host list"))
            } else {
                Ok(format!("{scheme}://{userinfo}{}{tail}", h.trim()))
            }
        })
        .collect()
}

impl Hosts {
    /// The hosts of `url`.
    ///
    /// # Errors
    /// `Config` for a malformed URL.
    pub(crate) fn parse(
        url: &str,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<Self> {
        let options = split_hosts(url)?
            .iter()
            .map(|u| {
                u.parse::<PgConnectOptions>().map_err(|e| {
                    LeaseError::Config(format!(
                        "invalid PostgreSQL URL ({e}); expected postgres://user[:password]@host[:port][,host[:port]...]/database"
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Hosts {
            options,
            current: AtomicUsize::new(0),
            connect_timeout,
            patience: connect_timeout.min(response_timeout),
        })
    }

    /// How many hosts.
    pub(crate) fn len(&self) -> usize {
        self.options.len()
    }

    /// More than one host: connections are checked for the primary.
    pub(crate) fn is_multi(&self) -> bool {
        self.options.len() > 1
    }

    /// The options of the host that last answered as the primary.
    pub(crate) fn current(&self) -> PgConnectOptions {
        let i = self.current.load(Ordering::Relaxed) % self.options.len();
        self.options[i].clone()
    }

    /// How long one host may take to connect and answer.
    pub(crate) fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// `host:port` of every host, comma-separated.
    pub(crate) fn display(&self) -> String {
        self.options
            .iter()
            .map(|o| format!("{}:{}", o.get_host(), o.get_port()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A new connection to the primary, made with `tweak`ed options. With
    /// one host, a plain connection. With several, each host in turn from
    /// the last primary, each bounded by the connect timeout; a host that
    /// fails, or is a standby, moves the starting point past it before the
    /// next is tried, so a caller cut short by its own deadline still makes
    /// progress on its next call.
    ///
    /// # Errors
    /// The last host's error; `25006`-like `Protocol` when every host that
    /// answered is a standby.
    pub(crate) async fn connect_primary(
        &self,
        tweak: impl Fn(PgConnectOptions) -> PgConnectOptions,
    ) -> std::result::Result<PgConnection, sqlx::Error> {
        if !self.is_multi() {
            return tweak(self.current()).connect().await;
        }
        let n = self.options.len();
        let mut last = None;
        for _ in 0..n {
            let i = self.current.load(Ordering::Relaxed) % n;
            // Moves the starting point past this host unless it answers as
            // the primary, also when the caller's own deadline drops this
            // future mid-attempt after the host had time to answer (a
            // black-holed host would otherwise stay first for ever).
            let mut step = StepPast {
                current: &self.current,
                from: i,
                n,
                armed: true,
                failed: false,
                started: tokio::time::Instant::now(),
                patience: self.patience,
            };
            let attempt = async {
                let mut conn = tweak(self.options[i].clone()).connect().await?;
                let standby = !is_writable(&mut conn).await?;
                Ok::<_, sqlx::Error>((conn, standby))
            };
            match tokio::time::timeout(self.connect_timeout, attempt).await {
                Ok(Ok((conn, false))) => {
                    step.armed = false;
                    self.current.store(i, Ordering::Relaxed);
                    return Ok(conn);
                }
                Ok(Ok((_, true))) => {
                    last = Some(sqlx::Error::Protocol(format!(
                        "{}:{} is a standby (in recovery)",
                        self.options[i].get_host(),
                        self.options[i].get_port()
                    )));
                }
                Ok(Err(e)) => last = Some(e),
                Err(_) => {
                    last = Some(sqlx::Error::Io(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                            "{}:{} did not answer within {:?}",
                            self.options[i].get_host(),
                            self.options[i].get_port(),
                            self.connect_timeout
                        ),
                    )));
                }
            }
            step.failed = true;
            drop(step);
        }
        Err(last.unwrap_or(sqlx::Error::PoolClosed))
    }
}

/// Moves `current` from `from` to the next host when dropped armed, after
/// the host failed or had half its `patience` to answer.
struct StepPast<'a> {
    current: &'a AtomicUsize,
    from: usize,
    n: usize,
    armed: bool,
    failed: bool,
    started: tokio::time::Instant,
    patience: Duration,
}

impl Drop for StepPast<'_> {
    fn drop(&mut self) {
        // Cut short by the caller: step past only a host that had long
        // enough to answer (a good host whose turn came as the caller's
        // deadline ran out keeps its place).
        let gave_up_on_it = self.failed || self.started.elapsed() >= self.patience / 2;
        if self.armed && gave_up_on_it {
            let _ = self.current.compare_exchange(
                self.from,
                (self.from + 1) % self.n,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_url_per_host_with_credentials_path_and_parameters() {
        assert_eq!(
            split_hosts("postgres://u:p@a:1,b:2/db?sslmode=disable").unwrap(),
            [
                "postgres://u:p@a:1/db?sslmode=disable",
                "postgres://u:p@b:2/db?sslmode=disable"
            ]
        );
        assert_eq!(
            split_hosts("postgres://a:1/db").unwrap(),
            ["postgres://a:1/db"]
        );
        assert!(split_hosts("postgres://a:1,,b/db").is_err());
        let h = Hosts::parse(
            "postgres://u@a:1,b:2/db",
            Duration::from_secs(1),
            Duration::from_secs(1),
        )
        .unwrap();
        assert!(h.is_multi());
        assert_eq!(h.display(), "a:1,b:2");
    }
}
