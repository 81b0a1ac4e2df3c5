//! Database claims on a real PostgreSQL: the SKIP LOCKED job queue (16
//! workers over 100,000 jobs, a worker killed mid-batch, stale completions)
//! and once-per-slot claims.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use lease_api::LeaseError;
use lease_postgres::{
    Completion, JobQueue, OnceClaims, PostgresConfig, PostgresProvider, QueueConfig,
};
use lease_testkit::{store_url, unique};
use sqlx::Row;

fn provider(max_connections: u32) -> PostgresProvider {
    PostgresProvider::new(
        PostgresConfig::new(store_url("LEASE_TEST_POSTGRES_URL"))
            .namespace(unique("claims"))
            .max_connections(max_connections),
    )
    .unwrap()
}

/// A job table of `n` rows (ids 1..=n) with a `kind` column, named uniquely.
async fn job_table(p: &PostgresProvider, n: i64) -> String {
    let table = unique("jobs").replace('-', "_");
    let pool = p.pool().unwrap();
    sqlx::query(&format!(
        "CREATE TABLE {table} (id bigint PRIMARY KEY, kind text NOT NULL, payload int NOT NULL)"
    ))
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(&format!(
        "INSERT INTO {table} SELECT g, CASE WHEN g % 2 = 0 THEN 'even' ELSE 'odd' END, g FROM generate_series(1, $1) g"
    ))
    .bind(n)
    .execute(pool)
    .await
    .unwrap();
    table
}

/// Waits (10 s at most) until the claims of `ids` ran out on the server's
/// clock, which decides. A claim's local validity ends first, earlier by as
/// long as the claiming statement took to start on the server: on a loaded
/// machine more than any fixed slack.
async fn until_expired_on_the_server(p: &PostgresProvider, table: &str, ids: &[i64]) {
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        let live: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {table} WHERE id = ANY($1) AND lease_until > clock_timestamp()"
        ))
        .bind(ids)
        .fetch_one(p.pool().unwrap())
        .await
        .unwrap();
        if live == 0 {
            return;
        }
        assert!(
            Instant::now() < give_up,
            "the claims of {ids:?} were still live on the server 10 s on"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn count(p: &PostgresProvider, sql: &str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(p.pool().unwrap())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_skip_each_other_follow_filter_and_order_and_stale_workers_change_nothing() {
    let p = provider(4);
    let table = job_table(&p, 20).await;
    let visibility = Duration::from_millis(600);
    let queue = JobQueue::new(
        &p,
        QueueConfig::new(&table)
            .filter("kind = 'even'")
            .order("payload DESC")
            .visibility(visibility)
            .completion(Completion::Mark),
    )
    .unwrap();
    let a = queue.claim_next(3).await.unwrap();
    assert_eq!(a.ids(), &[20, 18, 16], "the filter and the order decide");
    let payload: i32 = a.rows()[0].try_get("payload").unwrap();
    assert_eq!(payload, 20);
    let b = queue.claim_next(3).await.unwrap();
    assert_eq!(b.ids(), &[14, 12, 10], "claimed rows are skipped");
    assert!(b.token() > a.token());

    // a's claim runs out and c takes its rows over with a greater token.
    tokio::time::sleep_until(a.valid_until()).await;
    until_expired_on_the_server(&p, &table, a.ids()).await;
    let mut b = b;
    let extended = queue.extend(&mut b, Duration::from_secs(30)).await.unwrap();
    assert!(extended.all_done());
    let c = queue.claim_next(3).await.unwrap();
    assert_eq!(c.ids(), &[20, 18, 16], "an expired claim's rows come back");
    assert!(c.token() > b.token());
    // The stale worker a: completing, extending, releasing change nothing.
    let stale = queue.complete(&a, a.ids()).await.unwrap();
    assert_eq!(stale.stale, vec![20, 18, 16]);
    assert!(stale.done.is_empty());
    assert!(!queue.release(&a, a.ids()).await.unwrap().all_done());
    let mut a = a;
    let outcome = queue.extend(&mut a, Duration::from_secs(30)).await.unwrap();
    assert!(a.is_empty() && outcome.done.is_empty());

    // c completes; b releases one row, which the next claim gets at once.
    assert!(queue.complete(&c, c.ids()).await.unwrap().all_done());
    assert!(queue.release(&b, &[12]).await.unwrap().all_done());
    let d = queue.claim_next(1).await.unwrap();
    assert_eq!(d.ids(), &[12]);
    // Done rows are never claimed again, whatever their claim's age.
    let done = count(
        &p,
        &format!("SELECT count(*) FROM {table} WHERE lease_done_at IS NOT NULL"),
    )
    .await;
    assert_eq!(done, 3);
    let rest = queue.claim_next(100).await.unwrap();
    assert_eq!(rest.ids(), &[8, 6, 4, 2]);
    assert!(queue.claim_next(100).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_inside_the_workers_transaction_commits_with_the_work_or_not_at_all() {
    let p = provider(4);
    let table = job_table(&p, 4).await;
    let queue = JobQueue::new(
        &p,
        QueueConfig::new(&table).visibility(Duration::from_millis(300)),
    )
    .unwrap();
    let slow = queue.claim_next(2).await.unwrap();
    tokio::time::sleep_until(slow.valid_until()).await;
    until_expired_on_the_server(&p, &table, slow.ids()).await;
    let fast = queue.claim_next(2).await.unwrap();
    assert_eq!(fast.ids(), slow.ids());
    let pool = p.pool().unwrap();
    // The slow worker's effect and completion: refused, so rolled back.
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(&format!(
        "UPDATE {table} SET payload = -1 WHERE id = ANY($1)"
    ))
    .bind(slow.ids())
    .execute(&mut *tx)
    .await
    .unwrap();
    let outcome = queue.complete_in(&mut tx, &slow, slow.ids()).await.unwrap();
    assert!(!outcome.all_done());
    tx.rollback().await.unwrap();
    // A completion rolled back with its transaction leaves the rows claimed
    // by their worker: complete_in ran inside that transaction.
    let mut tx = pool.begin().await.unwrap();
    assert!(
        queue
            .complete_in(&mut tx, &fast, fast.ids())
            .await
            .unwrap()
            .all_done()
    );
    tx.rollback().await.unwrap();
    assert_eq!(count(&p, &format!("SELECT count(*) FROM {table}")).await, 4);
    // The worker that holds the rows: its effect and completion commit.
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(&format!(
        "UPDATE {table} SET payload = payload * 10 WHERE id = ANY($1)"
    ))
    .bind(fast.ids())
    .execute(&mut *tx)
    .await
    .unwrap();
    assert!(
        queue
            .complete_in(&mut tx, &fast, fast.ids())
            .await
            .unwrap()
            .all_done()
    );
    tx.commit().await.unwrap();
    assert_eq!(
        count(
            &p,
            &format!("SELECT count(*) FROM {table} WHERE payload < 0")
        )
        .await,
        0
    );
    assert_eq!(count(&p, &format!("SELECT count(*) FROM {table}")).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_workers_process_a_hundred_thousand_jobs_exactly_once() {
    const JOBS: usize = 100_000;
    const WORKERS: usize = 16;
    let p = provider(WORKERS as u32 + 2);
    let table = job_table(&p, JOBS as i64).await;
    let queue = Arc::new(JobQueue::new(&p, QueueConfig::new(&table)).unwrap());
    let seen: Arc<Vec<AtomicU8>> = Arc::new((0..=JOBS).map(|_| AtomicU8::new(0)).collect());
    let claims = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers = (0..WORKERS).map(|_| {
        let (queue, seen, claims) = (Arc::clone(&queue), Arc::clone(&seen), Arc::clone(&claims));
        tokio::spawn(async move {
            loop {
                let claim = queue.claim_next(100).await.unwrap();
                if claim.is_empty() {
                    return;
                }
                claims.fetch_add(1, Ordering::Relaxed);
                for id in claim.ids() {
                    seen[usize::try_from(*id).unwrap()].fetch_add(1, Ordering::Relaxed);
                }
                let outcome = queue.complete(&claim, claim.ids()).await.unwrap();
                assert!(outcome.all_done(), "{:?}", outcome.stale);
            }
        })
    });
    for w in join_all(workers).await {
        w.unwrap();
    }
    let elapsed = started.elapsed();
    let twice: Vec<usize> = (1..=JOBS)
        .filter(|i| seen[*i].load(Ordering::Relaxed) != 1)
        .take(10)
        .collect();
    assert!(
        twice.is_empty(),
        "jobs not processed exactly once: {twice:?}"
    );
    assert_eq!(count(&p, &format!("SELECT count(*) FROM {table}")).await, 0);
    println!(
        "{JOBS} jobs, {WORKERS} workers, {} claims: {elapsed:?}, {:.0} jobs/s",
        claims.load(Ordering::Relaxed),
        JOBS as f64 / elapsed.as_secs_f64()
    );
}

/// Set in the child process of the crash test: the job table to claim from.
const CHILD_TABLE: &str = "LEASE_TEST_CRASHED_WORKER_TABLE";
/// Set in the child process of the crash test: where it reports its claim.
const CHILD_REPORT: &str = "LEASE_TEST_CRASHED_WORKER_REPORT";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workers_rows_come_back_after_the_visibility_timeout() {
    let visibility = Duration::from_secs(3);
    if let Ok(table) = std::env::var(CHILD_TABLE) {
        // The child: claim a batch, say which, then hang until killed.
        let queue =
            JobQueue::new(&provider(2), QueueConfig::new(table).visibility(visibility)).unwrap();
        // The wall clock before the claim: the server stamps the claim
        // after it, so the rows must stay away for the visibility from here.
        let before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis();
        let claim = queue.claim_next(50).await.unwrap();
        let report = std::env::var(CHILD_REPORT).unwrap();
        let line = format!(
            "claimed {} token {} before {before}\n",
            claim.ids().len(),
            claim.token()
        );
        std::fs::write(format!("{report}.tmp"), line).unwrap();
        std::fs::rename(format!("{report}.tmp"), report).unwrap();
        std::future::pending::<()>().await;
    }
    let p = provider(4);
    let table = job_table(&p, 200).await;
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("claimed");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "a_killed_workers_rows_come_back_after_the_visibility_timeout",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_TABLE, &table)
        .env(CHILD_REPORT, &report)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let waiting = Instant::now();
    let line = loop {
        if let Ok(line) = std::fs::read_to_string(&report) {
            break line.trim().to_owned();
        }
        assert!(
            waiting.elapsed() < Duration::from_secs(60) && child.try_wait().unwrap().is_none(),
            "the worker did not report its claim"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let claimed_at = Instant::now();
    assert!(line.starts_with("claimed 50 "), "{line}");
    let fields: Vec<&str> = line.split(' ').collect();
    let child_token: u64 = fields[3].parse().unwrap();
    let before_claim =
        std::time::UNIX_EPOCH + Duration::from_millis(fields[5].parse::<u64>().unwrap());
    // kill -9 mid-batch: no completion, no release, its connection cut.
    child.kill().unwrap();
    child.wait().unwrap();

    let queue = JobQueue::new(&p, QueueConfig::new(&table).visibility(visibility)).unwrap();
    let rest = queue.claim_next(1000).await.unwrap();
    assert_eq!(rest.ids().len(), 150, "the dead worker's rows stay claimed");
    assert_eq!(rest.ids()[0], 51);
    // One expiry for the whole claim: its rows come back together, never a
    // batch in parts (the clock is read once per claim, not per row).
    let expiries = count(
        &p,
        &format!(
            "SELECT count(DISTINCT lease_until) FROM {table} WHERE lease_token = {}",
            rest.token().get()
        ),
    )
    .await;
    assert_eq!(expiries, 1, "a claim of 150 rows has {expiries} expiries");
    assert!(queue.complete(&rest, rest.ids()).await.unwrap().all_done());
    let back = loop {
        let claim = queue.claim_next(1000).await.unwrap();
        if !claim.is_empty() {
            break claim;
        }
        assert!(
            claimed_at.elapsed() < visibility * 3,
            "the rows never came back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let after = std::time::SystemTime::now()
        .duration_since(before_claim)
        .unwrap_or_default();
    assert_eq!(back.ids(), (1..=50).collect::<Vec<i64>>());
    assert!(back.token().get() > child_token);
    assert!(
        after >= visibility,
        "the rows came back {after:?} after the claim was sent, before the visibility ran out"
    );
    assert!(queue.complete(&back, back.ids()).await.unwrap().all_done());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn integer_keys_and_a_column_added_later_do_not_break_claims() {
    let p = provider(2);
    let table = unique("int_jobs").replace('-', "_");
    let pool = p.pool().unwrap();
    sqlx::query(&format!(
        "CREATE TABLE {table} (id serial PRIMARY KEY, note text)"
    ))
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(&format!(
        "INSERT INTO {table} (note) SELECT 'n' FROM generate_series(1, 6)"
    ))
    .execute(pool)
    .await
    .unwrap();
    let queue = JobQueue::new(&p, QueueConfig::new(&table)).unwrap();
    let first = queue.claim_next(2).await.unwrap();
    assert_eq!(first.ids(), &[1, 2], "an integer key is read as a bigint");
    // The table changes shape while workers run: claims go on.
    sqlx::query(&format!("ALTER TABLE {table} ADD COLUMN added int"))
        .execute(pool)
        .await
        .unwrap();
    for _ in 0..3 {
        let next = queue.claim_next(1).await.unwrap();
        assert_eq!(next.ids().len(), 1);
        assert!(queue.complete(&next, next.ids()).await.unwrap().all_done());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_queue_settings_are_refused_with_reasons() {
    let p = provider(2);
    for (config, what) in [
        (QueueConfig::new("jobs; DROP TABLE x"), "invalid table"),
        (QueueConfig::new("jobs").id_column("id\""), "invalid column"),
        (
            QueueConfig::new("jobs").visibility(Duration::ZERO),
            "visibility",
        ),
        (QueueConfig::new("jobs").filter("  "), "filter is empty"),
    ] {
        let err = JobQueue::new(&p, config).unwrap_err();
        assert!(
            matches!(&err, LeaseError::Config(m) if m.contains(what)),
            "{what}: {err}"
        );
    }
    // A missing table is the database's error, not a panic or a hang.
    let queue = JobQueue::new(&p, QueueConfig::new(unique("absent").replace('-', "_"))).unwrap();
    let err = queue.claim_next(1).await.unwrap_err();
    assert!(matches!(err, LeaseError::Backend { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_one_of_many_callers_wins_each_slot_for_as_long_as_it_is_kept() {
    let p = provider(20);
    let claims = OnceClaims::new(&p);
    let resource = "nightly-report";
    let won = join_all((0..16).map(|_| {
        let claims = claims.clone();
        async move {
            claims
                .claim_once(resource, "2026-12-04", None)
                .await
                .unwrap()
        }
    }))
    .await;
    let winners: Vec<_> = won.into_iter().flatten().collect();
    assert_eq!(winners.len(), 1, "{winners:?}");
    let first = winners[0].token;
    // Forever: asked again later, still nobody else.
    assert!(
        claims
            .claim_once(resource, "2026-12-04", None)
            .await
            .unwrap()
            .is_none()
    );
    let holder = claims
        .holder(resource, "2026-12-04")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(holder.token, first);
    assert!(holder.retained_for.is_none());
    assert!(holder.holder.unwrap().contains('@'));
    // The next slot is its own, with a greater token.
    let next = claims
        .claim_once(resource, "2026-12-05", None)
        .await
        .unwrap()
        .unwrap();
    assert!(next.token > first);

    // With a retention, the slot can be claimed again once it has passed.
    let retention = Duration::from_millis(500);
    // Before the claim: the server starts the retention at the claim, some
    // time before the answer arrives here.
    let at = Instant::now();
    let kept = claims
        .claim_once(resource, "hourly", Some(retention))
        .await
        .unwrap()
        .unwrap();
    assert!(
        claims
            .claim_once(resource, "hourly", Some(retention))
            .await
            .unwrap()
            .is_none()
    );
    let again = loop {
        if let Some(c) = claims
            .claim_once(resource, "hourly", Some(retention))
            .await
            .unwrap()
        {
            break c;
        }
        assert!(at.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    assert!(
        at.elapsed() >= retention,
        "the slot was claimed again {:?} after the claim, within its retention",
        at.elapsed()
    );
    assert!(again.token > kept.token);

    // Another namespace is another world.
    let elsewhere = OnceClaims::new(&provider(2));
    assert!(
        elsewhere
            .claim_once(resource, "2026-12-04", None)
            .await
            .unwrap()
            .is_some()
    );

    for (r, s) in [("", "x"), ("x", ""), ("x\0y", "x")] {
        let err = claims.claim_once(r, s, None).await.unwrap_err();
        assert!(matches!(err, LeaseError::Config(_)), "{err:?}");
    }
    assert!(matches!(
        claims.claim_once("x", "y", Some(Duration::ZERO)).await,
        Err(LeaseError::Config(_))
    ));
    tokio::time::sleep(retention).await;
    assert!(claims.purge_expired().await.unwrap() >= 1);
    assert!(
        claims
            .holder(resource, "2026-12-04")
            .await
            .unwrap()
            .is_some()
    );
}

/// The answer to a claim is lost (the connection drops as PostgreSQL
/// answers, after the INSERT committed): the call tries again with its claim
/// id and gets its own claim, not `None` (which would leave the slot's job to
/// nobody) and not an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_answer_was_lost_is_still_won_by_its_caller() {
    let server = lease_testkit::owned_postgres();
    let proxy = lease_testkit::Proxy::start(server.port()).await;
    let p = PostgresProvider::new(
        PostgresConfig::new(format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            proxy.port()
        ))
        .namespace(unique("claims")),
    )
    .unwrap();
    let claims = OnceClaims::new(&p);
    claims.migrate().await.unwrap();
    let slot = unique("slot");
    // The claim's statement is the first to carry the slot.
    proxy.lose_reply_to(slot.as_bytes());
    let won = claims.claim_once("nightly", &slot, None).await;
    assert!(proxy.reply_lost(), "the claim's answer was never lost");
    let won = won
        .expect("a lost answer is tried again")
        .expect("the caller's own claim");
    let holder = claims.holder("nightly", &slot).await.unwrap().unwrap();
    assert_eq!(holder.token, won.token);
    assert_eq!(
        claims.claim_once("nightly", &slot, None).await.unwrap(),
        None,
        "a second call is a new claim"
    );
}

/// A role that may only read and write rows claims on a table made before
/// claims had ids: it cannot add the column, so it uses the table as it is
/// (one winner per slot, as before), instead of failing every claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_only_role_claims_on_a_table_from_before_claim_ids() {
    let admin_url = store_url("LEASE_TEST_POSTGRES_URL");
    let admin = sqlx::PgPool::connect(&admin_url).await.unwrap();
    let name = unique("rowonly").replace('-', "_");
    for sql in [
        format!("CREATE ROLE {name} LOGIN"),
        format!("CREATE SCHEMA {name}"),
        format!("GRANT USAGE ON SCHEMA {name} TO {name}"),
        // The table and sequence as a version before claim ids made them.
        format!(
            "CREATE TABLE {name}.claims (
                namespace text NOT NULL, resource text NOT NULL, slot text NOT NULL,
                token bigint NOT NULL, holder text NULL, claimed_at timestamptz NOT NULL,
                expires_at timestamptz NULL, PRIMARY KEY (namespace, resource, slot))"
        ),
        format!("CREATE SEQUENCE {name}.claims_token"),
        format!("GRANT SELECT, INSERT, UPDATE, DELETE ON {name}.claims TO {name}"),
        format!("GRANT USAGE, SELECT ON SEQUENCE {name}.claims_token TO {name}"),
    ] {
        sqlx::query(&sql).execute(&admin).await.unwrap();
    }
    let url = admin_url.replacen("postgres@", &format!("{name}@"), 1);
    let p = PostgresProvider::new(PostgresConfig::new(url).create_table(false)).unwrap();
    let claims = OnceClaims::in_table(&p, &name, "claims").unwrap();
    let won = claims.claim_once("nightly", "2026-12-06", None).await;
    let again = claims.claim_once("nightly", "2026-12-06", None).await;
    p.pool().unwrap().close().await;
    for sql in [
        format!("DROP SCHEMA {name} CASCADE"),
        format!("DROP ROLE {name}"),
    ] {
        sqlx::query(&sql).execute(&admin).await.unwrap();
    }
    assert!(
        matches!(won, Ok(Some(_))),
        "the first claim on an older table: {won:?}"
    );
    assert!(matches!(again, Ok(None)), "the second claim: {again:?}");
}
