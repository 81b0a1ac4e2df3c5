//! PostgreSQL-specific behaviour: restarts and outages of a private server,
//! SQL-looking keys, identifier validation, migration races and fenced
//! transactions.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use lease_api::backend::{Place, Ticket};
use lease_api::{AcquireOptions, LeaseError, LeaseKey, LeaseProvider, acquire};
use lease_postgres::{PostgresConfig, PostgresProvider};
use lease_testkit::{OwnedProcess, owned_postgres, store_url};
use lease_testkit::{unique, until_ok};
use sqlx::Row;

const TTL: Duration = Duration::from_secs(30);
const TIMEOUT: Duration = Duration::from_millis(800);

fn url(p: &OwnedProcess) -> String {
    format!("postgres://postgres@127.0.0.1:{}/postgres", p.port())
}

fn shared(namespace: &str) -> PostgresProvider {
    PostgresProvider::new(
        PostgresConfig::new(store_url("LEASE_TEST_POSTGRES_URL")).namespace(namespace),
    )
    .unwrap()
}

/// A private server the shared outage cases crash, restart and cut the
/// LISTEN connections of (`pg_terminate_backend`).
struct PrivatePostgres(lease_testkit::Restartable);

impl PrivatePostgres {
    fn start() -> Self {
        PrivatePostgres(lease_testkit::Restartable::new(owned_postgres()))
    }
}

#[async_trait::async_trait]
impl lease_conformance::ProviderFactory for PrivatePostgres {
    async fn provider(&self, namespace: &str) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        let url = format!("postgres://postgres@127.0.0.1:{}/postgres", self.0.port());
        let p = PostgresProvider::new(
            PostgresConfig::new(url)
                .namespace(namespace)
                .timeouts(TIMEOUT, TIMEOUT),
        )?;
        // The durability the provider declares comes from this probe.
        until_ok(|| p.probe()).await;
        Ok(Arc::new(p))
    }

    async fn unreachable(&self) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        Ok(Arc::new(PostgresProvider::new(
            PostgresConfig::new("postgres://postgres@127.0.0.1:1/postgres")
                .timeouts(TIMEOUT, TIMEOUT),
        )?))
    }

    fn unavailable_within(&self) -> Duration {
        TIMEOUT * 2 + Duration::from_secs(1)
    }
}

#[async_trait::async_trait]
impl lease_conformance::Outage for PrivatePostgres {
    fn server(&self) -> &dyn lease_conformance::Server {
        &self.0
    }

    async fn kill_notification_connections(&self) -> Option<usize> {
        let admin_url = format!("postgres://postgres@127.0.0.1:{}/template1", self.0.port());
        let admin = sqlx::PgPool::connect(&admin_url).await.ok()?;
        let killed: i64 = sqlx::query_scalar(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = 'postgres' AND query LIKE 'LISTEN%'",
        )
        .fetch_one(&admin)
        .await
        .ok()?;
        admin.close().await;
        usize::try_from(killed).ok()
    }
}

lease_conformance::outage_tests!(postgres_outage, PrivatePostgres::start(), notifications);

/// Pooled connections are not pinged before each statement (that was a round
/// trip per operation); only one that sat idle is. So connections killed while
/// idle (`pg_terminate_backend`, as a server restart or a proxy's idle timeout
/// does) are found and replaced before use: the next operations all succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_pooled_connections_killed_by_the_server_are_replaced_before_use() {
    let server = owned_postgres();
    let p = PostgresProvider::new(PostgresConfig::new(url(&server)).timeouts(TIMEOUT, TIMEOUT))
        .unwrap();
    let k = LeaseKey::new("idle-killed").unwrap();
    // Several pooled connections, each used once.
    let warm = join_all((0..4).map(|i| {
        let p = p.clone();
        async move {
            let k = LeaseKey::new(format!("warm-{i}")).unwrap();
            let l = p.try_acquire(&k, TTL).await.unwrap().into_lease().unwrap();
            p.release(&l).await.unwrap();
        }
    }));
    warm.await;
    let admin_url = format!("postgres://postgres@127.0.0.1:{}/template1", server.port());
    let admin = sqlx::PgPool::connect(&admin_url).await.unwrap();
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE datname = 'postgres' AND pid <> pg_backend_pid()",
    )
    .fetch_one(&admin)
    .await
    .unwrap();
    assert!(killed >= 1, "no pooled connection to kill");
    // Idle past the threshold, as a connection between two renewals is.
    tokio::time::sleep(Duration::from_millis(1200)).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_that_look_like_sql_are_just_keys() {
    let p = shared(&unique("sql_keys"));
    let keys = [
        "'; DROP TABLE lease_leases; --",
        "%",
        "_",
        "a%",
        "a_",
        "\\",
        "\\\\",
        "a\\%b",
        "$1",
        "' OR '1'='1",
    ];
    let mut leases = Vec::new();
    for k in keys {
        let k = LeaseKey::new(k).unwrap();
        leases.push(
            p.try_acquire(&k, TTL)
                .await
                .unwrap()
                .into_lease()
                .unwrap_or_else(|| panic!("{k:?} collided")),
        );
    }
    for l in &leases {
        assert_eq!(p.inspect(l.key()).await.unwrap().unwrap().token, l.token());
        p.release(l).await.unwrap();
    }
    // The table is still there and still works.
    let k = LeaseKey::new("after").unwrap();
    assert!(p.try_acquire(&k, TTL).await.unwrap().is_acquired());
}

#[tokio::test]
async fn invalid_table_and_schema_names_are_rejected_clearly() {
    for (schema, table) in [
        ("public", "bad-name"),
        ("public", "x; DROP TABLE y"),
        ("pub lic", "t"),
        ("public", ""),
        ("public", "1t"),
    ] {
        let err = PostgresProvider::new(
            PostgresConfig::new("postgres://u@127.0.0.1/db").table(schema, table),
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, LeaseError::Config(_)), "{msg}");
        assert!(
            msg.contains("invalid") && (msg.contains("table") || msg.contains("schema")),
            "{msg}"
        );
    }
    let err = PostgresProvider::from_url("mysql://nope").unwrap_err();
    assert!(
        matches!(&err, LeaseError::Config(m) if m.contains("postgres://")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_processes_creating_the_table_at_once_all_succeed() {
    let schema = unique("lease_schema");
    let providers: Vec<_> = (0..8)
        .map(|_| {
            PostgresProvider::new(
                PostgresConfig::new(store_url("LEASE_TEST_POSTGRES_URL"))
                    .table(&schema, "custom_leases")
                    .max_connections(2),
            )
            .unwrap()
        })
        .collect();
    let k = LeaseKey::new("first-use").unwrap();
    let results = join_all(providers.iter().map(|p| p.try_acquire(&k, TTL))).await;
    let won = results
        .into_iter()
        .map(|r| r.unwrap())
        .filter(|r| r.is_acquired())
        .count();
    assert_eq!(won, 1);
    // migrate() is idempotent.
    providers[0].migrate().await.unwrap();
    let n: i64 = sqlx::query(&format!("SELECT count(*) FROM \"{schema}\".custom_leases"))
        .fetch_one(providers[0].pool().unwrap())
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_runs_no_ddl() {
    let schema = unique("lease_schema");
    let url = store_url("LEASE_TEST_POSTGRES_URL");
    let admin = sqlx::PgPool::connect(&url).await.unwrap();
    let exists = |what: &'static str| {
        let (admin, schema) = (admin.clone(), schema.clone());
        async move {
            let n: i64 = sqlx::query(what)
                .bind(&schema)
                .fetch_one(&admin)
                .await
                .unwrap()
                .get(0);
            n > 0
        }
    };
    const SCHEMA: &str = "SELECT count(*) FROM information_schema.schemata WHERE schema_name = $1";
    const HOLDER: &str = "SELECT count(*) FROM information_schema.columns
                            WHERE table_schema = $1 AND column_name = 'holder'";
    // No schema, no table: the key is free and nothing is created.
    let p = PostgresProvider::new(PostgresConfig::new(&url).table(&schema, "leases")).unwrap();
    let k = LeaseKey::new("k").unwrap();
    assert!(p.inspect(&k).await.unwrap().is_none());
    assert!(!exists(SCHEMA).await, "inspect created the schema");
    // A table of the old layout is read as it is, not altered.
    for stmt in [
        format!("CREATE SCHEMA \"{schema}\""),
        format!(
            "CREATE TABLE \"{schema}\".leases (namespace text NOT NULL, key text NOT NULL,
               owner text NULL, token bigint NOT NULL, expires_at timestamptz NULL,
               PRIMARY KEY (namespace, key))"
        ),
        format!(
            "INSERT INTO \"{schema}\".leases VALUES ('lease', 'k', '{}', 7, now() + interval '1 hour')",
            "0".repeat(32)
        ),
    ] {
        sqlx::query(&stmt).execute(&admin).await.unwrap();
    }
    let info = p.inspect(&k).await.unwrap().expect("held");
    assert_eq!((info.token.get(), info.holder), (7, None));
    assert!(!exists(HOLDER).await, "inspect altered the table");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_from_before_holder_labels_is_upgraded_and_keeps_its_tokens() {
    let schema = unique("lease_schema");
    let url = store_url("LEASE_TEST_POSTGRES_URL");
    let admin = sqlx::PgPool::connect(&url).await.unwrap();
    // The layout of the first release: no holder column, one held-before row.
    for stmt in [
        format!("CREATE SCHEMA \"{schema}\""),
        format!(
            "CREATE TABLE \"{schema}\".old_leases (namespace text NOT NULL, key text NOT NULL,
               owner text NULL, token bigint NOT NULL, expires_at timestamptz NULL,
               PRIMARY KEY (namespace, key))"
        ),
        format!("INSERT INTO \"{schema}\".old_leases VALUES ('lease', 'k', NULL, 41, NULL)"),
    ] {
        sqlx::query(&stmt).execute(&admin).await.unwrap();
    }
    let p = PostgresProvider::new(PostgresConfig::new(url).table(&schema, "old_leases")).unwrap();
    let k = LeaseKey::new("k").unwrap();
    let l = p.try_acquire(&k, TTL).await.unwrap().into_lease().unwrap();
    assert_eq!(l.token().get(), 42, "the old row's token goes on");
    let info = p.inspect(&k).await.unwrap().unwrap();
    assert_eq!(info.holder.as_deref(), Some(l.holder()));
    assert_eq!(l.holder(), &*lease_api::holder());
    p.release(&l).await.unwrap();
    let left: Option<String> = sqlx::query(&format!(
        "SELECT holder FROM \"{schema}\".old_leases WHERE key = 'k'"
    ))
    .fetch_one(&admin)
    .await
    .unwrap()
    .get(0);
    assert_eq!(left, None, "a released row names no holder");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_holders_fenced_transaction_is_rejected_and_writes_nothing() {
    let ns = unique("fenced");
    let (a, b) = (shared(&ns), shared(&ns));
    let table = unique("ledger");
    sqlx::query(&format!(
        "CREATE TABLE {table} (batch text, writer_token bigint)"
    ))
    .execute(a.pool().unwrap())
    .await
    .unwrap();
    let k = LeaseKey::new("batch-7").unwrap();
    let ttl = Duration::from_millis(300);
    let stale = a.try_acquire(&k, ttl).await.unwrap().into_lease().unwrap();
    // The holder pauses past its TTL; another process takes over.
    let fresh = acquire(
        &Arc::new(b.clone()),
        &k,
        AcquireOptions::ttl(ttl * 10).wait(Duration::from_secs(5)),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(fresh.token() > stale.token());
    // The paused holder wakes and tries to write under its old lease.
    match a.begin_fenced(&stale).await {
        Err(LeaseError::Lost { .. }) => {}
        other => panic!("stale fenced transaction: {other:?}"),
    }
    // The live holder can write.
    let mut tx = b.begin_fenced(&fresh).await.unwrap();
    sqlx::query(&format!("INSERT INTO {table} VALUES ('batch-7', $1)"))
        .bind(fresh.token().get() as i64)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let rows: Vec<i64> = sqlx::query(&format!("SELECT writer_token FROM {table}"))
        .fetch_all(a.pool().unwrap())
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        rows,
        vec![fresh.token().get() as i64],
        "only the live holder wrote"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_waits_for_an_open_fenced_transaction() {
    let ns = unique("fenced_wait");
    let (a, b) = (shared(&ns), shared(&ns));
    let k = LeaseKey::new("batch-8").unwrap();
    let ttl = Duration::from_millis(300);
    // b connected first: its takeover below waits on the lock, not on a
    // new connection.
    b.inspect(&k).await.unwrap();
    let lease = a.try_acquire(&k, ttl).await.unwrap().into_lease().unwrap();
    let tx = a.begin_fenced(&lease).await.unwrap();
    // The lease expires while the fenced transaction is still open.
    tokio::time::sleep(ttl + Duration::from_millis(200)).await;
    let b2 = b.clone();
    let k2 = k.clone();
    let takeover = tokio::spawn(async move {
        let r = b2.try_acquire(&k2, TTL).await;
        (r, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        !takeover.is_finished(),
        "the takeover did not wait for the fenced transaction"
    );
    let committing = Instant::now();
    tx.commit().await.unwrap();
    let (r, done) = takeover.await.unwrap();
    let next = r
        .unwrap()
        .into_lease()
        .expect("taken over after the commit");
    assert!(
        done >= committing,
        "the takeover answered {:?} before the commit was sent",
        committing - done
    );
    assert!(next.token() > lease.token());
}

/// `sslmode=verify-full` with a CA made at test time, against a server that
/// takes TCP clients only over TLS and only with SCRAM passwords: leases work
/// (the waiter is notified over the TLS LISTEN connection); a wrong password,
/// a plain connection, an untrusted CA and a certificate for another host name
/// are `Denied` within the timeout, never `Unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_tls_with_scram_works_and_refusals_are_denied() {
    let ca = lease_testkit::TestCa::new();
    let server = lease_testkit::owned_postgres_tls(&ca, "scram-pw");
    let at = |host: &str, password: &str, query: String| {
        format!(
            "postgres://postgres:{password}@{host}:{}/postgres?{query}",
            server.port()
        )
    };
    let verify = |ca_file: &std::path::Path| {
        format!("sslmode=verify-full&sslrootcert={}", ca_file.display())
    };
    let make = |url: String| {
        PostgresProvider::new(
            PostgresConfig::new(url).timeouts(Duration::from_secs(2), Duration::from_secs(2)),
        )
        .unwrap()
    };
    let good = at("localhost", "scram-pw", verify(&ca.ca()));
    let holder = make(good.clone());
    let waiter = Arc::new(make(good));
    let k = LeaseKey::new(unique("tls")).unwrap();
    // Notified over the TLS LISTEN connection.
    lease_testkit::assert_handoff_is_notified(&holder, waiter, &k, TTL, Duration::from_secs(5))
        .await;

    let other_ca = lease_testkit::TestCa::new();
    for (what, url) in [
        (
            "a wrong password",
            at("localhost", "wrong", verify(&ca.ca())),
        ),
        (
            "a plain connection",
            at("localhost", "scram-pw", "sslmode=disable".into()),
        ),
        (
            "an untrusted CA",
            at("localhost", "scram-pw", verify(&other_ca.ca())),
        ),
        // The certificate names localhost and 127.0.0.1, not this name.
        (
            "another host name",
            at("127.0.0.2", "scram-pw", verify(&ca.ca())),
        ),
    ] {
        lease_testkit::assert_denied(what, &make(url), &k, "scram-pw", Duration::from_secs(5))
            .await;
    }
}

/// An expired lease whose row provider `a` holds FOR SHARE in a fenced
/// transaction (a takeover's UPDATE waits on it until `tx` ends), and
/// provider `b` in the same namespace allowed one connection and a response
/// timeout of `limit`.
struct LockedRow {
    a: PostgresProvider,
    b: Arc<PostgresProvider>,
    locked: LeaseKey,
    lease: lease_api::Lease,
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    limit: Duration,
}

impl LockedRow {
    async fn new(prefix: &str) -> Self {
        let ns = unique(prefix);
        let a = shared(&ns);
        // 1 s: the next operation after a cut-off one opens a new
        // connection (a server fork and authentication), which a loaded
        // machine can stretch past half a second.
        let limit = Duration::from_secs(1);
        let b = Arc::new(
            PostgresProvider::new(
                PostgresConfig::new(store_url("LEASE_TEST_POSTGRES_URL"))
                    .namespace(&ns)
                    .timeouts(TIMEOUT, limit)
                    .max_connections(1),
            )
            .unwrap(),
        );
        let locked = LeaseKey::new("locked-row").unwrap();
        let ttl = a.capabilities().practical_ttl(Duration::from_millis(200));
        let lease = a
            .try_acquire(&locked, ttl)
            .await
            .unwrap()
            .into_lease()
            .unwrap();
        let tx = a.begin_fenced(&lease).await.unwrap();
        tokio::time::sleep(ttl + Duration::from_millis(100)).await;
        LockedRow {
            a,
            b,
            locked,
            lease,
            tx,
            limit,
        }
    }
}

/// A statement cut off by the response timeout leaves its connection in an
/// unknown state (here: still blocked on a row lock on the server). The
/// provider must not reuse it: with a single connection allowed, the next
/// operation on another key still answers at once instead of queueing behind
/// the stuck statement until its lock goes away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_cut_off_by_the_timeout_does_not_block_the_next_operation() {
    let LockedRow {
        a,
        b,
        locked,
        lease,
        tx,
        limit,
    } = LockedRow::new("cut_off").await;
    let err = b.try_acquire(&locked, TTL).await.unwrap_err();
    assert!(matches!(err, LeaseError::Timeout { .. }), "{err:?}");
    let other = LeaseKey::new("other-row").unwrap();
    let started = Instant::now();
    let got = b
        .try_acquire(&other, TTL)
        .await
        .expect("the next operation runs on a fresh connection")
        .into_lease()
        .unwrap();
    assert!(
        started.elapsed() < limit,
        "waited {:?} behind the cut-off statement",
        started.elapsed()
    );
    b.release(&got).await.unwrap();
    // The cut-off acquire must not linger on the server and commit once the
    // row is free: a lease nobody holds, announced to nobody. The server's
    // statement limit (the response timeout) ended it.
    tokio::time::sleep(limit).await;
    drop(tx);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let now = a.inspect(&locked).await.unwrap();
    assert!(
        now.as_ref().is_none_or(|i| i.token == lease.token()),
        "the cut-off acquire committed later: {now:?}"
    );
}

/// The server's `statement_timeout` (the response timeout, set at connect)
/// can end a statement before the client's own timer fires: a loaded client
/// thread runs late. That is the same timeout and must read as one
/// (`Timeout`, transient), not as a backend error a caller would give up on.
/// The runtime's only thread is blocked past the limit while the acquire
/// waits on a row lock, so the server's cancel is the first thing the client
/// sees when it runs again (tokio's timeout polls the statement first).
#[tokio::test]
async fn a_statement_the_server_cuts_off_first_is_a_timeout() {
    let LockedRow {
        b,
        locked,
        mut tx,
        limit,
        ..
    } = LockedRow::new("server_cut").await;
    let blocker: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let admin = sqlx::PgPool::connect(&store_url("LEASE_TEST_POSTGRES_URL"))
        .await
        .unwrap();
    let take = tokio::spawn({
        let b = b.clone();
        let k = locked.clone();
        async move { b.try_acquire(&k, TTL).await }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
        )
        .bind(blocker)
        .fetch_one(&admin)
        .await
        .unwrap();
        if waiting > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the takeover never waited on the lock"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The client's timer and the server's start together; only the server's
    // can run while this thread is blocked.
    std::thread::sleep(limit * 3);
    let err = take.await.unwrap().unwrap_err();
    assert!(matches!(err, LeaseError::Timeout { .. }), "{err:?}");
    assert!(err.is_transient());
    tx.rollback().await.unwrap();
    let got = until_ok(|| b.try_acquire(&locked, TTL)).await;
    assert!(
        got.into_lease().is_some(),
        "the expired row is free to take"
    );
}

/// A session's batch step: a thousand rows renewed by one UPDATE, counted by
/// a statement-level trigger on a private table; a row whose lease was
/// released is not touched and answers Lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_many_renews_a_thousand_rows_with_one_statement() {
    let table = unique("batch");
    let p = PostgresProvider::new(
        PostgresConfig::new(store_url("LEASE_TEST_POSTGRES_URL"))
            .namespace(unique("batch"))
            .table("public", &table),
    )
    .unwrap();
    let mut leases = Vec::new();
    for i in 0..1000 {
        let k = LeaseKey::new(format!("batch/{i}")).unwrap();
        leases.push(p.try_acquire(&k, TTL).await.unwrap().into_lease().unwrap());
    }
    p.release(&leases[7]).await.unwrap();
    let pool = p.pool().unwrap();
    let counter = format!("{table}_updates");
    for sql in [
        format!("CREATE TABLE \"{counter}\" (n bigint NOT NULL)"),
        format!("INSERT INTO \"{counter}\" VALUES (0)"),
        format!(
            "CREATE FUNCTION \"{counter}_count\"() RETURNS trigger LANGUAGE plpgsql AS
             $$ BEGIN UPDATE \"{counter}\" SET n = n + 1; RETURN NULL; END $$"
        ),
        format!(
            "CREATE TRIGGER \"{counter}_trigger\" AFTER UPDATE ON \"{table}\"
             FOR EACH STATEMENT EXECUTE FUNCTION \"{counter}_count\"()"
        ),
    ] {
        sqlx::query(&sql).execute(pool).await.unwrap();
    }
    let answers = p.extend_many(&leases).await.unwrap();
    let statements: i64 = sqlx::query(&format!("SELECT n FROM \"{counter}\""))
        .fetch_one(pool)
        .await
        .unwrap()
        .get(0);
    assert_eq!(statements, 1, "one UPDATE for the batch");
    for (i, a) in answers.iter().enumerate() {
        match (i, a) {
            (7, Err(LeaseError::Lost { .. })) => {}
            (7, other) => panic!("the released lease answered {other:?}"),
            (_, Ok(l)) => assert_eq!(l.token(), leases[i].token()),
            (_, Err(e)) => panic!("lease {i}: {e}"),
        }
    }
    assert!(p.inspect(leases[7].key()).await.unwrap().is_none());
    for sql in [
        format!("DROP TABLE \"{table}\""),
        format!("DROP TABLE \"{counter}\""),
        format!("DROP FUNCTION \"{counter}_count\"()"),
    ] {
        sqlx::query(&sql).execute(pool).await.unwrap();
    }
}

/// A provider on the shared server with a lease table of its own (so
/// resetting its waiters' numbering touches no other test).
fn own_table(name: &str) -> (PostgresProvider, String) {
    let table = unique(name);
    let p = PostgresProvider::new(
        PostgresConfig::new(store_url("LEASE_TEST_POSTGRES_URL"))
            .table("public", &table)
            .timeouts(TIMEOUT, TIMEOUT),
    )
    .unwrap();
    (p, format!("\"public\".\"{table}_waiters\""))
}

/// The waiters' rows are lost and their numbering starts again (a restore,
/// or a failover to a standby that had not seen the sequence's last WAL): a
/// new waiter gets the stale ticket's number. The stale waiter must find its
/// ticket gone, not refresh, stand in or remove the new waiter's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_number_given_again_after_the_queue_was_lost_is_not_the_old_ticket() {
    let (p, waiters) = own_table("reused_ticket");
    let queue = p.wait_queue().expect("PostgreSQL has a queue of waiters");
    let k = LeaseKey::new(unique("reused-ticket")).unwrap();
    let stale = queue.join(&k, TTL, Ticket::random_mark()).await.unwrap();
    let pool = p.pool().unwrap();
    sqlx::query(&format!("DELETE FROM {waiters}"))
        .execute(pool)
        .await
        .unwrap();
    sqlx::query(&format!("ALTER TABLE {waiters} ALTER COLUMN seq RESTART"))
        .execute(pool)
        .await
        .unwrap();
    let reused = loop {
        let t = queue.join(&k, TTL, Ticket::random_mark()).await.unwrap();
        assert!(t.seq() <= stale.seq(), "the numbering did not start again");
        if t.seq() == stale.seq() {
            break t;
        }
    };
    assert!(
        !queue.refresh(&stale, TTL).await.unwrap(),
        "the stale waiter refreshed the new waiter's ticket {reused:?}"
    );
    assert_eq!(queue.place(&stale).await.unwrap(), Place::Gone);
    queue.leave(&stale).await.unwrap();
    assert!(
        queue.refresh(&reused, TTL).await.unwrap(),
        "the stale waiter's leave removed the new waiter's ticket"
    );
    assert_eq!(queue.place(&reused).await.unwrap(), Place::First);
    sqlx::query(&format!(
        "DROP TABLE {waiters}, {}",
        waiters.replace("_waiters", "")
    ))
    .execute(pool)
    .await
    .unwrap();
}

/// A private server, a fault proxy in front of it and a provider through
/// the proxy.
async fn behind_a_proxy() -> (OwnedProcess, lease_testkit::Proxy, PostgresProvider) {
    let server = owned_postgres();
    let proxy = lease_testkit::Proxy::start(server.port()).await;
    let p = PostgresProvider::new(
        PostgresConfig::new(format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            proxy.port()
        ))
        .timeouts(TIMEOUT, TIMEOUT),
    )
    .unwrap();
    (server, proxy, p)
}

/// A provider through `proxy` whose response timeout (and so the server's
/// statement limit) is `limit`.
fn through(proxy: &lease_testkit::Proxy, limit: Duration) -> PostgresProvider {
    PostgresProvider::new(
        PostgresConfig::new(format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            proxy.port()
        ))
        .timeouts(limit, limit),
    )
    .unwrap()
}

/// In the cases of acquires without an answer: every request is held this
/// long on its way, and the client gives up after `LIMIT`, so a statement
/// arrives before the client gives up and may run until `HELD + LIMIT`,
/// leaving a margin of `HELD` for what must happen in between.
const HELD: Duration = Duration::from_millis(1500);
const LIMIT: Duration = Duration::from_secs(2);

/// Tries `key` through `p` while `proxy` holds requests back, and lets
/// requests through at once again once the statement is on its way (300 ms
/// later): the cancel's own connection, made when the client gives up, is
/// not held back. The acquire's error.
async fn sent_then_undelayed(
    proxy: &lease_testkit::Proxy,
    p: &PostgresProvider,
    key: &LeaseKey,
) -> LeaseError {
    let (q, k) = (p.clone(), key.clone());
    let attempt = tokio::spawn(async move { q.try_acquire(&k, TTL).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.delay_requests(Duration::ZERO);
    attempt.await.unwrap().unwrap_err()
}

/// The answer to a fair waiter's join is lost (the connection drops after
/// the INSERT committed): the waiter's retry finds its own ticket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_acquire_whose_join_answer_was_lost_does_not_wait_behind_its_own_ticket() {
    let (_server, proxy, p) = behind_a_proxy().await;
    // The join is the first statement that carries the key.
    lease_testkit::assert_a_lost_join_answer_costs_no_wait(Arc::new(p), &proxy, |k| {
        k.as_str().as_bytes().to_vec()
    })
    .await;
}

/// The answer to a fair waiter's join is lost (the connection drops after
/// the INSERT committed) just as its wait runs out, so it never retries: it must still
/// clear the ticket the store made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_acquire_that_ends_after_a_lost_join_leaves_no_ticket() {
    let (_server, proxy, p) = behind_a_proxy().await;
    // The join is the first statement that carries the key.
    lease_testkit::assert_a_join_lost_as_the_wait_ends_leaves_no_ticket(Arc::new(p), &proxy, |k| {
        k.as_str().as_bytes().to_vec()
    })
    .await;
}

/// A join retried with the same mark while the first join is still running
/// (its answer lost, its INSERT not yet committed) must not make a second
/// ticket: the retry waits for the first and renews its row. The first
/// join's INSERT is held open here in a transaction of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_retried_while_the_first_is_in_flight_makes_one_ticket() {
    let (p, waiters) = own_table("inflight_join");
    let queue = p.wait_queue().expect("PostgreSQL has a queue of waiters");
    let k = LeaseKey::new(unique("inflight-join")).unwrap();
    // Made once, so the table and its index exist.
    let warm = queue.join(&k, TTL, Ticket::random_mark()).await.unwrap();
    queue.leave(&warm).await.unwrap();
    let pool = p.pool().unwrap();
    let mark = Ticket::random_mark();
    let mark_sql = i64::from_ne_bytes(mark.to_ne_bytes());
    let mut first = pool.begin().await.unwrap();
    let first_seq: i64 = sqlx::query_scalar(&format!(
        "INSERT INTO {waiters} (namespace, key, mark, expires_at)
         VALUES ($1, $2, $3, clock_timestamp() + interval '30 seconds') RETURNING seq"
    ))
    .bind(p.namespace())
    .bind(k.as_str())
    .bind(mark_sql)
    .fetch_one(&mut *first)
    .await
    .unwrap();
    let retry = {
        let (queue_p, k) = (p.clone(), k.clone());
        tokio::spawn(async move {
            let queue = queue_p.wait_queue().expect("queue");
            queue.join(&k, TTL, mark).await
        })
    };
    // Until the retry waits on the first join's row (or, without the
    // unique index, has already made its own ticket).
    let deadline = Instant::now() + Duration::from_secs(10);
    while !retry.is_finished() {
        let waiting: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
              WHERE wait_event_type = 'Lock' AND query LIKE '%ON CONFLICT%')",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        if waiting {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the retry neither waited nor ended"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.commit().await.unwrap();
    let retried = retry.await.unwrap().unwrap();
    let rows: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {waiters} WHERE key = $1 AND mark = $2"
    ))
    .bind(k.as_str())
    .bind(mark_sql)
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(rows, 1, "two tickets for one join");
    assert_eq!(retried.seq(), u64::try_from(first_seq).unwrap());
    sqlx::query(&format!(
        "DROP TABLE {waiters}, {}",
        waiters.replace("_waiters", "")
    ))
    .execute(pool)
    .await
    .unwrap();
}

/// A join with the mark of a ticket that died meanwhile (its waiter's join
/// answer was lost, then the waiter was cut off past the ticket's TTL) gets
/// a new ticket at the end of the line, not the dead one back at its old
/// place ahead of the waiters who joined since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_with_a_dead_tickets_mark_joins_at_the_end_of_the_line() {
    let (p, waiters) = own_table("dead_mark");
    let queue = p.wait_queue().expect("PostgreSQL has a queue of waiters");
    let k = LeaseKey::new(unique("dead-mark")).unwrap();
    let pool = p.pool().unwrap();
    let mark = Ticket::random_mark();
    let short = p.capabilities().practical_ttl(Duration::from_millis(300));
    let dead = queue.join(&k, short, mark).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let expired: bool = sqlx::query_scalar(&format!(
            "SELECT expires_at <= clock_timestamp() FROM {waiters} WHERE seq = $1"
        ))
        .bind(i64::try_from(dead.seq()).unwrap())
        .fetch_one(pool)
        .await
        .unwrap();
        if expired {
            break;
        }
        assert!(Instant::now() < deadline, "the ticket never expired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let other = queue.join(&k, TTL, Ticket::random_mark()).await.unwrap();
    let again = queue.join(&k, TTL, mark).await.unwrap();
    assert!(
        again.seq() > other.seq(),
        "the dead ticket {} came back ahead of {}: {}",
        dead.seq(),
        other.seq(),
        again.seq()
    );
    assert_eq!(queue.place(&other).await.unwrap(), Place::First);
    sqlx::query(&format!(
        "DROP TABLE {waiters}, {}",
        waiters.replace("_waiters", "")
    ))
    .execute(pool)
    .await
    .unwrap();
}

/// A waiters' table without the unique index on marks (a role that may not
/// add it, with `create_table(false)`): joins still work, by the statement
/// from before the index, and a join retried with its mark finds its ticket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_work_on_a_waiters_table_without_the_mark_index() {
    let (p, waiters) = own_table("no_mark_index");
    let pool = p.pool().unwrap();
    p.migrate().await.unwrap();
    let index = waiters.replace("_waiters\"", "_waiters_mark\"");
    sqlx::query(&format!("DROP INDEX {index}"))
        .execute(pool)
        .await
        .unwrap();
    let table = waiters
        .trim_start_matches("\"public\".\"")
        .trim_end_matches("_waiters\"");
    let q = PostgresProvider::new(
        PostgresConfig::new(store_url("LEASE_TEST_POSTGRES_URL"))
            .table("public", table)
            .create_table(false)
            .timeouts(TIMEOUT, TIMEOUT),
    )
    .unwrap();
    let queue = q.wait_queue().expect("PostgreSQL has a queue of waiters");
    let k = LeaseKey::new(unique("no-index")).unwrap();
    let mark = Ticket::random_mark();
    let first = queue.join(&k, TTL, mark).await.unwrap();
    let retried = queue.join(&k, TTL, mark).await.unwrap();
    assert_eq!(
        first.seq(),
        retried.seq(),
        "a retried join made a second ticket"
    );
    assert_eq!(queue.place(&first).await.unwrap(), Place::First);
    queue.leave(&first).await.unwrap();
    sqlx::query(&format!(
        "DROP TABLE {waiters}, {}",
        waiters.replace("_waiters", "")
    ))
    .execute(pool)
    .await
    .unwrap();
}

/// Which acquire a late-commit case makes.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Plain,
    Reader,
    Writer,
}

impl Kind {
    async fn try_acquire(
        self,
        p: &PostgresProvider,
        key: &LeaseKey,
        ttl: Duration,
    ) -> Result<lease_api::TryAcquire, LeaseError> {
        match self {
            Kind::Plain => p.try_acquire(key, ttl).await,
            Kind::Reader => p.try_acquire_read(key, ttl).await,
            Kind::Writer => p.try_acquire_write(key, ttl, None).await,
        }
    }

    /// The token of the lease of this kind on `key`, if one is held.
    async fn held(self, p: &PostgresProvider, key: &LeaseKey) -> Option<u64> {
        match self {
            Kind::Plain => p.inspect(key).await.unwrap().map(|i| i.token.get()),
            Kind::Reader => {
                let rw = p.inspect_rw(key).await.unwrap();
                rw.readers.first().map(|i| i.token.get())
            }
            Kind::Writer => {
                let rw = p.inspect_rw(key).await.unwrap();
                rw.writer.map(|i| i.token.get())
            }
        }
    }

    /// Takes and gives back a lease of this kind through `p`: the tables
    /// are made and a connection used within the last second (no ping), so
    /// the next acquire is one statement on the wire.
    async fn warm(self, p: &PostgresProvider) {
        let k = LeaseKey::new("warm").unwrap();
        let l = self
            .try_acquire(p, &k, TTL)
            .await
            .unwrap()
            .into_lease()
            .unwrap();
        p.release(&l).await.unwrap();
    }

    fn table(self) -> &'static str {
        match self {
            Kind::Plain => "lease_leases",
            Kind::Reader | Kind::Writer => "lease_leases_rw",
        }
    }
}

/// An acquire whose statement reaches the server late (every request is
/// held [`HELD`] on its way) gives up at the response timeout, counted from
/// before it was sent, while the server's statement limit counts from its
/// arrival. The row it waits on (locked by another transaction) is freed in
/// between, so the statement commits a lease nobody holds. The provider ends
/// the session the statement was sent on, then releases what it won and
/// tells the key's waiters: a waiter (a writer on read/write keys, which
/// readers keep out too) gets the key long before the lease's 30 s TTL.
async fn a_late_commit_is_released(kind: Kind) {
    let server = owned_postgres();
    let proxy = lease_testkit::Proxy::start(server.port()).await;
    let p = through(&proxy, LIMIT);
    let direct = Arc::new(
        PostgresProvider::new(PostgresConfig::new(url(&server)).timeouts(TIMEOUT, TIMEOUT))
            .unwrap(),
    );
    let key = LeaseKey::new("late").unwrap();
    let first = kind
        .try_acquire(&direct, &key, TTL)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    direct.release(&first).await.unwrap();
    let mut blocker = <sqlx::PgConnection as sqlx::Connection>::connect(&url(&server))
        .await
        .unwrap();
    sqlx::query("BEGIN").execute(&mut blocker).await.unwrap();
    sqlx::query(&format!(
        "SELECT 1 FROM {} WHERE namespace = $1 AND key = $2 FOR UPDATE",
        kind.table()
    ))
    .bind(direct.namespace())
    .bind(key.as_str())
    .execute(&mut blocker)
    .await
    .unwrap();
    kind.warm(&p).await;
    proxy.delay_requests(HELD);
    let sent = Instant::now();
    let err = kind.try_acquire(&p, &key, TTL).await.unwrap_err();
    assert!(
        matches!(err, LeaseError::Timeout { .. }),
        "{kind:?}: {err:?}"
    );
    // The client gave up (LIMIT); the server's limit runs to HELD + LIMIT.
    sqlx::query("ROLLBACK").execute(&mut blocker).await.unwrap();
    let freed = sent.elapsed();
    let seen = Instant::now();
    let late = loop {
        if let Some(token) = kind.held(&direct, &key).await {
            break token;
        }
        assert!(
            seen.elapsed() < Duration::from_secs(2),
            "{kind:?}: the late statement never committed (the row was freed {freed:?} after it was sent): this case tests nothing"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(late > first.token().get(), "{kind:?}: {late}");
    // A network that slow would time the cancel's own connection out too.
    proxy.delay_requests(Duration::ZERO);
    let started = Instant::now();
    let options = AcquireOptions::ttl(TTL).wait(Duration::from_secs(25));
    let got = match kind {
        Kind::Plain => acquire(&direct, &key, options).await,
        Kind::Reader | Kind::Writer => lease_api::acquire_write(&direct, &key, options).await,
    }
    .unwrap()
    .expect("the key came free");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{kind:?}: the late lease held the key for {:?}",
        started.elapsed()
    );
    direct.release(&got).await.unwrap();
    p.flush(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_the_client_gave_up_on_that_commits_late_is_released() {
    a_late_commit_is_released(Kind::Plain).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_acquire_the_client_gave_up_on_that_commits_late_is_released() {
    a_late_commit_is_released(Kind::Reader).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_acquire_the_client_gave_up_on_that_commits_late_is_released() {
    a_late_commit_is_released(Kind::Writer).await;
}

/// An acquire still on its way when the client gave up (every request is
/// held 3 s in the network, and the key is free) would run in full on
/// arrival, a lease nobody holds. The provider ends the server session it
/// was sent on, so when the statement arrives nobody runs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_still_on_its_way_when_the_client_gave_up_never_runs() {
    let (server, proxy, p) = behind_a_proxy().await;
    // The client gives up after TIMEOUT (800 ms); the cancel has until the
    // statement arrives.
    let direct =
        PostgresProvider::new(PostgresConfig::new(url(&server)).timeouts(TIMEOUT, TIMEOUT))
            .unwrap();
    let key = LeaseKey::new("on-its-way").unwrap();
    Kind::Plain.warm(&p).await;
    let held_for = Duration::from_secs(3);
    proxy.delay_requests(held_for);
    let sent = Instant::now();
    let err = sent_then_undelayed(&proxy, &p, &key).await;
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

/// An acquire that reached the server and still waits there (on a row an
/// open fenced transaction holds) when the client gives up is ended on the
/// server by the cancel, while the statement limit would still let it run:
/// when the row comes free, nothing commits. Releasing by owner alone would
/// not do: the row is not ours yet when the cancel looks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_still_waiting_on_the_server_when_the_client_gave_up_is_ended_there() {
    let server = owned_postgres();
    let proxy = lease_testkit::Proxy::start(server.port()).await;
    let (held_for, limit) = (HELD, LIMIT);
    let p = through(&proxy, limit);
    let direct =
        PostgresProvider::new(PostgresConfig::new(url(&server)).timeouts(TIMEOUT, TIMEOUT))
            .unwrap();
    let key = LeaseKey::new("waiting").unwrap();
    let short = direct
        .capabilities()
        .practical_ttl(Duration::from_millis(200));
    let old = direct
        .try_acquire(&key, short)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let tx = direct.begin_fenced(&old).await.unwrap();
    tokio::time::sleep(short + Duration::from_millis(100)).await;
    Kind::Plain.warm(&p).await;
    proxy.delay_requests(held_for);
    let sent = Instant::now();
    let err = sent_then_undelayed(&proxy, &p, &key).await;
    assert!(matches!(err, LeaseError::Timeout { .. }), "{err:?}");
    p.flush(Duration::from_secs(10)).await;
    assert!(
        sent.elapsed() < held_for + limit,
        "the cancel ended after the statement limit ({:?}): this case tests nothing",
        sent.elapsed()
    );
    drop(tx);
    while sent.elapsed() < held_for + limit + Duration::from_secs(1) {
        let now = direct.inspect(&key).await.unwrap();
        assert!(now.is_none(), "the waiting acquire committed: {now:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
