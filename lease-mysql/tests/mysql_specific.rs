//! MySQL/MariaDB-specific behaviour: byte-for-byte keys under collation
//! traps, identifier validation, logins, fenced transactions, the server-side
//! statement limit, and outages of a private server (crash, restart, freeze,
//! killed connections).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use lease_api::{LeaseError, LeaseKey, LeaseProvider};
use lease_mysql::{MysqlConfig, MysqlProvider};
use lease_testkit::{OwnedProcess, owned_mysql, store_url, unique, until_ok};
use sqlx::Connection;

const TTL: Duration = Duration::from_secs(30);
const TIMEOUT: Duration = Duration::from_millis(800);

fn url(p: &OwnedProcess) -> String {
    format!("mysql://root@127.0.0.1:{}/lease", p.port())
}

fn shared(namespace: &str) -> MysqlProvider {
    MysqlProvider::new(MysqlConfig::new(store_url("LEASE_TEST_MYSQL_URL")).namespace(namespace))
        .unwrap()
}

/// A private server the shared outage cases crash and restart.
struct PrivateMysql(lease_testkit::Restartable);

impl PrivateMysql {
    fn start() -> Self {
        PrivateMysql(lease_testkit::Restartable::new(owned_mysql(&[])))
    }
}

#[async_trait::async_trait]
impl lease_conformance::ProviderFactory for PrivateMysql {
    async fn provider(&self, namespace: &str) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        let url = format!("mysql://root@127.0.0.1:{}/lease", self.0.port());
        let p = MysqlProvider::new(
            MysqlConfig::new(url)
                .namespace(namespace)
                .timeouts(TIMEOUT, TIMEOUT),
        )?;
        // The durability the provider declares comes from this probe.
        until_ok(|| p.probe()).await;
        Ok(Arc::new(p))
    }

    async fn unreachable(&self) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        Ok(Arc::new(MysqlProvider::new(
            MysqlConfig::new("mysql://root@127.0.0.1:1/lease").timeouts(TIMEOUT, TIMEOUT),
        )?))
    }

    fn unavailable_within(&self) -> Duration {
        TIMEOUT * 2 + Duration::from_secs(1)
    }
}

#[async_trait::async_trait]
impl lease_conformance::Outage for PrivateMysql {
    fn server(&self) -> &dyn lease_conformance::Server {
        &self.0
    }
}

lease_conformance::outage_tests!(mysql_outage, PrivateMysql::start());

/// `a`, `A`, `a ` and `á` (composed and decomposed) are different keys:
/// binary columns, not the server's default collation, which would fold
/// case and accents and ignore trailing spaces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_compare_byte_for_byte_under_collation_traps() {
    let p = shared(&unique("collation"));
    let names = ["a", "A", "a ", "á", "a\u{301}", "ａ", "a\t"];
    let mut held = Vec::new();
    for name in names {
        let key = LeaseKey::new(name).unwrap();
        let lease = p
            .try_acquire(&key, TTL)
            .await
            .unwrap()
            .into_lease()
            .unwrap_or_else(|| panic!("{name:?} was taken as another key"));
        held.push(lease);
    }
    for lease in &held {
        let info = p.inspect(lease.key()).await.unwrap().unwrap();
        assert_eq!(info.token, lease.token(), "{:?}", lease.key());
        assert_eq!(info.owner, Some(lease.owner()), "{:?}", lease.key());
    }
    for lease in held {
        p.release(&lease).await.unwrap();
    }
}

/// The longest key (512 bytes of two-byte UTF-8) and SQL-looking keys
/// round-trip unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_multibyte_and_sql_looking_keys_are_just_keys() {
    let p = shared(&unique("odd_keys"));
    let long = "é".repeat(256);
    assert_eq!(long.len(), 512);
    for name in [
        long.as_str(),
        "'; DROP TABLE lease_leases; --",
        "%",
        "_",
        "\\",
        "`x`",
        "k\u{1F600}",
    ] {
        let key = LeaseKey::new(name).unwrap();
        let lease = p
            .try_acquire(&key, TTL)
            .await
            .unwrap()
            .into_lease()
            .unwrap();
        assert!(
            p.try_acquire(&key, TTL)
                .await
                .unwrap()
                .into_lease()
                .is_none()
        );
        assert!(p.inspect(&key).await.unwrap().is_some());
        p.release(&lease).await.unwrap();
        assert!(p.inspect(&key).await.unwrap().is_none());
    }
}

#[test]
fn table_names_and_urls_are_checked_up_front() {
    for bad in ["x`; DROP TABLE y; --", "a.b", "1x", "", &"t".repeat(65)] {
        let err = MysqlProvider::new(MysqlConfig::new("mysql://u@h/db").table(bad)).unwrap_err();
        assert!(matches!(err, LeaseError::Config(_)), "{bad:?}: {err}");
    }
    for bad in [
        "postgres://u@h/db",
        "mysql://u@h",
        "mysql://u:pw@h:notaport/db",
    ] {
        let err = MysqlProvider::new(MysqlConfig::new(bad)).unwrap_err();
        assert!(matches!(err, LeaseError::Config(_)), "{bad:?}: {err}");
        assert!(!err.to_string().contains("pw@"), "{err}");
    }
    let p =
        MysqlProvider::new(MysqlConfig::new("mariadb://app:s3cret@db.example:3307/app")).unwrap();
    let shown = format!("{p:?}");
    assert!(!shown.contains("s3cret"), "{shown}");
    assert!(shown.contains("mysql://db.example:3307"), "{shown}");
}

/// A wrong password is `Denied`, not `Unavailable`, and does not show the
/// password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_denied() {
    let good = store_url("LEASE_TEST_MYSQL_URL");
    let at = good.find('@').unwrap();
    let user_end = good[..at].rfind(':').unwrap();
    let bad = format!("{}:wrong-password{}", &good[..user_end], &good[at..]);
    let p = MysqlProvider::new(MysqlConfig::new(bad)).unwrap();
    let err = p
        .try_acquire(&LeaseKey::new("denied").unwrap(), TTL)
        .await
        .unwrap_err();
    assert!(matches!(err, LeaseError::Denied { .. }), "{err}");
    assert!(!format!("{err:?}").contains("wrong-password"), "{err:?}");
}

/// A fenced transaction refuses a stale lease before it writes, and holds
/// the lease row: a takeover after the lease ran out waits until the
/// transaction ends, so the business write commits while the lease is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_transactions_hold_off_a_takeover_until_they_end() {
    let ns = unique("fenced");
    let p = shared(&ns);
    let key = LeaseKey::new("batch").unwrap();
    let ttl = Duration::from_millis(300);
    let lease = p
        .try_acquire(&key, ttl)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let mut tx = p.begin_fenced(&lease).await.unwrap();
    tokio::time::sleep(ttl + Duration::from_millis(200)).await;
    // The lease ran out on the server's clock; a takeover must wait for the
    // transaction, which holds the row.
    let other = shared(&ns);
    let (k, o) = (key.clone(), other.clone());
    let takeover = tokio::spawn(async move {
        let answer = o.try_acquire(&k, TTL).await;
        (answer, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !takeover.is_finished(),
        "a takeover went through an open fenced transaction"
    );
    sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
    let committed = Instant::now();
    tx.commit().await.unwrap();
    let (answer, done) = takeover.await.unwrap();
    let taken = answer.unwrap().into_lease().expect("the expired key");
    assert!(taken.token() > lease.token());
    assert!(done >= committed, "took the key before the commit");
    // The stale holder is refused before anything is written.
    let stale = p.begin_fenced(&lease).await.unwrap_err();
    assert!(matches!(stale, LeaseError::Lost { .. }), "{stale}");
    other.release(&taken).await.unwrap();
}

/// An acquire the client gave up on leaves no lease: the row is locked by
/// another transaction past the client's limit and freed as soon as the
/// client has given up, before InnoDB's lock wait (1 s) would end the
/// statement. The server's own limit (MariaDB's `max_statement_time`)
/// counts from the statement's arrival, a little after the client's timer,
/// so the statement may still commit then; the provider's cancel releases
/// that lease (see `behind_a_proxy` for the gap made wide).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_given_up_on_does_not_commit_later() {
    let ns = unique("late");
    let limit = Duration::from_millis(400);
    let p = MysqlProvider::new(
        MysqlConfig::new(store_url("LEASE_TEST_MYSQL_URL"))
            .namespace(&ns)
            .timeouts(Duration::from_secs(3), limit),
    )
    .unwrap();
    let key = LeaseKey::new("late").unwrap();
    let first = p
        .try_acquire(&key, TTL)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    p.release(&first).await.unwrap();
    let mut blocker = sqlx::MySqlConnection::connect(&store_url("LEASE_TEST_MYSQL_URL"))
        .await
        .unwrap();
    sqlx::query("BEGIN").execute(&mut blocker).await.unwrap();
    sqlx::query("SELECT 1 FROM lease_leases WHERE namespace = ? AND k = ? FOR UPDATE")
        .bind(ns.as_bytes())
        .bind(b"late".as_slice())
        .execute(&mut blocker)
        .await
        .unwrap();
    let (k, q) = (key.clone(), p.clone());
    let attempt = tokio::spawn(async move { q.try_acquire(&k, TTL).await });
    let answer = attempt.await.unwrap();
    sqlx::query("ROLLBACK").execute(&mut blocker).await.unwrap();
    assert!(
        matches!(
            answer,
            Err(LeaseError::Timeout { .. } | LeaseError::Unavailable { .. })
        ),
        "{answer:?}"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    p.flush(Duration::from_secs(10)).await;
    assert!(
        p.inspect(&key).await.unwrap().is_none(),
        "the acquire the client gave up on committed a lease"
    );
}

/// Connections are pinged only after sitting idle; ones the server killed
/// while idle (`KILL`, as a restart or `wait_timeout` does) are replaced
/// before use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_killed_by_the_server_are_replaced_before_use() {
    let server = owned_mysql(&[]);
    let p = MysqlProvider::new(MysqlConfig::new(url(&server)).timeouts(TIMEOUT, TIMEOUT)).unwrap();
    let warm = join_all((0..4).map(|i| {
        let p = p.clone();
        async move {
            let k = LeaseKey::new(format!("warm-{i}")).unwrap();
            let l = p.try_acquire(&k, TTL).await.unwrap().into_lease().unwrap();
            p.release(&l).await.unwrap();
        }
    }));
    warm.await;
    let mut admin = sqlx::MySqlConnection::connect(&url(&server)).await.unwrap();
    let ids: Vec<i64> = sqlx::query_scalar(
        "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = 'root' AND ID <> CONNECTION_ID()",
    )
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert!(!ids.is_empty(), "no connection to kill");
    for id in ids {
        sqlx::query(&format!("KILL CONNECTION {id}"))
            .execute(&mut admin)
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let k = LeaseKey::new("idle-killed").unwrap();
    for _ in 0..6 {
        let l = p
            .try_acquire(&k, TTL)
            .await
            .expect("a killed idle connection is replaced, not used")
            .into_lease()
            .unwrap();
        p.release(&l).await.expect("release on a fresh connection");
    }
}

/// A frozen server (SIGSTOP) answers nothing: calls end within the response
/// timeout, and the same provider serves again once it thaws.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_times_calls_out_and_the_provider_recovers() {
    let server = owned_mysql(&[]);
    let p = MysqlProvider::new(MysqlConfig::new(url(&server)).timeouts(TIMEOUT, TIMEOUT)).unwrap();
    let k = LeaseKey::new("frozen").unwrap();
    let l = p.try_acquire(&k, TTL).await.unwrap().into_lease().unwrap();
    server.freeze();
    let started = Instant::now();
    let answer = p.extend(&l, TTL).await;
    let took = started.elapsed();
    server.thaw();
    assert!(
        answer.as_ref().is_err_and(LeaseError::is_transient),
        "{answer:?}"
    );
    assert!(
        took < TIMEOUT * 3,
        "a call to a frozen server took {took:?}"
    );
    let l = until_ok(|| p.extend(&l, TTL)).await;
    p.release(&l).await.unwrap();
}

/// A server whose default mode has MariaDB's `SIMULTANEOUS_ASSIGNMENT`
/// (every assignment of an `ON DUPLICATE KEY UPDATE` sees the old row):
/// the provider's sessions run without it, so a released key is taken
/// again with a higher token. With it, the acquire would never win a key
/// that has a row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_simultaneous_assignment_still_hands_keys_over() {
    let server = owned_mysql(&["--sql-mode=SIMULTANEOUS_ASSIGNMENT,STRICT_TRANS_TABLES"]);
    let p = MysqlProvider::new(MysqlConfig::new(url(&server)).timeouts(TIMEOUT, TIMEOUT)).unwrap();
    let k = LeaseKey::new("simultaneous").unwrap();
    let first = p.try_acquire(&k, TTL).await.unwrap().into_lease().unwrap();
    p.release(&first).await.unwrap();
    let second = p
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .into_lease()
        .expect("a released key is free again");
    assert!(second.token() > first.token());
    assert!(p.try_acquire(&k, TTL).await.unwrap().into_lease().is_none());
}

/// Several hosts must be one Galera cluster's nodes: a list of servers that
/// are not (a primary and its replicas, say) is refused, not used as if
/// they were interchangeable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_hosts_that_are_not_galera_nodes_are_refused() {
    let one = store_url("LEASE_TEST_MYSQL_URL");
    let at = one.find('@').unwrap();
    let slash = at + one[at..].find('/').unwrap();
    let host = &one[at + 1..slash];
    let two = format!("{}{host},{}", &one[..=at], &one[at + 1..]);
    let p = MysqlProvider::new(MysqlConfig::new(two)).unwrap();
    let err = p
        .try_acquire(&LeaseKey::new("not-galera").unwrap(), TTL)
        .await
        .unwrap_err();
    assert!(matches!(err, LeaseError::Config(_)), "{err}");
}

/// A loser learns the holder's time left from the acquire's own answer (no
/// second statement), and a winner's token comes from the same answer,
/// whether the row was new or released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_answer_says_who_won_and_how_long_the_holder_has() {
    let p = shared(&unique("one_answer"));
    let k = LeaseKey::new("k").unwrap();
    let first = p.try_acquire(&k, TTL).await.unwrap().into_lease().unwrap();
    assert_eq!(first.token().get(), 1, "a new row starts at token 1");
    match p.try_acquire(&k, TTL).await.unwrap() {
        lease_api::TryAcquire::Held {
            remaining: Some(left),
        } => assert!(
            left <= TTL && left > TTL - Duration::from_secs(5),
            "{left:?}"
        ),
        other => panic!("held key answered {other:?}"),
    }
    p.release(&first).await.unwrap();
    let second = p.try_acquire(&k, TTL).await.unwrap().into_lease().unwrap();
    assert_eq!(
        second.token().get(),
        2,
        "a released row's token grows by one"
    );
}

/// A private server, a fault proxy in front of it, a provider through the
/// proxy whose response timeout is `limit` and one straight to the server,
/// both in namespace `ns`.
async fn behind_a_proxy(
    ns: &str,
    limit: Duration,
) -> (
    OwnedProcess,
    lease_testkit::Proxy,
    MysqlProvider,
    MysqlProvider,
) {
    let server = owned_mysql(&[]);
    let proxy = lease_testkit::Proxy::start(server.port()).await;
    let through = MysqlProvider::new(
        MysqlConfig::new(format!("mysql://root@127.0.0.1:{}/lease", proxy.port()))
            .namespace(ns)
            .timeouts(limit, limit),
    )
    .unwrap();
    let direct = MysqlProvider::new(
        MysqlConfig::new(url(&server))
            .namespace(ns)
            .timeouts(TIMEOUT, TIMEOUT),
    )
    .unwrap();
    (server, proxy, through, direct)
}

/// Takes and gives back a lease through `p`: the table is made and a
/// connection used within the last second, so the next acquire is one
/// statement on the wire.
async fn warm(p: &MysqlProvider) {
    let k = LeaseKey::new("warm").unwrap();
    let l = p.try_acquire(&k, TTL).await.unwrap().into_lease().unwrap();
    p.release(&l).await.unwrap();
}

/// An acquire whose statement reaches the server late (every request is
/// held 1.5 s on its way) gives up after 2 s, at the response timeout, counted from
/// before it was sent, while the server's limits count from its arrival.
/// The row it waits on is freed in between, so the statement commits a
/// lease nobody holds. The provider kills the session the statement was
/// sent on, then releases what it won: a waiter gets the key long before
/// the lease's 30 s TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_the_client_gave_up_on_that_commits_late_is_released() {
    let ns = unique("late-commit");
    // The statement arrives 1.5 s after it is sent; the client gives up at
    // 2 s; the server's limits run until 3.5 s: a margin of 1.5 s.
    let (held, limit) = (Duration::from_millis(1500), Duration::from_secs(2));
    let (server, proxy, p, direct) = behind_a_proxy(&ns, limit).await;
    let key = LeaseKey::new("late").unwrap();
    let first = direct
        .try_acquire(&key, TTL)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    direct.release(&first).await.unwrap();
    let mut blocker = sqlx::MySqlConnection::connect(&url(&server)).await.unwrap();
    sqlx::query("BEGIN").execute(&mut blocker).await.unwrap();
    sqlx::query("SELECT 1 FROM lease_leases WHERE namespace = ? AND k = ? FOR UPDATE")
        .bind(ns.as_bytes())
        .bind(b"late".as_slice())
        .execute(&mut blocker)
        .await
        .unwrap();
    warm(&p).await;
    proxy.delay_requests(held);
    let sent = Instant::now();
    let err = p.try_acquire(&key, TTL).await.unwrap_err();
    assert!(matches!(err, LeaseError::Timeout { .. }), "{err:?}");
    sqlx::query("ROLLBACK").execute(&mut blocker).await.unwrap();
    let freed = sent.elapsed();
    let seen = Instant::now();
    let late = loop {
        if let Some(info) = direct.inspect(&key).await.unwrap() {
            break info;
        }
        assert!(
            seen.elapsed() < Duration::from_secs(2),
            "the late statement never committed (the row was freed {freed:?} after it was sent): this case tests nothing"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(late.token > first.token(), "{late:?}");
    // A network that slow would time the cancel's own connection out too.
    proxy.delay_requests(Duration::ZERO);
    let direct: Arc<dyn LeaseProvider> = Arc::new(direct);
    let started = Instant::now();
    let got = lease_api::acquire(
        &direct,
        &key,
        lease_api::AcquireOptions::ttl(TTL).wait(Duration::from_secs(25)),
    )
    .await
    .unwrap()
    .expect("the key came free");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the late lease held the key for {:?}",
        started.elapsed()
    );
    assert!(got.token() > late.token);
    direct.release(&got).await.unwrap();
    p.flush(Duration::from_secs(10)).await;
}

/// An acquire still on its way when the client gave up (every request is
/// held 3 s in the network, and the key is free) would run in full on
/// arrival, a lease nobody holds. The provider kills the server session it
/// was sent on, so when the statement arrives nobody runs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_still_on_its_way_when_the_client_gave_up_never_runs() {
    let ns = unique("on-its-way");
    let (_server, proxy, p, direct) = behind_a_proxy(&ns, TIMEOUT).await;
    let key = LeaseKey::new("on-its-way").unwrap();
    warm(&p).await;
    let held_for = Duration::from_secs(3);
    proxy.delay_requests(held_for);
    let sent = Instant::now();
    let (q, k) = (p.clone(), key.clone());
    let attempt = tokio::spawn(async move { q.try_acquire(&k, TTL).await });
    // The statement is on its way: requests sent from now on (the cancel's
    // own connection, made when the client gives up) pass at once.
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.delay_requests(Duration::ZERO);
    let err = attempt.await.unwrap().unwrap_err();
    assert!(matches!(err, LeaseError::Timeout { .. }), "{err:?}");
    p.flush(Duration::from_secs(10)).await;
    assert!(
        sent.elapsed() < held_for,
        "the cancel ended after the statement arrived ({:?}): this case tests nothing",
        sent.elapsed()
    );
    // Past the statement's arrival, and past its run had it run.
    while sent.elapsed() < held_for + Duration::from_secs(1) {
        let now = direct.inspect(&key).await.unwrap();
        assert!(now.is_none(), "the acquire ran on arrival: {now:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
