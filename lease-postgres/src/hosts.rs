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

use std::time::Duration;

use lease_api::backend::HostCursor;
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
    /// The host that last answered as the primary (tried first); a
    /// caller that gives up on a host after half the shorter of the
    /// connect and response timeouts moves past it.
    cursor: HostCursor,
    connect_timeout: Duration,
}

/// Splits `postgres://user:pw@h1:p1,h2:p2/db?params` into one URL per host.
/// A URL with one host comes back as it is.
fn split_hosts(url: &str) -> Result<Vec<String>> {
    lease_api::backend::split_host_list(url).map_err(|why| {
        LeaseError::Config(format!(
            "invalid PostgreSQL URL ({why}); expected postgres://user[:password]@host[:port][,host[:port]...]/database"
        ))
    })
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
            cursor: HostCursor::new(options.len(), connect_timeout.min(response_timeout)),
            options,
            connect_timeout,
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
        self.options[self.cursor.current()].clone()
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
    /// The last error of a host that failed to connect or answer; a
    /// `Protocol` error naming a standby when every host answered as one.
    pub(crate) async fn connect_primary(
        &self,
        tweak: impl Fn(PgConnectOptions) -> PgConnectOptions,
    ) -> std::result::Result<PgConnection, sqlx::Error> {
        if !self.is_multi() {
            return tweak(self.current()).connect().await;
        }
        let mut standby = None;
        // A host that failed otherwise than by being a standby: its error
        // says more than "a standby" (too many connections, refused).
        let mut failed = None;
        // Every host once, from the one that answered last (see HostWalk).
        let mut walk = self.cursor.walk();
        while let Some(step) = walk.next_attempt() {
            // Moves the starting point past this host unless it answers as
            // the primary, also when the caller's own deadline drops this
            // future mid-attempt after the host had time to answer (a
            // black-holed host would otherwise stay first for ever).
            let i = step.host();
            let attempt = async {
                let mut conn = tweak(self.options[i].clone()).connect().await?;
                let standby = !is_writable(&mut conn).await?;
                Ok::<_, sqlx::Error>((conn, standby))
            };
            match tokio::time::timeout(self.connect_timeout, attempt).await {
                Ok(Ok((conn, false))) => {
                    step.succeeded();
                    return Ok(conn);
                }
                Ok(Ok((_, true))) => {
                    standby = Some(sqlx::Error::Protocol(format!(
                        "{}:{} is a standby (in recovery)",
                        self.options[i].get_host(),
                        self.options[i].get_port()
                    )));
                }
                Ok(Err(e)) => failed = Some(e),
                Err(_) => {
                    failed = Some(sqlx::Error::Io(std::io::Error::new(
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
            step.failed();
        }
        Err(failed.or(standby).unwrap_or(sqlx::Error::PoolClosed))
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
