//! The advisory-lock mode against the failures it exists for: a session
//! ended by the server (`pg_terminate_backend`), a frozen server, a lease
//! nobody renews, a week-long TTL, and a stale holder's fenced transaction.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_api::{LeaseError, LeaseGuard, LeaseKey, LeaseProvider};
use lease_postgres::{AdvisoryProvider, PostgresConfig};
use lease_testkit::{store_url, unique};
use sqlx::Connection;

fn provider(namespace: &str) -> Arc<AdvisoryProvider> {
    Arc::new(
        AdvisoryProvider::new(
            PostgresConfig::new(store_url("LEASE_TEST_POSTGRES_URL")).namespace(namespace),
        )
        .unwrap(),
    )
}

async fn admin() -> sqlx::PgConnection {
    sqlx::PgConnection::connect(&store_url("LEASE_TEST_POSTGRES_URL"))
        .await
        .unwrap()
}

/// The backend pids whose application name carries `owner`: the session
/// that holds the lease.
async fn sessions_of(conn: &mut sqlx::PgConnection, owner: &str) -> Vec<i32> {
    sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE application_name = $1")
        .bind(format!("lease-advisory {owner}"))
        .fetch_all(conn)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_session_frees_the_key_and_fires_the_lost_signal_at_the_next_renewal() {
    let ns = unique("adv-term");
    let holder = provider(&ns);
    let other = provider(&ns);
    let key = LeaseKey::new("settlement").unwrap();
    let ttl = Duration::from_secs(9);
    let lease = holder
        .try_acquire(&key, ttl)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let owner = lease.owner().to_hex();
    let guard = LeaseGuard::new(Arc::clone(&holder) as Arc<dyn LeaseProvider>, lease);
    let mut admin = admin().await;
    let pids = sessions_of(&mut admin, &owner).await;
    assert_eq!(pids.len(), 1, "one session holds the lease: {pids:?}");
    assert_eq!(
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1 AND granted"
        )
        .bind(pids[0])
        .fetch_one(&mut admin)
        .await
        .unwrap(),
        1,
        "the session holds the advisory lock"
    );
    let killed = Instant::now();
    let done: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 5000)")
        .bind(pids[0])
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert!(done);
    // Nobody takes the key over: the guard learns of the loss only from its
    // own session, at its next renewal (a third of the TTL); waiting for
    // local validity would take the whole TTL.
    let reason = tokio::time::timeout(ttl, guard.lost()).await.unwrap();
    let after = killed.elapsed();
    assert!(
        after < ttl / 3 + Duration::from_secs(2),
        "lost fired {after:?} after the session ended ({reason})"
    );
    // The lock went with the session: another provider takes the key, long
    // before the TTL, with a greater token.
    let next = other
        .try_acquire(&key, ttl)
        .await
        .unwrap()
        .into_lease()
        .expect("the key is free once the holder's session ended");
    assert!(next.token() > guard.token());
    other.release(&next).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrenewed_lease_is_ended_by_the_server_while_its_provider_lives() {
    let ns = unique("adv-idle");
    let holder = provider(&ns);
    let other = provider(&ns);
    let key = LeaseKey::new("cron").unwrap();
    let ttl = holder
        .capabilities()
        .practical_ttl(Duration::from_millis(1500));
    let lease = holder
        .try_acquire(&key, ttl)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let mut admin = admin().await;
    let owner = lease.owner().to_hex();
    assert_eq!(sessions_of(&mut admin, &owner).await.len(), 1);
    // The holder keeps its session open and says nothing: only the server's
    // idle_session_timeout can end it.
    let bound = ttl + holder.capabilities().expiry_slack + Duration::from_secs(1);
    let started = Instant::now();
    let taken = loop {
        if let Some(l) = other.try_acquire(&key, ttl).await.unwrap().into_lease() {
            break l;
        }
        assert!(
            started.elapsed() < bound,
            "still held {bound:?} after the TTL"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(sessions_of(&mut admin, &owner).await.is_empty());
    assert!(matches!(
        holder.extend(&lease, ttl).await,
        Err(LeaseError::Lost { .. })
    ));
    other.release(&taken).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_that_times_out_on_a_frozen_backend_ends_the_lease_and_leaves_nothing_held() {
    let ns = unique("adv-frozen");
    let timeout = Duration::from_millis(800);
    let make = || {
        let config = PostgresConfig::new(store_url("LEASE_TEST_POSTGRES_URL"))
            .namespace(&ns)
            .timeouts(timeout, timeout);
        Arc::new(AdvisoryProvider::new(config).unwrap())
    };
    let (holder, other) = (make(), make());
    let key = LeaseKey::new("batch").unwrap();
    let ttl = Duration::from_secs(60);
    let lease = holder
        .try_acquire(&key, ttl)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let mut admin = admin().await;
    let pid = sessions_of(&mut admin, &lease.owner().to_hex()).await[0];
    // Freeze the server process that serves the lease's session: it keeps
    // the socket open and answers nothing.
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {pid}");
    };
    signal("-STOP");
    let started = Instant::now();
    let extended = holder.extend(&lease, ttl).await;
    signal("-CONT");
    assert!(
        matches!(extended, Err(LeaseError::Lost { .. })),
        "{extended:?}"
    );
    assert!(started.elapsed() < timeout + Duration::from_secs(1));
    // The holder closed the session it could not trust; the thawed backend
    // sees the socket closed and exits, freeing the lock long before the
    // 60 s TTL.
    let started = Instant::now();
    let taken = loop {
        if let Some(l) = other.try_acquire(&key, ttl).await.unwrap().into_lease() {
            break l;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "still held");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(taken.token() > lease.token());
    other.release(&taken).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_week_long_ttl_is_accepted_and_a_longer_one_refused() {
    let ns = unique("adv-week");
    let p = provider(&ns);
    let key = LeaseKey::new("long").unwrap();
    let week = p.capabilities().max_ttl;
    let lease = p
        .try_acquire(&key, week)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    // The session's idle_session_timeout took the whole week (the server
    // refuses a value past its limit, and the acquire would have failed).
    let mut admin = admin().await;
    assert_eq!(
        sessions_of(&mut admin, &lease.owner().to_hex()).await.len(),
        1
    );
    let info = p.inspect(&key).await.unwrap().unwrap();
    assert!(info.remaining > week - Duration::from_secs(60), "{info:?}");
    let err = p
        .try_acquire(&key, week + Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(matches!(err, LeaseError::InvalidTtl { .. }), "{err:?}");
    p.release(&lease).await.unwrap();
    assert!(p.inspect(&key).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_holder_cannot_begin_a_fenced_transaction() {
    let ns = unique("adv-fence");
    let a = provider(&ns);
    let b = provider(&ns);
    let key = LeaseKey::new("ledger").unwrap();
    let ttl = a.capabilities().practical_ttl(Duration::from_millis(300));
    let old = a
        .try_acquire(&key, ttl)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    // Still held: the fence admits it.
    a.begin_fenced(&old)
        .await
        .unwrap()
        .rollback()
        .await
        .unwrap();
    let newer = loop {
        if let Some(l) = b
            .try_acquire(&key, Duration::from_secs(30))
            .await
            .unwrap()
            .into_lease()
        {
            break l;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(matches!(
        a.begin_fenced(&old).await,
        Err(LeaseError::Lost { .. })
    ));
    b.begin_fenced(&newer)
        .await
        .unwrap()
        .commit()
        .await
        .unwrap();
    b.release(&newer).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_gets_the_key_as_soon_as_the_holders_session_ends() {
    let ns = unique("adv-wait");
    let holder = provider(&ns);
    let waiter = provider(&ns);
    let key = LeaseKey::new("queue-head").unwrap();
    let ttl = Duration::from_secs(30);
    let lease = holder
        .try_acquire(&key, ttl)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let waiting = {
        let (waiter, key) = (Arc::clone(&waiter), key.clone());
        tokio::spawn(async move {
            let got = lease_api::acquire(
                &waiter,
                &key,
                lease_api::AcquireOptions::ttl(Duration::from_secs(30))
                    .wait(Duration::from_secs(25)),
            )
            .await
            .unwrap();
            (got, Instant::now())
        })
    };
    // Let the waiter find the key held and queue up for the lock.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished());
    // The holder's process dies: its session ends, and no release (so no
    // NOTIFY) is ever sent. The waiter is told by the lock queue itself.
    let mut admin = admin().await;
    let pid = sessions_of(&mut admin, &lease.owner().to_hex()).await[0];
    let killed = Instant::now();
    let _: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&mut admin)
        .await
        .unwrap();
    let (got, at) = waiting.await.unwrap();
    let got = got.expect("the waiter got the key");
    assert!(got.token() > lease.token());
    let after = at - killed;
    assert!(
        after < Duration::from_secs(2),
        "the waiter got the key {after:?} after the holder's session ended (its TTL was {ttl:?})"
    );
    waiter.release(&got).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_does_not_wait_for_the_holders_own_fenced_transaction() {
    let ns = unique("adv-fenced-renew");
    let short = Duration::from_millis(700);
    let p = Arc::new(
        AdvisoryProvider::new(
            PostgresConfig::new(store_url("LEASE_TEST_POSTGRES_URL"))
                .namespace(&ns)
                .timeouts(short, short),
        )
        .unwrap(),
    );
    let key = LeaseKey::new("ledger").unwrap();
    let ttl = Duration::from_secs(10);
    let lease = p
        .try_acquire(&key, ttl)
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    // The holder's fenced transaction holds the token row FOR SHARE for
    // longer than a statement may take.
    let tx = p.begin_fenced(&lease).await.unwrap();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let renewed = p.extend(&lease, ttl).await;
        assert!(renewed.is_ok(), "{renewed:?}");
    }
    tx.commit().await.unwrap();
    let renewed = p.extend(&lease, ttl).await.unwrap();
    let info = p.inspect(&key).await.unwrap().unwrap();
    assert_eq!(info.token, renewed.token());
    p.release(&renewed).await.unwrap();
}

/// `inspect` names a holder only while that holder's own session holds the
/// lock. A release unlocks at once but its row change commits a moment
/// later; a session that took the lock in between (a waiter's watch, the
/// next acquirer) made inspect report the releasing holder again, so an
/// election follower saw one term twice and then waited out the next. Here
/// the row is kept uncommitted by hand, the holder's session ended and
/// another session takes the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_names_no_holder_whose_session_no_longer_holds_the_lock() {
    let ns = unique("adv-inspect");
    let holder = provider(&ns);
    let looker = provider(&ns);
    let key = LeaseKey::new("settlement").unwrap();
    let lease = holder
        .try_acquire(&key, Duration::from_secs(30))
        .await
        .unwrap()
        .into_lease()
        .unwrap();
    let owner = lease.owner().to_hex();
    assert!(
        looker.inspect(&key).await.unwrap().is_some(),
        "held at first"
    );
    let mut control = admin().await;
    let pids = sessions_of(&mut control, &owner).await;
    assert_eq!(pids.len(), 1, "one session holds the lease: {pids:?}");
    // The row as a release leaves it until it commits: still the holder's
    // to every other session.
    let mut clearing = admin().await;
    sqlx::query("BEGIN").execute(&mut clearing).await.unwrap();
    sqlx::query("UPDATE public.lease_advisory SET owner = NULL WHERE namespace = $1 AND key = $2")
        .bind(&ns)
        .bind(key.as_str())
        .execute(&mut clearing)
        .await
        .unwrap();
    // The holder's session ends, which frees the lock, and another takes it.
    let done: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 5000)")
        .bind(pids[0])
        .fetch_one(&mut control)
        .await
        .unwrap();
    assert!(done);
    let mut other = admin().await;
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(holder.lock_id(&key))
        .execute(&mut other)
        .await
        .unwrap();
    let seen = looker.inspect(&key).await.unwrap();
    assert!(
        seen.is_none(),
        "inspect names a holder whose session is gone: {seen:?}"
    );
    sqlx::query("ROLLBACK")
        .execute(&mut clearing)
        .await
        .unwrap();
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(holder.lock_id(&key))
        .execute(&mut other)
        .await
        .unwrap();
}
