//! Where the stores are: the shared stores' addresses and the store programs
//! a test starts, from `LEASE_TEST_*` variables or their usual places.

use std::path::PathBuf;

/// How to start the shared stores, for failure messages.
pub const HOW_TO_START: &str = "start the stores with `scripts/stores up && eval \"$(scripts/stores env)\"`, \
or run the whole suite with `scripts/test`";

/// The value of `var` (e.g. `LEASE_TEST_REDIS_URL`).
///
/// # Panics
/// When `var` is unset: a test that needs a store must fail loudly, not skip.
pub fn store_url(var: &str) -> String {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => v,
        _ => panic!("{var} is not set: this test needs a real store; {HOW_TO_START}"),
    }
}

/// The directory of PostgreSQL's server programs (`initdb`, `postgres`).
///
/// # Panics
/// When PostgreSQL is not installed.
pub fn pg_bindir() -> PathBuf {
    if let Ok(d) = std::env::var("LEASE_TEST_PG_BINDIR")
        && !d.is_empty()
    {
        return PathBuf::from(d);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path().join("bin"))
                .filter(|p| p.join("initdb").exists())
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
        .pop()
        .unwrap_or_else(|| panic!("PostgreSQL server programs not found; {HOW_TO_START}"))
}

/// `zkServer.sh`, from `LEASE_TEST_ZK_SERVER` or Debian's location.
pub(crate) fn zk_server() -> PathBuf {
    match std::env::var("LEASE_TEST_ZK_SERVER") {
        Ok(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from("/usr/share/zookeeper/bin/zkServer.sh"),
    }
}
