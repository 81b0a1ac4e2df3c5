//! What a Patroni-managed cluster promises on failover, read from Patroni's
//! REST API (`GET /config`): how long it takes to notice a lost primary
//! (`ttl`, `loop_wait`), and whether it promotes only a synchronous standby
//! (`synchronous_mode`) or one up to `maximum_lag_on_failover` behind.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The failover settings of a Patroni cluster (its dynamic configuration).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PatroniSettings {
    /// The leader key's TTL: a standby may take over this long after the
    /// primary's agent last renewed it.
    pub(crate) ttl: Duration,
    /// How often each agent runs its loop (and notices the lapsed key).
    pub(crate) loop_wait: Duration,
    /// How long an agent retries the DCS and PostgreSQL before it acts.
    pub(crate) retry_timeout: Duration,
    /// How long the agent restarts a crashed primary before it fails over
    /// instead (`primary_start_timeout`).
    pub(crate) primary_start_timeout: Duration,
    /// Only the standby Patroni's sync key names may be promoted.
    pub(crate) synchronous_mode: bool,
    /// How far behind (bytes of WAL) an asynchronous standby may be and
    /// still be promoted.
    pub(crate) maximum_lag_on_failover: u64,
    /// Maintenance mode (`pause`, as `patronictl pause` sets): the agents
    /// promote nobody by themselves.
    pub(crate) pause: bool,
}

impl PatroniSettings {
    /// Patroni's own defaults, for a setting its configuration leaves out.
    const DEFAULT_TTL: u64 = 30;
    const DEFAULT_LOOP_WAIT: u64 = 10;
    const DEFAULT_RETRY_TIMEOUT: u64 = 10;
    const DEFAULT_PRIMARY_START_TIMEOUT: u64 = 300;
    const DEFAULT_MAX_LAG: u64 = 1_048_576;

    /// Patroni's defaults (`ttl` 30 s, `loop_wait` 10 s, asynchronous,
    /// 1 MiB of lag): what a cluster whose REST API does not answer is
    /// assumed to run.
    pub(crate) fn defaults() -> Self {
        PatroniSettings {
            ttl: Duration::from_secs(Self::DEFAULT_TTL),
            loop_wait: Duration::from_secs(Self::DEFAULT_LOOP_WAIT),
            retry_timeout: Duration::from_secs(Self::DEFAULT_RETRY_TIMEOUT),
            primary_start_timeout: Duration::from_secs(Self::DEFAULT_PRIMARY_START_TIMEOUT),
            synchronous_mode: false,
            maximum_lag_on_failover: Self::DEFAULT_MAX_LAG,
            pause: false,
        }
    }

    /// From the JSON of `GET /config`.
    pub(crate) fn from_json(body: &[u8]) -> Result<Self, String> {
        let v: serde_json::Value =
            serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
        if !v.is_object() {
            return Err("not a JSON object".into());
        }
        let secs = |name: &str, default: u64| -> Result<u64, String> {
            match v.get(name) {
                None | Some(serde_json::Value::Null) => Ok(default),
                Some(x) => x
                    .as_u64()
                    .or_else(|| x.as_str().and_then(|s| s.trim().parse().ok()))
                    .ok_or_else(|| format!("{name} is {x}, not a whole number")),
            }
        };
        let synchronous_mode = match v.get("synchronous_mode") {
            None | Some(serde_json::Value::Null) => false,
            Some(serde_json::Value::Bool(b)) => *b,
            // Patroni 4 also takes "quorum" (quorum commit: still only
            // standbys that had the commit are promoted).
            Some(serde_json::Value::String(s)) => {
                matches!(s.to_ascii_lowercase().as_str(), "on" | "true" | "quorum")
            }
            Some(x) => return Err(format!("synchronous_mode is {x}")),
        };
        // As Patroni reads it (its parse_bool of the value's text): `true`,
        // `on`, `yes` and `1`, in any case, pause; anything else does not.
        let pause = v.get("pause").is_some_and(|x| {
            let text = match x {
                serde_json::Value::String(s) => s.to_ascii_lowercase(),
                other => other.to_string(),
            };
            matches!(text.trim(), "true" | "on" | "yes" | "1")
        });
        // Patroni raises settings below its minimums before it uses them
        // (ttl 20 s, loop_wait 1 s, retry_timeout 3 s); a configuration
        // stored as written may still show the smaller value.
        Ok(PatroniSettings {
            ttl: Duration::from_secs(secs("ttl", Self::DEFAULT_TTL)?.max(20)),
            loop_wait: Duration::from_secs(secs("loop_wait", Self::DEFAULT_LOOP_WAIT)?.max(1)),
            retry_timeout: Duration::from_secs(
                secs("retry_timeout", Self::DEFAULT_RETRY_TIMEOUT)?.max(3),
            ),
            primary_start_timeout: Duration::from_secs(secs(
                "primary_start_timeout",
                Self::DEFAULT_PRIMARY_START_TIMEOUT,
            )?),
            synchronous_mode,
            maximum_lag_on_failover: secs("maximum_lag_on_failover", Self::DEFAULT_MAX_LAG)?,
            pause,
        })
    }

    /// How long after a primary is lost Patroni may take to promote a
    /// standby, the worse of two cases. The host dies: the leader key lapses
    /// one `ttl` after its last renewal, a standby notices within one
    /// `loop_wait`, and its promotion (asking the other members, `pg_ctl
    /// promote`, the sync key) is bounded by one `retry_timeout`. PostgreSQL
    /// crashes under a live agent: the agent restarts it for up to
    /// `primary_start_timeout` before it hands over, noticed within a loop.
    pub(crate) fn detection(&self) -> Duration {
        let host_dies = self
            .ttl
            .saturating_add(self.loop_wait)
            .saturating_add(self.retry_timeout);
        let server_crashes = self
            .primary_start_timeout
            .saturating_add(self.loop_wait)
            .saturating_add(self.retry_timeout);
        host_dies.max(server_crashes)
    }
}

/// Reads the settings from the first of `addrs` (`host:port` of Patroni's
/// REST API, plain HTTP) that answers, each bounded by `timeout`.
pub(crate) async fn read_settings(
    addrs: &[String],
    timeout: Duration,
) -> Result<PatroniSettings, String> {
    let mut failures = Vec::new();
    for addr in addrs {
        match tokio::time::timeout(timeout, get_config(addr)).await {
            Ok(Ok(body)) => match PatroniSettings::from_json(&body) {
                Ok(s) => return Ok(s),
                Err(e) => failures.push(format!("{addr}: /config {e}")),
            },
            Ok(Err(e)) => failures.push(format!("{addr}: {e}")),
            Err(_) => failures.push(format!("{addr}: no answer within {timeout:?}")),
        }
    }
    Err(failures.join("; "))
}

/// The body of `GET /config` on `addr`.
async fn get_config(addr: &str) -> Result<Vec<u8>, String> {
    /// Patroni's configuration is a few KiB; more is not its answer.
    const LIMIT: u64 = 256 * 1024;
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    s.write_all(
        format!("GET /config HTTP/1.0\r\nHost: {host}\r\nAccept: application/json\r\n\r\n")
            .as_bytes(),
    )
    .await
    .map_err(|e| format!("cannot send: {e}"))?;
    let mut answer = Vec::new();
    (&mut s)
        .take(LIMIT)
        .read_to_end(&mut answer)
        .await
        .map_err(|e| format!("cannot read: {e}"))?;
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no HTTP answer")?;
    let head = String::from_utf8_lossy(&answer[..split]);
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status != "200" {
        let line = head.lines().next().unwrap_or("");
        return Err(format!("GET /config answered {line:?}"));
    }
    Ok(answer[split + 4..].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_come_from_the_config_or_patronis_defaults() {
        let s = PatroniSettings::from_json(
            br#"{"ttl": 10, "loop_wait": 1, "retry_timeout": 4, "primary_start_timeout": 0, "maximum_lag_on_failover": 1024, "synchronous_mode": true, "postgresql": {}}"#,
        )
        .unwrap();
        // Patroni's floor: a ttl of 10 runs as 20.
        assert_eq!(s.ttl, Duration::from_secs(20));
        assert_eq!(s.detection(), Duration::from_secs(25));
        assert!(s.synchronous_mode);
        assert_eq!(s.maximum_lag_on_failover, 1024);
        let d = PatroniSettings::from_json(b"{}").unwrap();
        // Patroni's defaults: a crashed primary is restarted for 300 s.
        assert_eq!(d.detection(), Duration::from_secs(320));
        let slow_restart = PatroniSettings::from_json(
            br#"{"ttl": 10, "loop_wait": 1, "retry_timeout": 4, "primary_start_timeout": 60}"#,
        )
        .unwrap();
        assert_eq!(slow_restart.detection(), Duration::from_secs(65));
        let long_ttl = PatroniSettings::from_json(
            br#"{"ttl": 60, "loop_wait": 10, "retry_timeout": 10, "primary_start_timeout": 30}"#,
        )
        .unwrap();
        assert_eq!(long_ttl.detection(), Duration::from_secs(80));
        assert!(!d.synchronous_mode);
        assert!(
            PatroniSettings::from_json(br#"{"synchronous_mode": "quorum"}"#)
                .unwrap()
                .synchronous_mode
        );
        assert!(PatroniSettings::from_json(br#"{"ttl": "x"}"#).is_err());
        // A huge setting saturates, never panics.
        let huge = PatroniSettings::from_json(
            br#"{"ttl": 18446744073709551615, "loop_wait": 18446744073709551615}"#,
        )
        .unwrap();
        assert!(huge.detection() >= Duration::from_secs(u64::MAX / 2));
        assert!(!d.pause);
        assert!(
            PatroniSettings::from_json(br#"{"pause": true}"#)
                .unwrap()
                .pause
        );
        // `patronictl edit-config --set pause=1` stores the number.
        for paused in [
            r#"{"pause": 1}"#,
            r#"{"pause": "Yes"}"#,
            r#"{"pause": "on"}"#,
        ] {
            assert!(
                PatroniSettings::from_json(paused.as_bytes()).unwrap().pause,
                "{paused}"
            );
        }
        for running in [
            r#"{"pause": 0}"#,
            r#"{"pause": "off"}"#,
            r#"{"pause": null}"#,
        ] {
            assert!(
                !PatroniSettings::from_json(running.as_bytes())
                    .unwrap()
                    .pause,
                "{running}"
            );
        }
        assert!(PatroniSettings::from_json(b"[1]").is_err());
        assert!(PatroniSettings::from_json(b"<html>").is_err());
    }
}
