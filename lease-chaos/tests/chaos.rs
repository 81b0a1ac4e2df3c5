//! The short chaos mode: every backend, real worker processes, real faults
//! (SIGSTOP, kill -9, black-holed links, a frozen store), checked against
//! what each backend declares. `scripts/chaos` runs the long matrix.
//!
//! The cells run one at a time (8 worker processes each on a 2-core machine).

use clap::Parser;
use lease_chaos::{Report, RunArgs, run};
use lease_testkit::{
    TempDir, owned_etcd, owned_mysql, owned_postgres, owned_redis, owned_zk, store_url,
};

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    run: RunArgs,
}

async fn cell(store: &str, extra: &[&str]) -> Report {
    let _one = ONE_AT_A_TIME.lock().await;
    let dir = TempDir::new("chaos");
    let min = MIN_GRANTS.to_string();
    let mut argv = vec![
        "chaos",
        "--store",
        store,
        "--fault-every",
        "1s",
        // A cell short of the grants `holds` needs goes on past its duration
        // (up to twice it): etcd's 2 s smallest TTL, with a tenth of the
        // rounds held beyond it, granted 37 in 15 s in one CI run.
        "--min-grants",
        &min,
        "--dir",
        dir.path().to_str().expect("utf-8 temp dir"),
    ];
    argv.extend_from_slice(extra);
    let args = Cli::parse_from(argv).run;
    let worker = vec![
        env!("CARGO_BIN_EXE_lease-chaos").into(),
        "chaos-worker".into(),
    ];
    let report = run(args, worker).await.expect("the run starts");
    println!("{}", report.text());
    report
}

/// The grants a cell needs to mean something (each cell runs until it has
/// them, up to twice its duration).
const MIN_GRANTS: u64 = 50;

/// The verdict, and that the run did enough work to mean something.
fn holds(r: &Report) {
    assert!(r.passed(), "{}", r.text());
    assert!(
        r.counts.grants >= MIN_GRANTS,
        "too few grants to judge: {}",
        r.text()
    );
    assert!(r.counts.recovery_ms.len() as u64 >= 2, "{}", r.text());
}

fn redis_url() -> String {
    store_url("LEASE_TEST_REDIS_URL")
}

fn redlock_url() -> String {
    let urls = store_url("LEASE_TEST_REDLOCK_URLS");
    let hosts: Vec<&str> = urls
        .split(',')
        .map(|u| u.trim_start_matches("redis://").trim_end_matches('/'))
        .collect();
    format!("redlock://{}", hosts.join(","))
}

fn postgres_url() -> String {
    store_url("LEASE_TEST_POSTGRES_URL")
}

fn mysql_url() -> String {
    store_url("LEASE_TEST_MYSQL_URL")
}

fn etcd_url() -> String {
    store_url("LEASE_TEST_ETCD_URL").replace("http://", "etcd://")
}

fn zk_url() -> String {
    format!("zk://{}", store_url("LEASE_TEST_ZK_URL"))
}

/// The client faults every networked backend takes: workers frozen
/// (SIGSTOP), killed (kill -9), and cut off from the store.
const CLIENT_FAULTS: &str = "pause,crash,partition";

/// A backend's cell under `faults` for 15 s. Where the backend offers
/// read/write leases (C19) a third of the rounds read: the sink fences reads
/// by their writer epoch and writes above every reader that read, so one
/// cell checks exclusive and shared leases together (no conflicting grants
/// overlap, the token rule holds, no stale read or write gets in).
async fn client_fault_cell(url: &str, faults: &str, shared: bool) {
    let mut args = vec!["--faults", faults, "--duration", "15s"];
    if shared {
        args.extend_from_slice(&["--read-share", "0.3", "--long-share", "0.1"]);
    }
    let r = cell(url, &args).await;
    holds(&r);
    if shared {
        let c = &r.counts;
        assert!(
            c.reader_grants > 0 && c.grants > c.reader_grants && c.reads > 0,
            "{url}: no mix of readers and writers: {}",
            r.text()
        );
        assert_eq!(c.stale_admitted, 0, "{}", r.text());
        assert_eq!(c.token_regressions, 0, "{}", r.text());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_holds_under_pauses_crashes_and_partitions() {
    client_fault_cell(&redis_url(), CLIENT_FAULTS, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_holds_under_client_faults_and_a_cut_minority() {
    let r = cell(
        &redlock_url(),
        &[
            "--faults",
            "pause,crash,partition,minority",
            "--duration",
            "20s",
        ],
    )
    .await;
    holds(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_holds_under_pauses_crashes_and_partitions() {
    client_fault_cell(&postgres_url(), CLIENT_FAULTS, true).await;
}

/// MySQL offers no read/write leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_holds_under_pauses_crashes_and_partitions() {
    client_fault_cell(&mysql_url(), CLIENT_FAULTS, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_holds_under_pauses_crashes_and_partitions() {
    client_fault_cell(&etcd_url(), CLIENT_FAULTS, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_holds_under_pauses_crashes_and_partitions() {
    client_fault_cell(&zk_url(), CLIENT_FAULTS, true).await;
}

/// SQLite is a file: no link to cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_holds_under_pauses_and_crashes() {
    let dir = TempDir::new("chaos-sqlite");
    let url = format!("sqlite://{}", dir.path().join("leases.db").display());
    client_fault_cell(&url, "pause,crash", true).await;
}

/// The control of the read/write rounds: without the fence, pauses let a
/// paused reader read after a newer writer wrote, or a paused writer write
/// after a newer reader read, and the checker must count it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_fence_read_write_pauses_admit_stale_operations() {
    let r = stale_control(
        &redis_url(),
        &[
            "--faults",
            "pause",
            "--unfenced",
            "--read-share",
            "0.5",
            "--long-share",
            "0.3",
            "--duration",
            "12s",
        ],
    )
    .await;
    assert!(
        r.counts.stale_admitted > 0,
        "an unfenced sink under pauses admitted no stale read or write: {}",
        r.text()
    );
    assert!(r.counts.reader_grants > 0, "{}", r.text());
    assert_eq!(r.counts.validity_overlaps, 0, "{}", r.text());
    assert_eq!(r.counts.token_regressions, 0, "{}", r.text());
}

/// Kleppmann's Redlock scenario, run for real: one node cut, a holder with
/// exactly a majority, the other node of that majority jumps its clock. Two
/// workers then hold valid leases at once (declared: Redlock expiry follows
/// each node's wall clock), and the fence still admits no stale write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_jump_on_a_redlock_node_breaks_exclusion_but_not_the_fence() {
    let r = until_seen(
        &redlock_url(),
        &[
            "--faults",
            "clock-jump",
            "--long-share",
            "0.3",
            "--duration",
            "20s",
        ],
        |r| r.counts.validity_overlaps > 0,
    )
    .await;
    assert!(r.passed(), "{}", r.text());
    assert!(
        r.counts.validity_overlaps > 0,
        "the jump never let a second holder in: {}",
        r.text()
    );
    assert!(!r.declared.is_empty(), "{}", r.text());
    assert_eq!(r.counts.stale_admitted, 0, "{}", r.text());
    assert_eq!(r.counts.token_regressions, 0, "{}", r.text());
}

/// A Redlock node that comes back without its data (a restart without
/// persistence) while a holder holds: tokens go back, as the capabilities
/// declare (Volatile). The fence then refuses the regressed holders' writes,
/// and may admit a late write of the holder with the higher, pre-wipe token:
/// both are what `Volatile` declares, and the report must say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_node_losing_its_counters_regresses_tokens_as_declared() {
    let r = until_seen(
        &redlock_url(),
        &[
            "--faults",
            "node-wipe",
            "--long-share",
            "0.3",
            "--duration",
            "20s",
        ],
        |r| r.counts.token_regressions > 0,
    )
    .await;
    assert!(r.passed(), "{}", r.text());
    assert!(
        r.counts.token_regressions > 0,
        "no regression after nodes lost their counters: {}",
        r.text()
    );
    assert!(
        r.declared.iter().any(|d| d.contains("not greater")),
        "the regression is not reported as declared: {}",
        r.text()
    );
}

/// A frozen store (SIGSTOP of the server's process group), on stores of
/// this test's own so the shared ones keep serving the other tests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_networked_store_holds_while_frozen() {
    let redis = owned_redis(false);
    let pg = owned_postgres();
    let etcd = owned_etcd();
    let zk = owned_zk();
    let mysql = owned_mysql(&[]);
    let stores = [
        (format!("redis://127.0.0.1:{}", redis.port()), redis.pid()),
        (
            format!("postgres://postgres@127.0.0.1:{}/postgres", pg.port()),
            pg.pid(),
        ),
        (format!("etcd://127.0.0.1:{}", etcd.port()), etcd.pid()),
        (format!("zk://127.0.0.1:{}", zk.port()), zk.pid()),
        (
            format!("mysql://root@127.0.0.1:{}/lease", mysql.port()),
            mysql.pid(),
        ),
    ];
    for (url, pid) in stores {
        let pid = pid.to_string();
        let r = cell(
            &url,
            &[
                "--faults",
                "store-pause,pause",
                "--store-pid",
                &pid,
                // 15 s of faults (not a count of grants: 300 grants once
                // ended a Redis run 7 s in, with one recovery to judge), and
                // longer where the grants `holds` needs are not in yet (etcd,
                // 2 s smallest TTL, once granted 47 in 20 s).
                "--duration",
                "15s",
            ],
        )
        .await;
        holds(&r);
    }
}

/// The control: without the fence, the same pauses let a paused worker's
/// stale write land after its successor's. The checker must see it, or
/// the fenced cells' zeros prove nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_fence_pauses_admit_stale_writes() {
    let r = stale_control(
        &redis_url(),
        &[
            "--faults",
            "pause",
            "--unfenced",
            "--long-share",
            "0.3",
            "--duration",
            "15s",
        ],
    )
    .await;
    assert!(
        r.counts.stale_admitted > 0,
        "an unfenced sink under pauses admitted no stale write: {}",
        r.text()
    );
    assert!(r.counts.unsafe_windows > 0, "{}", r.text());
    assert_eq!(r.counts.validity_overlaps, 0, "{}", r.text());
    assert_eq!(r.counts.token_regressions, 0, "{}", r.text());
}

/// A control run, repeated (up to 3 runs) until the checker saw a stale
/// admission: one needs a paused holder to wake after its successor wrote,
/// which each pause makes likely, not certain (a loaded machine grants fewer
/// leases per run).
async fn stale_control(store: &str, extra: &[&str]) -> Report {
    until_seen(store, extra, |r| r.counts.stale_admitted > 0).await
}

/// A cell whose case (a stale admission, an overlap, a regression) each
/// fault makes likely, not certain, in one seeded schedule: run again, up
/// to 3 runs, until the case happened; the last report either way. A run
/// that broke a declaration is returned at once.
async fn until_seen(store: &str, extra: &[&str], seen: impl Fn(&Report) -> bool) -> Report {
    let mut runs = 0;
    loop {
        let r = cell(store, extra).await;
        runs += 1;
        if seen(&r) || !r.passed() || runs == 3 {
            return r;
        }
    }
}

/// Bad configurations are clear errors before anything starts.
#[tokio::test]
async fn impossible_cells_are_refused_up_front() {
    let bad = |argv: &[&str]| {
        let mut v = vec!["chaos"];
        v.extend_from_slice(argv);
        Cli::parse_from(v).run
    };
    let worker = || {
        vec![
            env!("CARGO_BIN_EXE_lease-chaos").into(),
            "chaos-worker".into(),
        ]
    };
    let e = run(bad(&["--store", "memory://"]), worker())
        .await
        .expect_err("memory:// cannot coordinate processes");
    assert!(e.contains("memory://"), "{e}");
    let e = run(
        bad(&["--store", "sqlite:///tmp/x.db", "--faults", "partition"]),
        worker(),
    )
    .await
    .expect_err("no host to partition");
    assert!(e.contains("partition"), "{e}");
    let e = run(
        bad(&["--store", &redis_url(), "--faults", "store-pause"]),
        worker(),
    )
    .await
    .expect_err("no pid");
    assert!(e.contains("--store-pid"), "{e}");
    let e = run(
        bad(&["--store", &redis_url(), "--faults", "minority"]),
        worker(),
    )
    .await
    .expect_err("one node has no minority");
    assert!(e.contains("3 nodes"), "{e}");
    let e = run(
        bad(&["--store", &redlock_url(), "--read-share", "0.5"]),
        worker(),
    )
    .await
    .expect_err("Redlock has no read/write leases");
    assert!(e.contains("read/write"), "{e}");
    let e = run(
        bad(&["--store", &redis_url(), "--read-share", "1"]),
        worker(),
    )
    .await
    .expect_err("no writer at all");
    assert!(e.contains("--read-share"), "{e}");
    // Nothing was frozen or left running: the store still answers.
    let p = leases::connect(&redis_url()).expect("provider");
    let key = leases::LeaseKey::new("chaos-after-refusals").expect("key");
    assert!(
        p.inspect(&key).await.is_ok(),
        "the store answers after the refusals"
    );
}
