//! Where the benchmarked stores are (their URLs, from the environment that
//! `scripts/stores` sets) and the keys the benchmark uses.

use leases::LeaseKey;

use crate::common::sqlite_dir;

fn env(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        eprintln!("lease-bench: {var} is not set; run it through scripts/bench (or `scripts/stores up && eval \"$(scripts/stores env)\"`)");
        std::process::exit(2)
    })
}

pub(crate) fn store_url(backend: &str) -> String {
    match backend {
        "memory" => "memory://".into(),
        "redis" => env("LEASE_TEST_REDIS_URL"),
        "redlock" => format!(
            "redlock://{}",
            env("LEASE_TEST_REDLOCK_URLS").replace("redis://", "")
        ),
        "postgres" => env("LEASE_TEST_POSTGRES_URL"),
        "mysql" => env("LEASE_TEST_MYSQL_URL"),
        "etcd" => env("LEASE_TEST_ETCD_URL").replace("http://", "etcd://"),
        "zk" => format!("zk://{}", env("LEASE_TEST_ZK_URL")),
        // A fresh file per process, beside the raw floor's lock files.
        "sqlite" => format!("sqlite://{}", sqlite_dir().join("bench.db").display()),
        other => {
            eprintln!("lease-bench: unknown backend {other}");
            std::process::exit(2)
        }
    }
}

pub(crate) fn key(prefix: &str, i: usize) -> LeaseKey {
    // Prefix and index make a valid key; failure here is a bug in this program.
    LeaseKey::new(format!("{prefix}-{i}")).expect("valid benchmark key")
}
