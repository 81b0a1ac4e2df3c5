//! The takeover multi on a real server, pinned to what the model checker
//! (`lease-model`'s ZooKeeper model) found: a takeover judged before a
//! purge must not delete the holder made after it, though the purge
//! restarted the epoch and the holder version at the values judged (the
//! takeover deletes the judged owner's marker, which the purge took).

use std::time::{Duration, Instant};

use lease_api::backend::OwnerId;
use lease_api::{LeaseKey, LeaseProvider};
use lease_testkit::{store_url, unique, until_ok};

use crate::provider::{Judged, holder_data};
use crate::{ZkConfig, ZkProvider};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_judged_before_a_purge_leaves_the_holder_made_after_it() {
    let ns = unique("judged");
    let config = || ZkConfig::new(store_url("LEASE_TEST_ZK_URL")).namespace(&ns);
    let old = ZkProvider::new(config()).unwrap();
    let key = LeaseKey::new("judged").unwrap();
    let short = old.capabilities().practical_ttl(Duration::from_millis(500));
    let stale = until_ok(|| old.try_acquire(&key, short))
        .await
        .into_lease()
        .expect("a free key");
    // Expired on the server's clock.
    let deadline = Instant::now() + short + Duration::from_secs(30);
    while old.inspect(&key).await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "the lease never expired");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A contender judges the expired holder: epoch, holder version, and
    // its owner, whose marker it saw.
    let client = old.client().await.unwrap();
    let paths = old.paths(&key);
    let read = old
        .read_holder_and_epoch(&client, &paths)
        .await
        .unwrap()
        .expect("the expired holder node is still there");
    assert_eq!(
        read.owner,
        Some(stale.owner()),
        "the judged owner's marker was seen"
    );
    let judged = Judged {
        epoch: read.epoch,
        holder_version: read.stat.version,
        owner: read.owner,
    };
    // A purge, and a new holder at the same epoch and holder version.
    let purger = ZkProvider::new(config()).unwrap();
    assert!(purger.purge_namespaces(&ns).await.unwrap() > 0);
    let new = ZkProvider::new(config()).unwrap();
    let ttl = Duration::from_secs(30);
    let current = until_ok(|| new.try_acquire(&key, ttl))
        .await
        .into_lease()
        .expect("the purged key is free");
    assert_eq!(
        current.handle(),
        stale.handle(),
        "the test needs the epoch to repeat"
    );
    // The takeover, at what was judged before the purge.
    let owner = OwnerId::random();
    let data = holder_data(owner, ttl, "contender");
    let took = old
        .claim(&client, &paths, (owner, &data), Some(judged))
        .await
        .unwrap();
    assert!(
        took.is_err(),
        "the takeover deleted the holder made after the purge: {took:?}"
    );
    let info = new
        .inspect(&key)
        .await
        .unwrap()
        .expect("the new holder's lease");
    assert_eq!(info.token, current.token());
    new.release(&current).await.unwrap();
}
