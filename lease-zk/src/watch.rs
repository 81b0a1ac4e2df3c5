//! A ZooKeeper watch as a `KeyWatch`: ends on the first event of the node.

use std::time::Duration;

use async_trait::async_trait;
use lease_api::backend::KeyWatch;
use zookeeper_client::{EventType, OneshotWatcher};

/// One node's watch, if any.
pub(crate) struct ZkWatch {
    /// `None`: nothing to wait for (no holder node, or a gone ticket).
    pub(crate) watcher: Option<OneshotWatcher>,
}

#[async_trait]
impl KeyWatch for ZkWatch {
    async fn changed(&mut self, max: Duration) {
        let Some(watcher) = self.watcher.take() else {
            return;
        };
        // Any event (deletion, data change, session event) ends the wait;
        // the caller looks at the key again.
        let _ = tokio::time::timeout(max, async {
            let event = watcher.changed().await;
            event.event_type == EventType::NodeDeleted
        })
        .await;
    }
}
