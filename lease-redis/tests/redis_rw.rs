//! Redis read/write leases under a frozen server: an acquire that timed out
//! must not come back to life when the server thaws (invariant 8).

use std::time::{Duration, Instant};

use lease_api::{LeaseKey, LeaseProvider};
use lease_redis::{RedisConfig, RedisProvider};
use lease_testkit::{OwnedProcess, owned_redis, unique, until_ok};

const TIMEOUT: Duration = Duration::from_millis(800);
const TTL: Duration = Duration::from_secs(30);

fn provider(p: &OwnedProcess) -> RedisProvider {
    let url = format!("redis://127.0.0.1:{}", p.port());
    RedisProvider::new(RedisConfig::new(url).timeouts(TIMEOUT, TIMEOUT)).unwrap()
}

/// Redis frozen (SIGSTOP) mid-acquire of a writer and of a reader: both calls
/// time out, and when the server thaws and runs the queued scripts, no
/// writer or reader of an owner nobody has is left (a writer would keep
/// every reader out for its 60 s TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timed_out_read_write_acquires_on_a_frozen_server_leave_nothing() {
    let server = owned_redis(false);
    let p = provider(&server);
    let (w, r) = (
        LeaseKey::new(unique("frozen-w")).unwrap(),
        LeaseKey::new(unique("frozen-r")).unwrap(),
    );
    // Connected, and the scripts cached (EVALSHA would otherwise come back
    // NOSCRIPT after the thaw and never run).
    let warm = LeaseKey::new(unique("warm")).unwrap();
    for write in [false, true] {
        let l = if write {
            p.try_acquire_write(&warm, TTL, None).await
        } else {
            p.try_acquire_read(&warm, TTL).await
        };
        p.release(&l.unwrap().into_lease().unwrap()).await.unwrap();
    }
    server.freeze();
    let long = Duration::from_secs(60);
    let err = p.try_acquire_write(&w, long, None).await.unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    let err = p.try_acquire_read(&r, long).await.unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    server.thaw();
    let checker = provider(&server);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (iw, ir) = (
            until_ok(|| checker.inspect_rw(&w)).await,
            until_ok(|| checker.inspect_rw(&r)).await,
        );
        if iw.writer.is_none() && ir.readers.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a ghost from a timed-out acquire is still held: {iw:?} {ir:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // And stays gone: the queued scripts cannot come back later.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(checker.inspect_rw(&w).await.unwrap().writer.is_none());
    assert!(checker.inspect_rw(&r).await.unwrap().readers.is_empty());
    let reader = checker.try_acquire_read(&w, TTL).await.unwrap();
    checker
        .release(&reader.into_lease().expect("no writer left"))
        .await
        .unwrap();
    let writer = checker.try_acquire_write(&r, TTL, None).await.unwrap();
    checker
        .release(&writer.into_lease().expect("no reader left"))
        .await
        .unwrap();
}
