//! Redis under Sentinel (finding the primary, and what Sentinel says about
//! its failovers) and Redis Cluster URLs.
//!
//! `redis+sentinel://[user:password@]host:port,host:port,.../<master-name>[/<db>][?wait=N]`
//! names the Sentinels and the monitored master. The credentials are the data
//! nodes'; Sentinels are asked without them. The primary is found the way the
//! Sentinel client guidelines describe: ask each Sentinel in turn (starting
//! with the one that answered last) for the master's address, then ask that
//! server `ROLE` and use it only if it says `master`. A Sentinel that is
//! down, or still names a primary that is gone or was demoted, is passed
//! over for the next.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lease_api::{LeaseError, Result};
use redis::Value;

use crate::time::Timeouts;

/// How many replicas acknowledge each acquire and extend by default.
pub(crate) const DEFAULT_WAIT_REPLICAS: u32 = 1;

/// Sentinel's own default `down-after-milliseconds`, used until the live
/// Sentinels answered.
pub(crate) const DEFAULT_DOWN_AFTER: Duration = Duration::from_secs(30);

/// What a failover takes beyond `down-after-milliseconds`: the Sentinels
/// agreeing the primary is down (their periodic `is-master-down-by-addr`,
/// once a second), electing a leader, promoting the best replica and seeing
/// it report `role:master` (Sentinel reads a promoted replica's INFO once a
/// second). Measured on loopback at about 3 s; this allows for a vote that
/// splits once and is held again.
pub(crate) const ELECTION_AND_PROMOTION: Duration = Duration::from_secs(6);

/// A parsed `redis+sentinel://` URL.
#[derive(Debug)]
pub(crate) struct SentinelTarget {
    /// `host:port` of each Sentinel.
    sentinels: Vec<String>,
    master: String,
    /// `user:password@` or empty: the data nodes' credentials.
    userinfo: String,
    db: u32,
    /// How many replicas must acknowledge each acquire and extend.
    pub(crate) wait_replicas: u32,
    /// The Sentinel that answered last.
    preferred: AtomicUsize,
}

fn bad(url: &str, why: &str) -> LeaseError {
    LeaseError::Config(format!(
        "invalid Sentinel URL {:?}: {why}; expected redis+sentinel://[user:password@]host:port,host:port,.../<master-name>[/<db>][?wait=N]",
        describe(url)
    ))
}

/// The URL without its credentials.
pub(crate) fn describe(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "redis+sentinel".into();
    };
    let rest = rest.split('?').next().unwrap_or(rest);
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    let hosts = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    format!("{scheme}://{hosts}{path}")
}

impl SentinelTarget {
    /// True for the URLs this module handles.
    pub(crate) fn is_sentinel_url(url: &str) -> bool {
        url.get(..17)
            .is_some_and(|s| s.eq_ignore_ascii_case("redis+sentinel://"))
    }

    pub(crate) fn parse(url: &str) -> Result<Self> {
        let rest = url
            .get(17..)
            .filter(|_| Self::is_sentinel_url(url))
            .ok_or_else(|| bad(url, "the scheme must be redis+sentinel://"))?;
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = rest
            .split_once('/')
            .ok_or_else(|| bad(url, "the master name is missing"))?;
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (format!("{u}@"), h),
            None => (String::new(), authority),
        };
        let mut sentinels = Vec::new();
        for h in hosts.split(',') {
            let h = h.trim();
            if h.is_empty() {
                return Err(bad(url, "an empty Sentinel address"));
            }
            let with_port = match h.rsplit_once(':') {
                Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                    h.to_owned()
                }
                Some(_) => return Err(bad(url, &format!("{h:?} is not host:port"))),
                None => format!("{h}:26379"),
            };
            sentinels.push(with_port);
        }
        let mut parts = path.split('/');
        let master = parts.next().unwrap_or_default().to_owned();
        if master.is_empty() {
            return Err(bad(url, "the master name is missing"));
        }
        let db = match parts.next() {
            None | Some("") => 0,
            Some(d) => d
                .parse()
                .map_err(|_| bad(url, &format!("{d:?} is not a database number")))?,
        };
        if parts.next().is_some() {
            return Err(bad(url, "the path is /<master-name>[/<db>]"));
        }
        let mut wait_replicas = DEFAULT_WAIT_REPLICAS;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("wait", n)) => {
                    wait_replicas = n
                        .parse()
                        .map_err(|_| bad(url, &format!("wait={n:?} is not a replica count")))?;
                }
                _ => return Err(bad(url, &format!("unknown parameter {pair:?}"))),
            }
        }
        Ok(SentinelTarget {
            sentinels,
            master,
            userinfo,
            db,
            wait_replicas,
            preferred: AtomicUsize::new(0),
        })
    }

    /// The data node URL for `host:port`, with the configured credentials.
    fn node_url(&self, addr: &str) -> String {
        format!("redis://{}{addr}/{}", self.userinfo, self.db)
    }

    /// Runs `cmd` on a fresh connection to `url`, bounded by the timeouts.
    async fn ask(url: &str, cmd: &redis::Cmd, timeouts: Timeouts) -> Option<Value> {
        let client = redis::Client::open(url).ok()?;
        let call = async {
            let mut conn = client.get_multiplexed_async_connection().await.ok()?;
            cmd.query_async::<Value>(&mut conn).await.ok()
        };
        tokio::time::timeout(timeouts.connect + timeouts.response, call)
            .await
            .ok()
            .flatten()
    }

    /// Asks the Sentinels, in turn, for the primary and returns its URL once
    /// the server there says it is the primary.
    ///
    /// # Errors
    /// `Unavailable` when no Sentinel names a primary that answers as one.
    pub(crate) async fn resolve(&self, timeouts: Timeouts) -> Result<String> {
        let first = self.preferred.load(Ordering::Relaxed);
        let mut tried = Vec::new();
        for i in 0..self.sentinels.len() {
            let at = (first + i) % self.sentinels.len();
            let sentinel = &self.sentinels[at];
            let mut cmd = redis::cmd("SENTINEL");
            cmd.arg("get-master-addr-by-name").arg(&self.master);
            let addr = match Self::ask(&format!("redis://{sentinel}"), &cmd, timeouts).await {
                Some(Value::Array(a)) => match a.as_slice() {
                    [host, port] => {
                        let host: Option<String> = redis::from_redis_value_ref(host).ok();
                        let port: Option<String> = redis::from_redis_value_ref(port).ok();
                        host.zip(port).map(|(h, p)| format!("{h}:{p}"))
                    }
                    _ => None,
                },
                _ => None,
            };
            let Some(addr) = addr else {
                tried.push(format!("{sentinel}: no answer for {:?}", self.master));
                continue;
            };
            let url = self.node_url(&addr);
            let role = Self::ask(&url, &redis::cmd("ROLE"), timeouts).await;
            let is_primary = matches!(&role, Some(Value::Array(r))
                if r.first().and_then(|v| redis::from_redis_value_ref::<String>(v).ok()).as_deref() == Some("master"));
            if is_primary {
                self.preferred.store(at, Ordering::Relaxed);
                return Ok(url);
            }
            tried.push(format!("{sentinel} names {addr}, which is not a primary"));
        }
        Err(LeaseError::unavailable(
            format!(
                "no Sentinel names a reachable primary for {:?} ({})",
                self.master,
                tried.join("; ")
            ),
            std::io::Error::other("no primary"),
        ))
    }

    /// The monitored master's `down-after-milliseconds`, as the first
    /// Sentinel that answers reports it.
    pub(crate) async fn down_after(&self, timeouts: Timeouts) -> Option<Duration> {
        for sentinel in &self.sentinels {
            let mut cmd = redis::cmd("SENTINEL");
            cmd.arg("master").arg(&self.master);
            let fields = match Self::ask(&format!("redis://{sentinel}"), &cmd, timeouts).await {
                Some(Value::Array(items)) => items
                    .chunks(2)
                    .filter_map(|kv| match kv {
                        [k, v] => redis::from_redis_value_ref::<String>(k)
                            .ok()
                            .zip(redis::from_redis_value_ref::<String>(v).ok()),
                        _ => None,
                    })
                    .collect::<Vec<_>>(),
                Some(Value::Map(pairs)) => pairs
                    .iter()
                    .filter_map(|(k, v)| {
                        redis::from_redis_value_ref::<String>(k)
                            .ok()
                            .zip(redis::from_redis_value_ref::<String>(v).ok())
                    })
                    .collect(),
                _ => continue,
            };
            if let Some(ms) = fields
                .iter()
                .find(|(k, _)| k == "down-after-milliseconds")
                .and_then(|(_, v)| v.parse::<u64>().ok())
            {
                return Some(Duration::from_millis(ms));
            }
        }
        None
    }
}

/// A parsed `redis+cluster://` URL: the seed nodes and the credentials.
#[derive(Debug)]
pub(crate) struct ClusterTarget {
    seeds: Vec<String>,
    /// How many replicas must acknowledge each acquire and extend.
    pub(crate) wait_replicas: u32,
}

fn bad_cluster(url: &str, why: &str) -> LeaseError {
    LeaseError::Config(format!(
        "invalid Redis Cluster URL {:?}: {why}; expected redis+cluster://[user:password@]host:port,host:port,...[?wait=N]",
        describe(url)
    ))
}

impl ClusterTarget {
    /// True for the URLs this handles.
    pub(crate) fn is_cluster_url(url: &str) -> bool {
        url.get(..16)
            .is_some_and(|s| s.eq_ignore_ascii_case("redis+cluster://"))
    }

    pub(crate) fn parse(url: &str) -> Result<Self> {
        let rest = url
            .get(16..)
            .filter(|_| Self::is_cluster_url(url))
            .ok_or_else(|| bad_cluster(url, "the scheme must be redis+cluster://"))?;
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        if !path.is_empty() && path != "0" {
            return Err(bad_cluster(url, "a cluster has database 0 only"));
        }
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (format!("{u}@"), h),
            None => (String::new(), authority),
        };
        let mut seeds = Vec::new();
        for h in hosts.split(',') {
            let h = h.trim();
            match h.rsplit_once(':') {
                Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                    seeds.push(format!("redis://{userinfo}{h}"));
                }
                _ => return Err(bad_cluster(url, &format!("{h:?} is not host:port"))),
            }
        }
        let mut wait_replicas = DEFAULT_WAIT_REPLICAS;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("wait", n)) => {
                    wait_replicas = n.parse().map_err(|_| {
                        bad_cluster(url, &format!("wait={n:?} is not a replica count"))
                    })?;
                }
                _ => return Err(bad_cluster(url, &format!("unknown parameter {pair:?}"))),
            }
        }
        Ok(ClusterTarget {
            seeds,
            wait_replicas,
        })
    }

    /// `redis://[user:password@]host:port` of each seed node.
    pub(crate) fn seed_urls(&self) -> &[String] {
        &self.seeds
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cluster_seeds_credentials_and_wait() {
        let t = ClusterTarget::parse("redis+cluster://u:p@a:1,b:2?wait=0").unwrap();
        assert_eq!(t.seed_urls(), ["redis://u:p@a:1", "redis://u:p@b:2"]);
        assert_eq!(t.wait_replicas, 0);
        let d = ClusterTarget::parse("redis+cluster://a:1/").unwrap();
        assert_eq!(d.wait_replicas, DEFAULT_WAIT_REPLICAS);
        for bad in [
            "redis+cluster://a",
            "redis+cluster://a:1/3",
            "redis+cluster://a:1,,b:2",
            "redis+cluster://a:1?x=1",
            "redis://a:1",
        ] {
            assert!(ClusterTarget::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn parses_hosts_master_db_credentials_and_wait() {
        let t = SentinelTarget::parse("redis+sentinel://u:p@a:1,b:2,c/mymaster/3?wait=2").unwrap();
        assert_eq!(t.sentinels, ["a:1", "b:2", "c:26379"]);
        assert_eq!(t.master, "mymaster");
        assert_eq!(t.db, 3);
        assert_eq!(t.wait_replicas, 2);
        assert_eq!(t.node_url("10.0.0.1:6379"), "redis://u:p@10.0.0.1:6379/3");
        let d = SentinelTarget::parse("redis+sentinel://a:1/m").unwrap();
        assert_eq!((d.db, d.wait_replicas), (0, DEFAULT_WAIT_REPLICAS));
        assert_eq!(
            describe("redis+sentinel://u:secret@a:1,b:2/m?wait=1"),
            "redis+sentinel://a:1,b:2/m"
        );
    }

    #[test]
    fn refuses_malformed_urls_without_showing_the_password() {
        for bad in [
            "redis+sentinel://a:1",
            "redis+sentinel://a:1/",
            "redis+sentinel://a:x/m",
            "redis+sentinel://a:1,,b:2/m",
            "redis+sentinel://a:1/m/x",
            "redis+sentinel://a:1/m/0/extra",
            "redis+sentinel://a:1/m?wait=-1",
            "redis+sentinel://a:1/m?nope=1",
            "redis://a:1/m",
        ] {
            let e = SentinelTarget::parse(bad).unwrap_err();
            assert!(matches!(e, LeaseError::Config(_)), "{bad}: {e}");
        }
        let e = SentinelTarget::parse("redis+sentinel://u:secret@a:1").unwrap_err();
        assert!(!e.to_string().contains("secret"), "{e}");
    }
}
