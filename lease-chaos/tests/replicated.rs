//! Chaos on replicated stores: a 3-member etcd cluster, a 3-server
//! ZooKeeper ensemble, 5 Redlock nodes, a Redis primary with 2 replicas
//! under 3 Sentinels, a Redis Cluster, a Galera cluster and PostgreSQL under
//! Patroni, each started for its cell. The nemesis kills and
//! freezes the leader (for Redlock, a node; under Sentinel, the primary,
//! which a freeze longer than down-after demotes; in a Redis Cluster, the
//! primary of slot 0's shard) while a holder
//! holds, and cuts the leader off from the other members while the workers
//! still reach it (Patroni through its links; etcd, ZooKeeper, Sentinel,
//! Redis Cluster and Galera in the packet filter), besides pausing,
//! crashing and cutting off workers; the checker
//! judges the history against what each backend declares.
//!
//! The cells run one at a time (8 worker processes each on a 2-core machine).

use std::time::Duration;

use clap::Parser;
use lease_chaos::{Members, Report, RunArgs, run_with_members};
use lease_testkit::TempDir;
use lease_testkit::cluster::{
    EtcdCluster, GaleraCluster, PatroniCluster, RedisCluster, RedisNodes, RedisSentinel, Topology,
    ZkEnsemble,
};

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Isolations at whose end another member led: the store elected a
/// successor beside the isolated leader (the cells run one at a time).
static PROMOTED_WHILE_ISOLATED: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    run: RunArgs,
}

/// A testkit topology as the nemesis's members.
struct Cluster<T: Topology>(T);

impl<T: Topology + 'static> Members for Cluster<T> {
    fn leader(&mut self) -> Option<usize> {
        if !self.0.has_leader() {
            // Redlock has no leader: any running node.
            return self.0.members().iter().position(|m| m.is_running());
        }
        // Right after an earlier fault the store may still be electing; a
        // store with no leader after 10 s gets no leader fault this time
        // (a follower is never hit in the leader's name).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(l) = self.0.leader() {
                return Some(l);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    fn kill(&mut self, member: usize) {
        self.0.kill_member(member);
    }
    fn restart(&mut self, member: usize) {
        self.0.members_mut()[member].start_again();
        self.0.wait_healthy(Duration::from_secs(60));
    }
    fn freeze(&mut self, member: usize) {
        self.0.freeze_member(member);
    }
    fn thaw(&mut self, member: usize) {
        self.0.thaw_member(member);
    }
    fn can_isolate(&self) -> bool {
        self.0.can_isolate()
    }
    fn isolate(&mut self, member: usize) {
        self.0.isolate_member(member);
    }
    fn rejoin(&mut self, member: usize) {
        if self.0.serves_without(member) {
            PROMOTED_WHILE_ISOLATED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        self.0.rejoin_member(member);
        self.0.wait_healthy(Duration::from_secs(90));
    }
    fn isolation_hold(&self) -> Duration {
        self.0.isolation_hold()
    }
}

/// Every fault of a replicated cell.
const ALL_FAULTS: &str = "leader-kill,leader-pause,pause,crash,partition";

async fn cell<T: Topology + 'static>(
    topology: &str,
    start: impl FnOnce() -> T + Send + 'static,
    url: impl FnOnce(&T) -> String,
    faults: &str,
) -> Report {
    cell_for(topology, start, url, faults, "40s").await.0
}

/// A cell on `topology` (its label in the report) run for `duration` (it
/// goes on, up to twice as long, until every fault kind was injected), and
/// how many isolations ended with another member leading.
///
/// `scripts/chaos` runs these cells at full size through the environment:
/// `LEASE_CHAOS_ACQUISITIONS` (end the cell after that many grants),
/// `LEASE_CHAOS_MAX_CELL` (a longer time bound than `duration`; a cell
/// never runs shorter than it is tuned to),
/// `LEASE_CHAOS_SEED`, `LEASE_CHAOS_RUN_NOTE`, and `LEASE_CHAOS_JSON_DIR`
/// (the report goes there as `<topology>.json`).
async fn cell_for<T: Topology + 'static>(
    topology: &str,
    start: impl FnOnce() -> T + Send + 'static,
    url: impl FnOnce(&T) -> String,
    faults: &str,
    duration: &str,
) -> (Report, usize) {
    let _one = ONE_AT_A_TIME.lock().await;
    PROMOTED_WHILE_ISOLATED.store(0, std::sync::atomic::Ordering::SeqCst);
    let members = tokio::task::spawn_blocking(start).await.unwrap();
    let store = url(&members);
    let dir = TempDir::new("chaos-replicated");
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let tuned = humantime::parse_duration(duration).expect("a cell's duration");
    let duration = env("LEASE_CHAOS_MAX_CELL")
        .and_then(|d| humantime::parse_duration(&d).ok())
        .filter(|d| *d > tuned)
        .map_or_else(|| duration.to_owned(), |d| format!("{}s", d.as_secs()));
    let mut argv: Vec<String> = [
        "chaos",
        "--store",
        &store,
        "--faults",
        faults,
        "--fault-every",
        "1s",
        "--duration",
        &duration,
        "--ttl",
        "2s",
        // Short of the grants `holds` needs, the cell goes on (up to twice
        // its duration) rather than fail for a slow stretch.
        "--min-grants",
        &MIN_GRANTS.to_string(),
        "--topology",
        topology,
        "--dir",
        dir.path().to_str().expect("utf-8 temp dir"),
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    for (var, flag) in [
        ("LEASE_CHAOS_ACQUISITIONS", "--acquisitions"),
        ("LEASE_CHAOS_SEED", "--seed"),
        ("LEASE_CHAOS_RUN_NOTE", "--run-note"),
    ] {
        if let Some(v) = env(var) {
            argv.extend([flag.to_owned(), v]);
        }
    }
    if let Some(out) = env("LEASE_CHAOS_JSON_DIR") {
        let path = std::path::Path::new(&out).join(format!("{topology}.json"));
        argv.extend(["--json".to_owned(), path.display().to_string()]);
    }
    let args = Cli::parse_from(argv).run;
    let worker = vec![
        env!("CARGO_BIN_EXE_lease-chaos").into(),
        "chaos-worker".into(),
    ];
    let report = run_with_members(args, worker, Box::new(Cluster(members)))
        .await
        .expect("the run starts");
    println!("{}", report.text());
    let promoted = PROMOTED_WHILE_ISOLATED.load(std::sync::atomic::Ordering::SeqCst);
    (report, promoted)
}

/// [`holds`], and some leader isolation lasted until the others served
/// without it (another member led; Galera's others formed a cluster of
/// their own): the split-brain case happened, and held.
fn holds_through_isolation(r: &Report, promoted: usize) {
    holds(r);
    assert!(
        r.injected.get("leader-isolate").copied().unwrap_or(0) >= 1,
        "no leader-isolate injected: {}",
        r.text()
    );
    assert!(
        promoted >= 1,
        "no isolation lasted until the other members served without it: {}",
        r.text()
    );
}

/// The grants a replicated cell needs to mean something.
const MIN_GRANTS: u64 = 30;

/// The verdict, that the leader faults happened, and that the run did enough
/// work to mean something.
fn holds(r: &Report) {
    assert!(r.passed(), "{}", r.text());
    for kind in ["leader-kill", "leader-pause"] {
        assert!(
            r.injected.get(kind).copied().unwrap_or(0) >= 1,
            "no {kind} injected: {}",
            r.text()
        );
    }
    assert!(
        r.counts.grants >= MIN_GRANTS,
        "too few grants to judge: {}",
        r.text()
    );
}

/// PostgreSQL under Patroni (synchronous mode): the primary's host killed
/// (agent and server; restarted two TTLs later it finds its leader key
/// still held and recovers as the primary) or frozen, and the primary cut
/// off from its standby and from etcd while the workers still reach it,
/// long enough for Patroni to promote the standby beside it (the
/// split-brain case).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patroni_postgres_holds_when_its_primary_is_killed_frozen_or_isolated() {
    // The worker faults but one (every other cell runs them) leave room
    // for the long leader faults before the run's hard deadline.
    let faults = "leader-kill,leader-pause,leader-isolate,crash";
    // Longer: one isolation holds for Patroni's ttl and more, and the
    // member rejoins (rewound) before the next fault.
    let (r, promoted) = cell_for(
        "patroni2",
        || PatroniCluster::start(2),
        PatroniCluster::url,
        faults,
        "60s",
    )
    .await;
    holds_through_isolation(&r, promoted);
}

/// The leader killed, frozen, and cut off from the other members (both
/// ways, in the packet filter) while the workers still reach it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_cluster_holds_when_its_leader_is_killed_frozen_or_isolated() {
    let (r, promoted) = cell_for(
        "etcd3",
        || EtcdCluster::start_splittable(3),
        |c| {
            let hosts: Vec<String> = c
                .endpoints()
                .iter()
                .map(|e| e.trim_start_matches("http://").to_owned())
                .collect();
            format!("etcd://{}", hosts.join(","))
        },
        &format!("{ALL_FAULTS},leader-isolate"),
        "40s",
    )
    .await;
    holds_through_isolation(&r, promoted);
}

/// Galera has no leader: the fault hits the first running node, the one
/// the workers' providers use (they name every node, in order), which then
/// move on to the next.
/// The node in use is also cut off from the other nodes (in the packet
/// filter) while the workers still reach it: it leaves the primary
/// component, refuses work, and the workers move to the two that go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn galera_cluster_holds_when_the_node_in_use_is_killed_frozen_or_isolated() {
    let (r, promoted) = cell_for(
        "galera3",
        || GaleraCluster::start_splittable(3),
        GaleraCluster::url,
        &format!("{ALL_FAULTS},leader-isolate"),
        "40s",
    )
    .await;
    holds_through_isolation(&r, promoted);
}

/// The leader killed, frozen, and cut off from the other servers (both
/// ways, in the packet filter) while the workers still reach it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_ensemble_holds_when_its_leader_is_killed_frozen_or_isolated() {
    let (r, promoted) = cell_for(
        "zk3",
        || ZkEnsemble::start_splittable(3),
        |e| format!("zk://{}", e.connect_string()),
        &format!("{ALL_FAULTS},leader-isolate"),
        "40s",
    )
    .await;
    holds_through_isolation(&r, promoted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_of_five_holds_when_a_node_is_killed_or_frozen() {
    let r = cell(
        "redlock5",
        || RedisNodes::start(5),
        |n| {
            let hosts: Vec<String> = n
                .urls()
                .iter()
                .map(|u| u.trim_start_matches("redis://").to_owned())
                .collect();
            format!("redlock://{}", hosts.join(","))
        },
        ALL_FAULTS,
    )
    .await;
    holds(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_sentinel_holds_when_its_primary_is_killed_frozen_or_isolated() {
    // No partition: the workers would reach the Sentinels through the
    // nemesis's proxies, but the primary at the address Sentinel names.
    // The default wait=1 of 2 replicas declares that a failover may reissue
    // tokens (a primary frozen past the promotion and thawed takes writes a
    // replica acknowledges and later resyncs away): the checker reports
    // token regressions, and what follows from them, as declared. wait=2
    // would be held to increasing tokens, but a shard with one replica left
    // refuses writes until the lost node rejoins (availability 29% here).
    // The primary is also cut off from its replicas and the Sentinels (in
    // the packet filter) while the workers still reach it at the address
    // the Sentinels handed out: its acquires get no replica's WAIT, and the
    // Sentinels promote a replica beside it.
    let (r, promoted) = cell_for(
        "sentinel",
        || RedisSentinel::start_splittable(2, 3),
        RedisSentinel::url,
        "leader-kill,leader-pause,leader-isolate,pause,crash",
        "40s",
    )
    .await;
    holds_through_isolation(&r, promoted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_holds_when_a_primary_is_killed_frozen_or_isolated() {
    // Two replicas per primary, so a shard keeps one after a failover. No
    // partition: the cluster hands out its nodes' real addresses.
    // The primary is also cut off from every other node (in the packet
    // filter) while the workers still reach it: it stops taking writes
    // once it misses the majority, and its replica is elected beside it.
    let (r, promoted) = cell_for(
        "redis-cluster",
        || RedisCluster::start_splittable(3, 2),
        RedisCluster::url,
        "leader-kill,leader-pause,leader-isolate,pause,crash",
        "40s",
    )
    .await;
    holds_through_isolation(&r, promoted);
}
