//! `lease-clusters`: starts replicated stores on loopback for manual runs
//! (`scripts/clusters up`), prints the environment that points at them, and
//! stops them on SIGINT or SIGTERM. The test suites start their own.
//!
//! ```text
//! lease-clusters [--env-file PATH] [etcd3] [zk3] [redlock5] [sentinel] [redis-cluster] [pg-ha] [patroni]
//! ```

use std::io::Write as _;
use std::time::Instant;

use lease_testkit::cluster::{
    EtcdCluster, PatroniCluster, PostgresHa, RedisCluster, RedisNodes, RedisSentinel, Topology,
    ZkEnsemble,
};

fn hosts(urls: &[String], scheme: &str) -> String {
    urls.iter()
        .map(|u| u.trim_start_matches(scheme).to_owned())
        .collect::<Vec<_>>()
        .join(",")
}

fn describe(name: &str, t: &dyn Topology, started: Instant) {
    eprintln!(
        "lease-clusters: {name} ready in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    for m in t.members() {
        eprintln!(
            "lease-clusters:   {} port {} pid {}",
            m.name(),
            m.port(),
            m.pid()
        );
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut env_file = None;
    let mut wanted = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--env-file" => env_file = args.next(),
            "etcd3" | "zk3" | "redlock5" | "sentinel" | "redis-cluster" | "pg-ha" | "patroni" => {
                wanted.push(a);
            }
            other => {
                eprintln!(
                    "lease-clusters: unknown argument {other:?}; usage: lease-clusters [--env-file PATH] [etcd3] [zk3] [redlock5] [sentinel] [redis-cluster] [pg-ha] [patroni]"
                );
                std::process::exit(2);
            }
        }
    }
    if wanted.is_empty() {
        wanted = vec![
            "etcd3".into(),
            "zk3".into(),
            "redlock5".into(),
            "sentinel".into(),
            "redis-cluster".into(),
            "pg-ha".into(),
            "patroni".into(),
        ];
    }
    let mut env = String::new();
    let mut topologies: Vec<Box<dyn Topology>> = Vec::new();
    for name in &wanted {
        let started = Instant::now();
        match name.as_str() {
            "etcd3" => {
                let c = EtcdCluster::start(3);
                env.push_str(&format!(
                    "export LEASE_CLUSTER_ETCD_URL=etcd://{}\n",
                    hosts(&c.endpoints(), "http://")
                ));
                describe(name, &c, started);
                topologies.push(Box::new(c));
            }
            "zk3" => {
                let e = ZkEnsemble::start(3);
                env.push_str(&format!(
                    "export LEASE_CLUSTER_ZK_URL=zk://{}\n",
                    e.connect_string()
                ));
                describe(name, &e, started);
                topologies.push(Box::new(e));
            }
            "pg-ha" => {
                let h = PostgresHa::start(true);
                env.push_str(&format!(
                    "export LEASE_CLUSTER_POSTGRES_HA_URL={}\n",
                    h.url()
                ));
                describe(name, &h, started);
                topologies.push(Box::new(h));
            }
            "patroni" => {
                let c = PatroniCluster::start(2);
                env.push_str(&format!("export LEASE_CLUSTER_PATRONI_URL={}\n", c.url()));
                describe(name, &c, started);
                topologies.push(Box::new(c));
            }
            "redis-cluster" => {
                let c = RedisCluster::start(3, 1);
                env.push_str(&format!(
                    "export LEASE_CLUSTER_REDIS_CLUSTER_URL={}\n",
                    c.url()
                ));
                describe(name, &c, started);
                topologies.push(Box::new(c));
            }
            "sentinel" => {
                let s = RedisSentinel::start(2, 3);
                env.push_str(&format!("export LEASE_CLUSTER_SENTINEL_URL={}\n", s.url()));
                describe(name, &s, started);
                topologies.push(Box::new(s));
            }
            _ => {
                let n = RedisNodes::start(5);
                env.push_str(&format!(
                    "export LEASE_CLUSTER_REDLOCK_URL=redlock://{}\n",
                    hosts(&n.urls(), "redis://")
                ));
                describe(name, &n, started);
                topologies.push(Box::new(n));
            }
        }
    }
    print!("{env}");
    let _ = std::io::stdout().flush();
    if let Some(path) = env_file {
        // Written whole, then renamed: a reader never sees half of it.
        let tmp = format!("{path}.tmp");
        if let Err(e) = std::fs::write(&tmp, &env).and_then(|()| std::fs::rename(&tmp, &path)) {
            eprintln!("lease-clusters: cannot write {path}: {e}");
            std::process::exit(1);
        }
    }
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("lease-clusters: cannot wait for SIGTERM: {e}");
            std::process::exit(1);
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    // Dropping a topology kills its members and removes their data.
    drop(topologies);
    eprintln!("lease-clusters: stopped");
}
