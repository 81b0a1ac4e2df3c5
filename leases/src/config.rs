//! `StoreConfig`: everything needed to build a provider, loaded from TOML,
//! from environment variables or built in code, with human durations.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use lease_api::backend::DEFAULT_NAMESPACE;
use lease_api::{LeaseError, LeaseProvider, Result};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::store::{Store, URL_FORMS};

fn config_err(msg: impl Into<String>) -> LeaseError {
    LeaseError::Config(msg.into())
}

/// Everything needed to build a provider, with durations in human form
/// (`30s`, `1m 30s`, `250ms`). Load it from TOML, from the environment, or
/// build it in code.
///
/// ```
/// let config = leases::StoreConfig::from_toml_str(r#"
///     store = "memory://"
///     namespace = "billing"
///     default_ttl = "30s"
/// "#)?;
/// let provider = config.build()?;
/// assert_eq!(provider.namespace(), "billing");
/// # Ok::<(), leases::LeaseError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct StoreConfig {
    /// The store URL (see [`URL_FORMS`]).
    pub store: String,
    /// The namespace. Default `lease`.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// The TTL used when none is given. Default 30 s.
    #[serde(default = "default_ttl", with = "human")]
    pub default_ttl: Duration,
    /// How long to wait for a connection. Default 2 s.
    #[serde(default = "default_connect", with = "human")]
    pub connect_timeout: Duration,
    /// How long to wait for one request. Default 3 s.
    #[serde(default = "default_request", with = "human")]
    pub request_timeout: Duration,
}

fn default_namespace() -> String {
    DEFAULT_NAMESPACE.into()
}
fn default_ttl() -> Duration {
    Duration::from_secs(30)
}
fn default_connect() -> Duration {
    Duration::from_secs(2)
}
fn default_request() -> Duration {
    Duration::from_secs(3)
}

mod human {
    use super::*;

    pub(super) fn serialize<S: Serializer>(
        d: &Duration,
        s: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> std::result::Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text).map_err(|e| {
            serde::de::Error::custom(format!(
                "{text:?} is not a duration like 30s or 1m 30s: {e}"
            ))
        })
    }
}

/// Parses a human duration (`30s`, `1m 30s`, `250ms`).
///
/// # Errors
/// [`LeaseError::Config`] naming the bad text.
pub fn parse_duration(what: &str, text: &str) -> Result<Duration> {
    humantime::parse_duration(text.trim()).map_err(|e| {
        config_err(format!(
            "{what} {text:?} is not a duration like 30s or 1m 30s: {e}"
        ))
    })
}

impl std::fmt::Debug for StoreConfig {
    /// Like the derived form, with the store URL's passwords redacted.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreConfig")
            .field("store", &crate::redact(&self.store))
            .field("namespace", &self.namespace)
            .field("default_ttl", &self.default_ttl)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

impl StoreConfig {
    /// A configuration for `store` with defaults for the rest.
    pub fn new(store: impl Into<String>) -> Self {
        StoreConfig {
            store: store.into(),
            namespace: default_namespace(),
            default_ttl: default_ttl(),
            connect_timeout: default_connect(),
            request_timeout: default_request(),
        }
    }

    /// Sets the namespace.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Sets the TTL used when none is given.
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.default_ttl = ttl;
        self
    }

    /// Sets the connect and request timeouts.
    pub fn timeouts(mut self, connect: Duration, request: Duration) -> Self {
        self.connect_timeout = connect;
        self.request_timeout = request;
        self
    }

    /// Reads TOML text with the fields of this struct.
    ///
    /// # Errors
    /// [`LeaseError::Config`] with the parser's message (unknown fields, bad durations).
    pub fn from_toml_str(text: &str) -> Result<Self> {
        toml::from_str(text).map_err(|e| config_err(format!("invalid lease configuration: {e}")))
    }

    /// Reads a TOML file.
    ///
    /// # Errors
    /// [`LeaseError::Config`] when the file cannot be read or parsed.
    pub fn from_toml_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            config_err(format!(
                "cannot read lease configuration {}: {e}",
                path.display()
            ))
        })?;
        Self::from_toml_str(&text)
    }

    /// Reads `LEASE_STORE` (required), `LEASE_NAMESPACE`, `LEASE_DEFAULT_TTL`,
    /// `LEASE_CONNECT_TIMEOUT` and `LEASE_REQUEST_TIMEOUT`.
    ///
    /// # Errors
    /// [`LeaseError::Config`] when `LEASE_STORE` is unset or a value is malformed.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Like [`from_env`](Self::from_env) with another source of variables.
    ///
    /// # Errors
    /// As [`from_env`](Self::from_env).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let store = get("LEASE_STORE")
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                config_err(format!(
                    "LEASE_STORE is not set; set it to a store URL: {URL_FORMS}"
                ))
            })?;
        let mut c = StoreConfig::new(store);
        if let Some(ns) = get("LEASE_NAMESPACE") {
            c.namespace = ns;
        }
        for (var, field) in [
            ("LEASE_DEFAULT_TTL", &mut c.default_ttl),
            ("LEASE_CONNECT_TIMEOUT", &mut c.connect_timeout),
            ("LEASE_REQUEST_TIMEOUT", &mut c.request_timeout),
        ] {
            if let Some(v) = get(var) {
                *field = parse_duration(var, &v)?;
            }
        }
        Ok(c)
    }

    /// The parsed store URL.
    ///
    /// # Errors
    /// As [`Store::parse`].
    pub fn parsed(&self) -> Result<Store> {
        Store::parse(&self.store)
    }

    /// Builds the provider.
    ///
    /// # Errors
    /// [`LeaseError::Config`] for a bad URL, namespace or missing feature.
    pub fn build(&self) -> Result<Arc<dyn LeaseProvider>> {
        self.parsed()?
            .build(&self.namespace, self.connect_timeout, self.request_timeout)
    }
}

/// Builds a provider from a store URL with the default namespace and timeouts.
///
/// ```
/// let provider = leases::connect("memory://")?;
/// assert_eq!(provider.capabilities().backend, "memory");
/// # Ok::<(), leases::LeaseError>(())
/// ```
///
/// # Errors
/// As [`StoreConfig::build`].
pub fn connect(url: &str) -> Result<Arc<dyn LeaseProvider>> {
    StoreConfig::new(url).build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_urls_say_what_to_fix() {
        let cases = [
            ("127.0.0.1:6379", "no scheme"),
            ("mongodb://x", "unknown store scheme"),
            ("redlock://a:1,b:2", "at least 3"),
            ("redlock://a:1,,c:3", "host:port"),
            ("etcd://", "host:port"),
            ("redis://", "has no host"),
            ("etcd://a:99999", "is not host:port"),
            ("etcd://a", "needs a port"),
            ("zk://a:1,a:1/x", "twice"),
            ("redlock://a:1,b:2,A:1", "twice"),
            (
                "postgres://u@h/db?lease_tabel=x",
                "unknown parameter \"lease_tabel\"",
            ),
            ("redis://h:1?db=3", "unknown parameter"),
            ("zk://u@a:1", "user:password@"),
            ("etcd://a:1?ca=/x", "is for TLS"),
            ("etcds://a:1?cert=/c", "together"),
            ("etcds://a:1?tls=1", "unknown parameter"),
            ("memory://x", "takes nothing"),
        ];
        for (url, expected) in cases {
            let err = Store::parse(url).unwrap_err().to_string();
            assert!(err.contains(expected), "{url}: {err}");
        }
        let err = StoreConfig::new("postgres://u@h/db?lease_table=bad-name")
            .build()
            .unwrap_err()
            .to_string();
        assert!(err.contains("invalid table"), "{err}");
        let err = StoreConfig::new("memory://")
            .namespace("")
            .build()
            .unwrap_err();
        assert!(matches!(err, LeaseError::Config(_)));
    }

    #[test]
    fn toml_and_env_configs_load_with_human_durations() {
        let c = StoreConfig::from_toml_str(
            "store = \"redis://127.0.0.1:6379\"\nnamespace = \"billing\"\ndefault_ttl = \"1m 30s\"\nrequest_timeout = \"250ms\"\n",
        )
        .unwrap();
        assert_eq!(c.default_ttl, Duration::from_secs(90));
        assert_eq!(c.request_timeout, Duration::from_millis(250));
        assert_eq!(c.connect_timeout, Duration::from_secs(2));
        // Round trip through TOML.
        let back = StoreConfig::from_toml_str(&toml::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        let err = StoreConfig::from_toml_str("store = \"memory://\"\ndefault_ttl = \"soon\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("soon"), "{err}");
        let err = StoreConfig::from_toml_str("store = \"memory://\"\nttl = \"1s\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field"), "{err}");

        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        let c = StoreConfig::from_lookup(env(&[
            ("LEASE_STORE", "memory://"),
            ("LEASE_DEFAULT_TTL", "45s"),
            ("LEASE_NAMESPACE", "jobs"),
        ]))
        .unwrap();
        assert_eq!(
            (c.default_ttl, c.namespace.as_str()),
            (Duration::from_secs(45), "jobs")
        );
        let err = StoreConfig::from_lookup(env(&[])).unwrap_err().to_string();
        assert!(err.contains("LEASE_STORE is not set"), "{err}");
        let err = StoreConfig::from_lookup(env(&[
            ("LEASE_STORE", "memory://"),
            ("LEASE_CONNECT_TIMEOUT", "x"),
        ]))
        .unwrap_err()
        .to_string();
        assert!(err.contains("LEASE_CONNECT_TIMEOUT"), "{err}");
    }
}
