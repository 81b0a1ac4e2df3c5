//! One MySQL/MariaDB server, or the nodes of a Galera cluster.
//!
//! `mysql://user@h1:p1,h2:p2,h3:p3/db` names several servers. Each new
//! connection goes to the host that answered last, and on to the next when
//! it does not answer within the connect timeout or is not ready (a Galera
//! node outside the primary component, `wsrep_ready` off). Every node of a
//! Galera cluster takes writes, and a commit is certified by every node
//! before it returns, so any ready node will do; staying on one keeps the
//! writes of all clients on one node, where InnoDB's row locks order them
//! without certification conflicts.

use std::time::Duration;

use lease_api::backend::HostCursor;
use lease_api::{LeaseError, Result};
use sqlx::ConnectOptions;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};

#[derive(Debug)]
pub(crate) struct Hosts {
    options: Vec<MySqlConnectOptions>,
    /// The host that answered last (tried first); a caller that gives up
    /// on a host after half the shorter of the connect and response
    /// timeouts moves past it (a black-holed node would otherwise stay
    /// first for ever).
    cursor: HostCursor,
    connect_timeout: Duration,
}

/// Splits `mysql://user:pw@h1:p1,h2:p2/db?params` into one URL per host. A
/// URL with one host comes back as it is.
pub(crate) fn split_hosts(url: &str) -> Result<Vec<String>> {
    lease_api::backend::split_host_list(url).map_err(|why| {
        LeaseError::Config(format!(
            "invalid MySQL URL ({why}); expected mysql://user[:password]@host[:port][,host[:port]...]/database"
        ))
    })
}

impl Hosts {
    pub(crate) fn new(
        options: Vec<MySqlConnectOptions>,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Self {
        Hosts {
            cursor: HostCursor::new(options.len(), connect_timeout.min(response_timeout)),
            options,
            connect_timeout,
        }
    }

    pub(crate) fn is_multi(&self) -> bool {
        self.options.len() > 1
    }

    pub(crate) fn len(&self) -> usize {
        self.options.len()
    }

    /// How long one host may take to connect.
    pub(crate) fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The options of the host that answered last.
    pub(crate) fn current(&self) -> MySqlConnectOptions {
        self.options[self.cursor.current()].clone()
    }

    /// `host:port[,host:port...]`, for messages.
    pub(crate) fn display(&self) -> String {
        self.options
            .iter()
            .map(|o| format!("{}:{}", o.get_host(), o.get_port()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A connection to the first host, from the one that answered last,
    /// that connects within the connect timeout and is ready, with `setup`
    /// run on it.
    pub(crate) async fn connect(
        &self,
        setup: &str,
    ) -> std::result::Result<MySqlConnection, sqlx::Error> {
        let n = self.options.len();
        let mut last = None;
        // Every host once, from the one that answered last (see HostWalk).
        let mut walk = self.cursor.walk();
        while let Some(step) = walk.next_attempt() {
            let at = step.host();
            let attempt = async {
                let mut conn = self.options[at].connect().await?;
                sqlx::query(setup).execute(&mut conn).await?;
                if self.is_multi() {
                    match galera_state(&mut conn).await? {
                        Galera::Ready => {}
                        Galera::NotReady => {
                            return Err(sqlx::Error::Protocol(
                                "the node is not ready (wsrep_ready is OFF: outside the primary component)"
                                    .into(),
                            ));
                        }
                        // A primary and its asynchronous replicas are not
                        // interchangeable: a replica behind its primary
                        // would hand out tokens again.
                        Galera::Off => {
                            return Err(sqlx::Error::Configuration(
                                "several hosts must be the nodes of one Galera cluster; this server does not run Galera (wsrep_on is OFF)".into(),
                            ));
                        }
                    }
                }
                Ok(conn)
            };
            match tokio::time::timeout(self.connect_timeout, attempt).await {
                Ok(Ok(conn)) => {
                    step.succeeded();
                    return Ok(conn);
                }
                // A list that is not one Galera cluster: no other host helps.
                Ok(Err(e @ sqlx::Error::Configuration(_))) => {
                    step.failed();
                    return Err(e);
                }
                Ok(Err(e)) => last = Some(e),
                Err(_) => {
                    last = Some(sqlx::Error::Io(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the server did not answer within the connect timeout",
                    )));
                }
            }
            step.failed();
            if n > 1 {
                tracing::debug!(host = %format!("{}:{}", self.options[at].get_host(), self.options[at].get_port()), "MySQL host passed over");
            }
        }
        Err(last.unwrap_or(sqlx::Error::PoolClosed))
    }
}

/// What a server is to a list of hosts.
pub(crate) enum Galera {
    /// A Galera node in the primary component (`wsrep_ready` ON).
    Ready,
    /// A Galera node outside it.
    NotReady,
    /// Not a Galera node (`wsrep_on` off, or no such setting: MySQL).
    Off,
}

pub(crate) async fn galera_state(
    conn: &mut MySqlConnection,
) -> std::result::Result<Galera, sqlx::Error> {
    let on = |row: Option<(String, String)>| row.is_some_and(|(_, v)| v.eq_ignore_ascii_case("ON"));
    let wsrep: Option<(String, String)> = sqlx::query_as("SHOW VARIABLES LIKE 'wsrep_on'")
        .fetch_optional(&mut *conn)
        .await?;
    if !on(wsrep) {
        return Ok(Galera::Off);
    }
    let ready: Option<(String, String)> = sqlx::query_as("SHOW STATUS LIKE 'wsrep_ready'")
        .fetch_optional(conn)
        .await?;
    Ok(if on(ready) {
        Galera::Ready
    } else {
        Galera::NotReady
    })
}
