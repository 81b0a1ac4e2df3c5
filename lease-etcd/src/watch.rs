//! `EtcdWatch`: waits on an etcd watch stream (of one key, or of a
//! read/write lease's prefix) for a deletion.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{EventType, WatchStream};
use lease_api::backend::KeyWatch;

use crate::provider::{EtcdProvider, SeenHeld};

/// A watch that wakes on a deletion under what it watches.
pub(crate) struct EtcdWatch {
    pub(crate) stream: Option<WatchStream>,
    /// The key was found free as the watch started: report it at once.
    pub(crate) free: bool,
    pub(crate) key: String,
    pub(crate) seen_held: Arc<std::sync::Mutex<HashMap<String, SeenHeld>>>,
}

impl EtcdWatch {
    /// A watch on `stream` (confirmed) of `key` or a prefix, started now.
    pub(crate) fn new(stream: WatchStream, key: String, provider: &EtcdProvider) -> Self {
        EtcdWatch {
            stream: Some(stream),
            free: false,
            key,
            seen_held: Arc::clone(&provider.inner.seen_held),
        }
    }
}

#[async_trait]
impl KeyWatch for EtcdWatch {
    async fn changed(&mut self, max: Duration) {
        if std::mem::take(&mut self.free) {
            return;
        }
        let Some(stream) = self.stream.as_mut() else {
            tokio::time::sleep(max).await;
            return;
        };
        let wait = async {
            loop {
                match stream.message().await {
                    Ok(Some(resp)) => {
                        if resp.canceled() {
                            return false;
                        }
                        if resp
                            .events()
                            .iter()
                            .any(|e| e.event_type() == EventType::Delete)
                        {
                            return true;
                        }
                    }
                    // The stream ended or failed: tell the caller to retry.
                    _ => return false,
                }
            }
        };
        match tokio::time::timeout(max, wait).await {
            Ok(true) => {
                // Deleted: the next try grants at once instead of reading first.
                self.seen_held
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&self.key);
            }
            Err(_) => {}
            Ok(false) => {
                // Deletions may have been missed: forget what we saw.
                self.seen_held
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&self.key);
                self.stream = None;
            }
        }
    }
}
