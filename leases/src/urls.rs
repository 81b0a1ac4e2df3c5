//! Strict parsing of store URLs, and redaction of the secrets they carry.

use lease_api::{LeaseError, Result};

/// The URL with every password replaced by `***`: the password of each
/// `user:password@` in the authority (several for host lists), and the values
/// of `password`, `pass` and `sslpassword` query parameters. What error
/// messages, `Debug` and the CLI print instead of the URL itself.
///
/// ```
/// assert_eq!(
///     leases::redact("redis://app:s3cret@cache:6379/0"),
///     "redis://app:***@cache:6379/0"
/// );
/// ```
pub fn redact(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((s, r)) => (Some(s), r),
        None => (None, url),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let hosts: Vec<String> = authority
        .split(',')
        .map(|part| match part.rsplit_once('@') {
            // A bare `user@host` names a user, as in every URL.
            Some((userinfo, host)) => match userinfo.split_once(':') {
                Some((user, _)) => format!("{user}:***@{host}"),
                None => part.to_owned(),
            },
            None => part.to_owned(),
        })
        .collect();
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let (query, fragment) = match query.split_once('#') {
                Some((q, f)) => (q, Some(f)),
                None => (query, None),
            };
            let pairs: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((k, _))
                        if ["password", "pass", "sslpassword"]
                            .contains(&k.to_ascii_lowercase().as_str()) =>
                    {
                        format!("{k}=***")
                    }
                    _ => pair.to_owned(),
                })
                .collect();
            let fragment = fragment.map(|f| format!("#{f}")).unwrap_or_default();
            format!("{path}?{}{fragment}", pairs.join("&"))
        }
        None => tail.to_owned(),
    };
    match scheme {
        Some(s) => format!("{s}://{}{tail}", hosts.join(",")),
        None => format!("{}{tail}", hosts.join(",")),
    }
}

fn config_err(msg: impl Into<String>) -> LeaseError {
    LeaseError::Config(msg.into())
}

/// One `host:port` of a host list.
#[derive(Debug)]
pub(crate) struct HostPort {
    /// As written (with its `user:password@` where allowed).
    pub raw: String,
    /// Host, lower-cased, and port: what makes two entries the same server.
    pub id: (String, u16),
}

/// Parses a comma-separated `host:port` list: every entry needs a port in
/// 1..=65535, and no path, query or fragment. `user:password@` is accepted
/// only when `credentials` says the backend can use it.
pub(crate) fn host_list(scheme: &str, list: &str, credentials: bool) -> Result<Vec<HostPort>> {
    hosts(scheme, list, credentials, true)
}

/// [`host_list`], with the port optional when `port_required` is false
/// (the store's default port: told apart from an explicit one as port 0).
fn hosts(
    scheme: &str,
    list: &str,
    credentials: bool,
    port_required: bool,
) -> Result<Vec<HostPort>> {
    let shown = redact(list);
    if list.trim().is_empty() {
        return Err(config_err(format!(
            "{scheme}:// needs a comma-separated list of host:port"
        )));
    }
    let mut out: Vec<HostPort> = Vec::new();
    for raw in list.split(',').map(str::trim) {
        let entry = redact(raw);
        if raw.is_empty() || raw.contains(['/', '?', '#']) {
            return Err(config_err(format!(
                "{scheme}:// needs a comma-separated list of host:port, got {shown:?}"
            )));
        }
        let parsed = url::Url::parse(&format!("lease-host://{raw}")).map_err(|e| {
            config_err(format!(
                "{scheme}:// entry {entry:?} is not host:port ({e})"
            ))
        })?;
        if !credentials && (!parsed.username().is_empty() || parsed.password().is_some()) {
            return Err(config_err(format!(
                "{scheme}:// cannot use credentials in the URL (entry {entry:?}); remove them"
            )));
        }
        let host = parsed
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| config_err(format!("{scheme}:// entry {entry:?} has no host")))?;
        let port = match parsed.port() {
            Some(p) if p != 0 => p,
            None if !port_required && !raw.ends_with(':') => 0,
            _ => {
                return Err(config_err(format!(
                    "{scheme}:// entry {entry:?} needs a port (host:port, 1-65535)"
                )));
            }
        };
        let id = (host.to_ascii_lowercase(), port);
        if out.iter().any(|h| h.id == id) {
            return Err(config_err(format!(
                "{scheme}:// lists {}:{} twice; every node must be a different server",
                id.0, id.1
            )));
        }
        out.push(HostPort {
            raw: raw.to_owned(),
            id,
        });
    }
    Ok(out)
}

/// Checks the URL of a SQL store (`rest` is what follows `scheme://`),
/// which may name several hosts, `user@h1:p1,h2:p2/db` (a PostgreSQL
/// primary and its standbys, a Galera cluster's nodes): each entry a
/// distinct `host[:port]`, and the rest checked as on a URL of the first.
pub(crate) fn sql_url(scheme: &str, url: &str, rest: &str, allowed: &[&str]) -> Result<()> {
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), authority),
    };
    if hosts.contains(',') {
        // A host without a port is on the store's default one.
        let list = self::hosts(scheme, hosts, false, false)?;
        single(
            &format!("{scheme}://{userinfo}{}{tail}", list[0].raw),
            allowed,
        )?;
    } else {
        single(url, allowed)?;
    }
    Ok(())
}

/// Parses a single-server URL with the `url` crate: a host is required, a
/// port (when given) must be in range, and every query parameter must be one
/// of `allowed`.
pub(crate) fn single(url: &str, allowed: &[&str]) -> Result<url::Url> {
    let shown = redact(url);
    let parsed = url::Url::parse(url)
        .map_err(|e| config_err(format!("store URL {shown:?} is malformed ({e})")))?;
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(config_err(format!("store URL {shown:?} has no host")));
    }
    if parsed.port() == Some(0) {
        return Err(config_err(format!("store URL {shown:?} has port 0")));
    }
    for (k, _) in parsed.query_pairs() {
        if !allowed.contains(&k.as_ref()) {
            let known = if allowed.is_empty() {
                "none are".to_owned()
            } else {
                format!("known: {}", allowed.join(", "))
            };
            return Err(config_err(format!(
                "store URL {shown:?} has the unknown parameter {k:?} ({known})"
            )));
        }
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted_everywhere_in_a_url() {
        for (url, want) in [
            ("redis://:pw@h:1/0", "redis://:***@h:1/0"),
            ("redis://user:pw@h:1", "redis://user:***@h:1"),
            ("redis://user@h", "redis://user@h"),
            (
                "redlock://:a@h1:1,:b@h2:2,h3:3",
                "redlock://:***@h1:1,:***@h2:2,h3:3",
            ),
            (
                "postgres://u@h/db?password=pw&sslmode=require",
                "postgres://u@h/db?password=***&sslmode=require",
            ),
            ("postgres://u:p%40w@h/db", "postgres://u:***@h/db"),
            ("memory://", "memory://"),
        ] {
            assert_eq!(redact(url), want, "{url}");
        }
    }

    #[test]
    fn host_lists_need_ports_in_range_and_distinct_servers() {
        assert_eq!(host_list("etcd", "a:1, b:2", false).unwrap().len(), 2);
        assert!(host_list("etcd", "[::1]:2379", false).is_ok());
        for bad in [
            "a", "a:0", "a:99999", "a:1,,b:2", "a:1/x", "a:1,A:1", "u:pw@a:1",
        ] {
            let err = host_list("etcd", bad, false).unwrap_err().to_string();
            assert!(!err.contains("pw"), "{err}");
            assert!(err.contains("etcd://"), "{bad}: {err}");
        }
        assert!(host_list("redlock", ":pw@a:1", true).is_ok());
    }

    #[test]
    fn single_urls_refuse_unknown_parameters() {
        assert!(single("redis://h:1/0?protocol=resp3", &["protocol"]).is_ok());
        let err = single("postgres://u:pw@h/db?lease_tabel=x", &["sslmode"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("lease_tabel") && !err.contains("pw"), "{err}");
        assert!(single("redis://h:70000", &[]).is_err());
        assert!(single("redis:///0", &[]).is_err());
    }
}
