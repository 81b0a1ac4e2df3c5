//! Database claims on a real MariaDB: the SKIP LOCKED job queue (16 workers
//! over 20,000 jobs, a worker killed mid-batch, stale completions, the
//! token counter) and once-per-slot claims (one winner, a lost answer, a
//! row-only account).

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use lease_api::LeaseError;
use lease_mysql::{Completion, JobQueue, MysqlConfig, MysqlProvider, OnceClaims, QueueConfig};
use lease_testkit::{store_url, unique};
use sqlx::Row;

fn provider(max_connections: u32) -> MysqlProvider {
    MysqlProvider::new(
        MysqlConfig::new(store_url("LEASE_TEST_MYSQL_URL"))
            .namespace(unique("claims"))
            .max_connections(max_connections),
    )
    .unwrap()
}

/// A job table of `n` rows (ids 1..=n) with a `kind` column, named uniquely.
async fn job_table(p: &MysqlProvider, n: i64) -> String {
    let table = unique("jobs").replace('-', "_");
    let pool = p.pool().unwrap();
    sqlx::query(&format!(
        "CREATE TABLE {table} (id BIGINT PRIMARY KEY, kind VARCHAR(8) NOT NULL, payload INT NOT NULL)"
    ))
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(&format!(
        "INSERT INTO {table} SELECT seq, IF(seq % 2 = 0, 'even', 'odd'), seq FROM seq_1_to_{n}"
    ))
    .execute(pool)
    .await
    .unwrap();
    table
}

/// Waits (10 s at most) until the claims of `ids` ran out on the server's
/// clock, which decides: a claim's local validity ends first.
async fn until_expired_on_the_server(p: &MysqlProvider, table: &str, ids: &[i64]) {
    let give_up = Instant::now() + Duration::from_secs(10);
    let list = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
    loop {
        let live = count(
            p,
            &format!(
                "SELECT COUNT(*) FROM {table} WHERE id IN ({list}) AND lease_until > UTC_TIMESTAMP(6)"
            ),
        )
        .await;
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

async fn count(p: &MysqlProvider, sql: &str) -> i64 {
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
        &format!("SELECT COUNT(*) FROM {table} WHERE lease_done_at IS NOT NULL"),
    )
    .await;
    assert_eq!(done, 3);
    let rest = queue.claim_next(100).await.unwrap();
    assert_eq!(rest.ids(), &[8, 6, 4, 2]);
    assert!(queue.claim_next(100).await.unwrap().is_empty());
}

/// A row another transaction has locked (a worker's `complete_in` still
/// open, an operator's `SELECT .. FOR UPDATE`) is skipped, not waited for:
/// the claim gets the next free row at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_locked_by_another_transaction_is_skipped_not_waited_for() {
    let p = MysqlProvider::new(
        MysqlConfig::new(store_url("LEASE_TEST_MYSQL_URL"))
            .namespace(unique("claims"))
            // Long enough that waiting out the lock would show.
            .timeouts(Duration::from_secs(5), Duration::from_secs(5)),
    )
    .unwrap();
    let table = job_table(&p, 3).await;
    let queue = JobQueue::new(&p, QueueConfig::new(&table)).unwrap();
    queue.migrate().await.unwrap();
    let mut tx = p.pool().unwrap().begin().await.unwrap();
    sqlx::query(&format!("SELECT id FROM {table} WHERE id = 1 FOR UPDATE"))
        .execute(&mut *tx)
        .await
        .unwrap();
    let claim = queue.claim_next(1).await.unwrap();
    assert_eq!(claim.ids(), &[2], "the locked row 1 was not skipped");
    tx.rollback().await.unwrap();
    let next = queue.claim_next(5).await.unwrap();
    assert_eq!(next.ids(), &[1, 3]);
}

/// Waits (10 s at most) until a claim on `table` waits for the table's
/// token counter, which the caller's transaction `tx` has locked.
async fn until_waiting_for_the_counter(tx: &mut sqlx::MySqlConnection, table: &str) {
    let give_up = Instant::now() + Duration::from_secs(10);
    let pattern = format!("%{table}_lease_token% SET v = LAST_INSERT_ID(v + 1)%");
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST
              WHERE INFO LIKE ? AND ID <> CONNECTION_ID()",
        )
        .bind(&pattern)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        if waiting > 0 {
            return;
        }
        assert!(
            Instant::now() < give_up,
            "the claim never waited for the counter"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Rows of `table` no transaction holds locked right now.
async fn unlocked_rows(p: &MysqlProvider, table: &str) -> i64 {
    let mut tx = p.pool().unwrap().begin().await.unwrap();
    let n: i64 = sqlx::query_scalar(&format!(
        "SELECT COUNT(*) FROM (SELECT id FROM {table} FOR UPDATE SKIP LOCKED) AS free"
    ))
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    n
}

/// A claim locks the rows it takes and no others while it runs, in the
/// key's order (a scan of the pending-rows index that stops at the limit)
/// and in an order of its own that no index gives: InnoDB locks every row an
/// `ORDER BY .. LIMIT .. FOR UPDATE` reads before it sorts, and every other
/// worker would find the queue empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_locks_only_the_rows_it_takes_in_any_order() {
    let p = MysqlProvider::new(
        MysqlConfig::new(store_url("LEASE_TEST_MYSQL_URL"))
            .namespace(unique("claims"))
            .timeouts(Duration::from_secs(10), Duration::from_secs(10)),
    )
    .unwrap();
    for (order, first, skipping) in [
        (None, [1, 2, 3], [5, 6]),
        (Some("payload DESC"), [50, 49, 48], [46, 45]),
    ] {
        let table = job_table(&p, 50).await;
        let mut config = QueueConfig::new(&table).filter("payload > 0");
        if let Some(order) = order {
            config = config.order(order);
        }
        let queue = Arc::new(JobQueue::new(&p, config).unwrap());
        queue.migrate().await.unwrap();
        // Hold the counter, so the claim stops with its rows locked.
        let mut tx = p.pool().unwrap().begin().await.unwrap();
        sqlx::query(&format!(
            "SELECT v FROM {table}_lease_token WHERE id = 1 FOR UPDATE"
        ))
        .execute(&mut *tx)
        .await
        .unwrap();
        let claiming = tokio::spawn({
            let queue = Arc::clone(&queue);
            async move { queue.claim_next(3).await }
        });
        until_waiting_for_the_counter(&mut tx, &table).await;
        assert_eq!(
            unlocked_rows(&p, &table).await,
            47,
            "{order:?}: a claim of 3 rows held other rows locked"
        );
        tx.rollback().await.unwrap();
        let claim = claiming.await.unwrap().unwrap();
        assert_eq!(claim.ids(), &first, "{order:?}");
        // With the next row locked elsewhere, the next claim skips it and
        // still takes as many as asked.
        let next = if order.is_some() { 47 } else { 4 };
        let mut tx = p.pool().unwrap().begin().await.unwrap();
        sqlx::query(&format!(
            "SELECT id FROM {table} WHERE id = {next} FOR UPDATE"
        ))
        .execute(&mut *tx)
        .await
        .unwrap();
        assert_eq!(
            queue.claim_next(2).await.unwrap().ids(),
            &skipping,
            "{order:?}"
        );
        tx.rollback().await.unwrap();
    }
}

/// A claim chosen as a deadlock's victim (1213: InnoDB rolled its whole
/// transaction back) is made again, not failed: here an operator's
/// transaction holds the token counter and then asks for the row the claim
/// has just locked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_rolled_back_by_a_deadlock_is_made_again() {
    let p = MysqlProvider::new(
        MysqlConfig::new(store_url("LEASE_TEST_MYSQL_URL"))
            .namespace(unique("claims"))
            .timeouts(Duration::from_secs(10), Duration::from_secs(10)),
    )
    .unwrap();
    let table = job_table(&p, 3).await;
    let queue = Arc::new(JobQueue::new(&p, QueueConfig::new(&table)).unwrap());
    queue.migrate().await.unwrap();
    let pool = p.pool().unwrap();
    let mut tx = pool.begin().await.unwrap();
    // Weight: InnoDB rolls back the transaction that changed fewer rows,
    // so this one must have changed more than the claim will have.
    sqlx::query(&format!(
        "INSERT INTO {table} (id, kind, payload) SELECT 100 + seq, 'odd', 0 FROM seq_1_to_200"
    ))
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query(&format!(
        "SELECT v FROM {table}_lease_token WHERE id = 1 FOR UPDATE"
    ))
    .execute(&mut *tx)
    .await
    .unwrap();
    let claiming = tokio::spawn({
        let queue = Arc::clone(&queue);
        async move { queue.claim_next(1).await }
    });
    // The claim has locked row 1 and waits for the counter.
    until_waiting_for_the_counter(&mut tx, &table).await;
    // The cycle: this transaction now asks for row 1.
    sqlx::query(&format!("SELECT id FROM {table} WHERE id = 1 FOR UPDATE"))
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let claim = claiming
        .await
        .unwrap()
        .expect("the deadlocked claim was made again");
    assert_eq!(claim.ids().len(), 1);
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
        "UPDATE {table} SET payload = -1 WHERE id IN (1, 2)"
    ))
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
    assert_eq!(count(&p, &format!("SELECT COUNT(*) FROM {table}")).await, 4);
    // The worker that holds the rows: its effect and completion commit.
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(&format!(
        "UPDATE {table} SET payload = payload * 10 WHERE id IN (1, 2)"
    ))
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
            &format!("SELECT COUNT(*) FROM {table} WHERE payload < 0")
        )
        .await,
        0
    );
    assert_eq!(count(&p, &format!("SELECT COUNT(*) FROM {table}")).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_workers_process_twenty_thousand_jobs_exactly_once_with_distinct_tokens() {
    const JOBS: usize = 20_000;
    const WORKERS: usize = 16;
    let p = provider(WORKERS as u32 + 2);
    let table = job_table(&p, JOBS as i64).await;
    let queue = Arc::new(JobQueue::new(&p, QueueConfig::new(&table)).unwrap());
    let seen: Arc<Vec<AtomicU8>> = Arc::new((0..=JOBS).map(|_| AtomicU8::new(0)).collect());
    let claims = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let started = Instant::now();
    let workers = (0..WORKERS).map(|_| {
        let (queue, seen, claims, tokens) = (
            Arc::clone(&queue),
            Arc::clone(&seen),
            Arc::clone(&claims),
            Arc::clone(&tokens),
        );
        tokio::spawn(async move {
            loop {
                let claim = queue.claim_next(100).await.unwrap();
                if claim.is_empty() {
                    return;
                }
                claims.fetch_add(1, Ordering::Relaxed);
                tokens.lock().unwrap().push(claim.token().get());
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
    assert_eq!(count(&p, &format!("SELECT COUNT(*) FROM {table}")).await, 0);
    // Every claim drew its own token from the counter.
    let mut tokens = tokens.lock().unwrap().clone();
    let n = tokens.len();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), n, "two claims drew one token");
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
async fn integer_keys_a_column_added_later_and_a_lost_counter_do_not_break_claims() {
    let p = provider(2);
    let table = unique("int_jobs").replace('-', "_");
    let pool = p.pool().unwrap();
    sqlx::query(&format!(
        "CREATE TABLE {table} (id INT AUTO_INCREMENT PRIMARY KEY, note TEXT)"
    ))
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(&format!(
        "INSERT INTO {table} (note) SELECT 'n' FROM seq_1_to_6"
    ))
    .execute(pool)
    .await
    .unwrap();
    let queue = JobQueue::new(&p, QueueConfig::new(&table)).unwrap();
    let first = queue.claim_next(2).await.unwrap();
    assert_eq!(first.ids(), &[1, 2], "an INT key is read as a bigint");
    // The table changes shape while workers run: claims go on.
    sqlx::query(&format!("ALTER TABLE {table} ADD COLUMN added INT"))
        .execute(pool)
        .await
        .unwrap();
    let next = queue.claim_next(1).await.unwrap();
    assert_eq!(next.ids().len(), 1);
    assert!(queue.complete(&next, next.ids()).await.unwrap().all_done());
    // The counter row is deleted: a claim takes nothing and says why, and
    // the migration seeds the counter again from the greatest token in the
    // table.
    sqlx::query(&format!("DELETE FROM {table}_lease_token"))
        .execute(pool)
        .await
        .unwrap();
    let err = queue.claim_next(1).await.unwrap_err();
    assert!(
        matches!(&err, LeaseError::Config(m) if m.contains("counter")),
        "{err:?}"
    );
    assert_eq!(
        count(
            &p,
            &format!("SELECT COUNT(*) FROM {table} WHERE lease_owner IS NOT NULL AND id > 3")
        )
        .await,
        0,
        "a claim without a token marked rows"
    );
    queue.migrate().await.unwrap();
    let after = queue.claim_next(1).await.unwrap();
    // Above every token the table still holds (a deleted row's is gone).
    assert!(
        after.token() > first.token(),
        "{} after {}",
        after.token(),
        first.token()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_queue_settings_are_refused_with_reasons() {
    let p = provider(2);
    for (config, what) in [
        (QueueConfig::new("jobs; DROP TABLE x"), "invalid table"),
        (QueueConfig::new("jobs").id_column("id`"), "invalid column"),
        (QueueConfig::new("jobs").schema("a`b"), "invalid database"),
        (QueueConfig::new("t".repeat(53)), "52 bytes"),
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
    let absent = unique("absent").replace('-', "_");
    let queue = JobQueue::new(&p, QueueConfig::new(&absent)).unwrap();
    let err = queue.claim_next(1).await.unwrap_err();
    assert!(matches!(err, LeaseError::Backend { .. }), "{err:?}");
    // Made later (a worker that started before the schema), it is used.
    sqlx::query(&format!("CREATE TABLE {absent} (id BIGINT PRIMARY KEY)"))
        .execute(p.pool().unwrap())
        .await
        .unwrap();
    sqlx::query(&format!("INSERT INTO {absent} VALUES (7)"))
        .execute(p.pool().unwrap())
        .await
        .unwrap();
    assert_eq!(queue.claim_next(1).await.unwrap().ids(), &[7]);
    // A key that is not an integer is refused before anything is added.
    let text_keys = unique("textkeys").replace('-', "_");
    sqlx::query(&format!(
        "CREATE TABLE {text_keys} (id VARCHAR(10) PRIMARY KEY)"
    ))
    .execute(p.pool().unwrap())
    .await
    .unwrap();
    let queue = JobQueue::new(&p, QueueConfig::new(&text_keys)).unwrap();
    let err = queue.claim_next(1).await.unwrap_err();
    assert!(
        matches!(&err, LeaseError::Config(m) if m.contains("integer")),
        "{err:?}"
    );
    assert_eq!(
        count(
            &p,
            &format!(
                "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{text_keys}'"
            )
        )
        .await,
        1,
        "columns were added to a table the queue refused"
    );
    // So is a filter that is not SQL; the connection it broke is not reused.
    let table = job_table(&p, 3).await;
    let queue = JobQueue::new(&p, QueueConfig::new(&table).filter("no such column = 1")).unwrap();
    let err = queue.claim_next(1).await.unwrap_err();
    assert!(matches!(err, LeaseError::Backend { .. }), "{err:?}");
    let queue = JobQueue::new(&p, QueueConfig::new(&table)).unwrap();
    assert_eq!(queue.claim_next(5).await.unwrap().ids(), &[1, 2, 3]);
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
    // The next slot is its own, with a greater token; look-alike slots are
    // other slots (binary columns).
    let next = claims
        .claim_once(resource, "2026-12-05", None)
        .await
        .unwrap()
        .unwrap();
    assert!(next.token > first);
    for look_alike in ["2026-12-04 ", "2026-12-04\t", "２026-12-04"] {
        assert!(
            claims
                .claim_once(resource, look_alike, None)
                .await
                .unwrap()
                .is_some(),
            "{look_alike:?}"
        );
    }

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
    // A taken-over claim cannot be unclaimed by its old winner.
    assert!(!claims.unclaim(resource, "hourly", &kept).await.unwrap());
    assert!(claims.unclaim(resource, "hourly", &again).await.unwrap());
    assert!(claims.holder(resource, "hourly").await.unwrap().is_none());

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
    assert!(matches!(
        OnceClaims::in_table(&p, None, "x`y"),
        Err(LeaseError::Config(_))
    ));
    let _ = claims
        .claim_once(resource, "purged", Some(retention))
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(retention * 2).await;
    assert!(claims.purge_expired().await.unwrap() >= 1);
    assert!(
        claims
            .holder(resource, "2026-12-04")
            .await
            .unwrap()
            .is_some()
    );
}

/// The answer to a claim is lost (the connection drops as MariaDB answers,
/// after the batch committed): the call tries again with its claim id and
/// gets its own claim, not `None` (which would leave the slot's job to
/// nobody) and not an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_answer_was_lost_is_still_won_by_its_caller() {
    let server = lease_testkit::owned_mysql(&[]);
    let proxy = lease_testkit::Proxy::start(server.port()).await;
    let p = MysqlProvider::new(
        MysqlConfig::new(format!("mysql://root@127.0.0.1:{}/lease", proxy.port()))
            .namespace(unique("claims")),
    )
    .unwrap();
    let claims = OnceClaims::new(&p);
    claims.migrate().await.unwrap();
    let slot = unique("slot");
    // The claim's batch is the first to carry the slot (as a hex literal).
    let hex: String = slot.bytes().map(|b| format!("{b:02x}")).collect();
    proxy.lose_reply_to(hex.as_bytes());
    let won = claims.claim_once("nightly", &slot, None).await;
    assert!(proxy.reply_lost(), "the claim's answer was never lost");
    let won = won
        .expect("a lost answer is tried again")
        .expect("the caller's own claim");
    let holder = claims.holder("nightly", &slot).await.unwrap().unwrap();
    assert_eq!(holder.token, won.token);
    // The first attempt did commit (the answer, not the claim, was lost):
    // the retry drew a later token and answered with the first one's.
    let drawn: u64 = sqlx::query_scalar("SELECT v FROM lease_claims_lease_token WHERE id = 1")
        .fetch_one(p.pool().unwrap())
        .await
        .unwrap();
    assert!(
        won.token.get() < drawn,
        "the answer came from a fresh claim ({} of {drawn}), not from the lost one",
        won.token
    );
    assert_eq!(
        claims.claim_once("nightly", &slot, None).await.unwrap(),
        None,
        "a second call is a new claim"
    );
}

/// An account that may only read and write rows claims on tables made for
/// it: nothing is created, nothing fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_only_account_claims_and_queues_on_tables_made_for_it() {
    // A private server: creating an account needs its root.
    let server = lease_testkit::owned_mysql(&[]);
    let admin = MysqlProvider::new(MysqlConfig::new(format!(
        "mysql://root@127.0.0.1:{}/lease",
        server.port()
    )))
    .unwrap();
    let pool = admin.pool().unwrap();
    let name = "rowonly";
    let table = "claims_made_for_it";
    let jobs = job_table(&admin, 3).await;
    // The tables as an administrator made them (by a first use).
    OnceClaims::in_table(&admin, None, table)
        .unwrap()
        .migrate()
        .await
        .unwrap();
    JobQueue::new(&admin, QueueConfig::new(&jobs))
        .unwrap()
        .migrate()
        .await
        .unwrap();
    for sql in [
        format!("CREATE USER '{name}'@'127.0.0.1' IDENTIFIED BY 'pw'"),
        format!("GRANT SELECT, INSERT, UPDATE, DELETE ON lease.{table} TO '{name}'@'127.0.0.1'"),
        format!("GRANT SELECT, UPDATE ON lease.{table}_lease_token TO '{name}'@'127.0.0.1'"),
        format!("GRANT SELECT, UPDATE, DELETE ON lease.{jobs} TO '{name}'@'127.0.0.1'"),
        format!("GRANT SELECT, UPDATE ON lease.{jobs}_lease_token TO '{name}'@'127.0.0.1'"),
    ] {
        sqlx::query(&sql).execute(pool).await.unwrap();
    }
    let p = MysqlProvider::new(
        MysqlConfig::new(format!(
            "mysql://{name}:pw@127.0.0.1:{}/lease",
            server.port()
        ))
        .create_table(false),
    )
    .unwrap();
    let claims = OnceClaims::in_table(&p, None, table).unwrap();
    let won = claims.claim_once("nightly", "2026-12-06", None).await;
    assert!(matches!(won, Ok(Some(_))), "the first claim: {won:?}");
    let again = claims.claim_once("nightly", "2026-12-06", None).await;
    assert!(matches!(again, Ok(None)), "the second claim: {again:?}");
    let queue = JobQueue::new(&p, QueueConfig::new(&jobs)).unwrap();
    assert_eq!(queue.claim_next(10).await.unwrap().ids(), &[1, 2, 3]);
}
