//! Which store a command talks to: the configuration from flags, file and
//! environment, the default per-user SQLite store, and the shared providers
//! commands that coordinate separate processes need.

use std::sync::Arc;

use leases::{LeaseError, LeaseProvider, Store, StoreConfig};

use crate::cli::Cli;

/// The store configuration from --config, --store, the environment and
/// --namespace (the default store when none is given).
pub(crate) fn load_config(cli: &Cli) -> Result<StoreConfig, LeaseError> {
    let mut config = match &cli.config {
        Some(path) => StoreConfig::from_toml_file(path)?,
        None => {
            let store = match cli.store.clone() {
                Some(store) => store,
                None => default_store()?,
            };
            // LEASE_DEFAULT_TTL and the timeouts come from the environment;
            // a garbage value is an error naming the variable.
            StoreConfig::from_lookup(|name| match name {
                "LEASE_STORE" => Some(store.clone()),
                other => std::env::var(other).ok(),
            })?
        }
    };
    if cli.config.is_some()
        && let Some(store) = &cli.store
    {
        config.store = store.clone();
    }
    if let Some(ns) = &cli.namespace {
        config.namespace = ns.clone();
    }
    // Shown as parsed, passwords redacted; a URL that does not parse is
    // reported (without echoing it) when it is used.
    if cli.verbose > 0
        && let Ok(store) = config.parsed()
    {
        eprintln!("lease: store {store}, namespace {}", config.namespace);
    }
    Ok(config)
}

/// The store when none is given: a SQLite file every process of this user on
/// this host shares, in the XDG state directory (`~/.local/state/lease`), or
/// `/var/lib/lease` for root. It works with no server, across processes, and
/// with fencing tokens; for more than one host, give a networked store.
fn default_store() -> Result<String, LeaseError> {
    let dir = if nix::unistd::geteuid().is_root() {
        std::path::PathBuf::from("/var/lib/lease")
    } else {
        let state = std::env::var_os("XDG_STATE_HOME")
            .map(std::path::PathBuf::from)
            .filter(|p| p.is_absolute())
            .or_else(|| {
                std::env::var_os("HOME")
                    .map(std::path::PathBuf::from)
                    .filter(|p| p.is_absolute())
                    .map(|h| h.join(".local").join("state"))
            })
            .ok_or_else(|| {
                LeaseError::Config(format!(
                    "no store given, and neither XDG_STATE_HOME nor HOME says where to keep the default SQLite database; use --store URL, LEASE_STORE, or --config FILE ({})",
                    leases::URL_FORMS
                ))
            })?;
        state.join("lease")
    };
    std::fs::create_dir_all(&dir).map_err(|e| {
        LeaseError::Config(format!(
            "no store given, and the default SQLite database's directory {} cannot be created ({e}); use --store URL or LEASE_STORE",
            dir.display()
        ))
    })?;
    let path = dir.join("leases.db");
    let path = path.to_str().ok_or_else(|| {
        LeaseError::Config(format!(
            "the default SQLite path {} is not UTF-8; use --store sqlite:///path",
            path.display()
        ))
    })?;
    Ok(format!("sqlite://{path}"))
}

/// A provider for commands that coordinate separate processes: `memory://`
/// is one process's store, so two `lease run`s would never see each other.
pub(crate) fn shared_store(config: &StoreConfig) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
    if config.parsed()? == Store::Memory {
        return Err(LeaseError::Config(
            "memory:// lives inside one process, so it cannot coordinate separate `lease` commands; \
             use a shared store (redis://, postgres://, etcd://, zk://)"
                .into(),
        ));
    }
    config.build()
}

/// A provider whose leases outlive this process: a lease printed by `acquire`
/// must still be there for `extend` and `release` in another process.
pub(crate) fn detachable_store(config: &StoreConfig) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
    let provider = shared_store(config)?;
    if provider.capabilities().holder_session.is_some() {
        return Err(LeaseError::Config(format!(
            "{} leases end with the session of the process that took them, so a lease cannot outlive \
             `lease acquire`; use `lease run`",
            provider.capabilities().backend
        )));
    }
    Ok(provider)
}
