//! The provider's background clean-ups of holder nodes and markers: after
//! an acquire whose outcome is unknown, and once a lease is gone. A holder
//! node is never left without its owner's marker, which a takeover checks
//! (see `plan::claim`).

use std::time::Duration;

use lease_api::LeaseKey;
use lease_api::backend::OwnerId;
use tokio::time::Instant;
use zookeeper_client::{Client, Error as ZkError};

use crate::provider::{ZkProvider, multi_err, parse_holder};

impl ZkProvider {
    /// Deletes the holder node if it carries `data` (our owner), and our
    /// marker, after a claim whose outcome is unknown; in the background, on
    /// the same session.
    pub(crate) fn remove_if_ours_in_background(
        &self,
        client: Client,
        (holder, marker): (String, String),
        data: Vec<u8>,
    ) {
        // The claim may also run when the connection was dropped and the
        // session resumes: look again until the session could have expired.
        let until = Instant::now() + self.inner.config.session_timeout;
        self.inner.cleanups.spawn(async move {
            while Instant::now() < until {
                let look =
                    tokio::time::timeout(Duration::from_secs(1), client.get_data(&holder)).await;
                if let Ok(Ok((current, stat))) = look
                    && current == data
                    && let Ok(Ok(())) = tokio::time::timeout(
                        Duration::from_secs(1),
                        client.delete(&holder, Some(stat.version)),
                    )
                    .await
                {
                    tracing::info!(node = %holder, "removed the holder node of an acquire that had timed out");
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            // The marker of a lease nobody got (its multi committed or not):
            // requests of one session run in order, so this runs after it.
            // Never while our holder node is still there: a takeover checks
            // the judged holder's marker (see `plan::claim`).
            let look = tokio::time::timeout(Duration::from_secs(1), client.get_data(&holder)).await;
            let holder_ours = match look {
                Ok(Ok((current, _))) => current == data,
                Ok(Err(ZkError::NoNode)) => false,
                _ => true, // unknown: keep the marker
            };
            if !holder_ours {
                let _ =
                    tokio::time::timeout(Duration::from_secs(1), client.delete(&marker, None)).await;
            }
        });
    }

    /// Deletes `owner`'s marker of `key` in the background, once its lease
    /// is gone (lost, released, or taken over): a marker only serves the
    /// one-multi path of a lease still held. A holder node of ours still
    /// there goes in the same multi once expired, or the marker stays: a
    /// holder node is never left without its marker, which a takeover
    /// checks (see `plan::claim`).
    pub(crate) fn drop_marker_in_background(&self, key: &LeaseKey, owner: OwnerId) {
        let paths = self.paths(key);
        let marker = paths.marker(owner);
        let this = self.clone();
        self.inner.cleanups.spawn(async move {
            let Ok(client) = this.client().await else {
                return;
            };
            let current = this.bounded("get", client.get_data(&paths.holder)).await;
            let mut w = client.new_multi_writer();
            let built = match current {
                Ok(Ok((data, stat))) => match parse_holder(&data) {
                    Some((o, ttl, _)) if o == owner => {
                        // Ours: it goes only once expired on the server's
                        // clock (a lease rebuilt with our owner and token,
                        // or one on an older session, may still hold it).
                        let ttl = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
                        let now = this.shared_now(&client).await;
                        if !now.is_ok_and(|now| now >= stat.mtime.saturating_add(ttl)) {
                            return;
                        }
                        w.add_delete(&paths.holder, Some(stat.version))
                            .and_then(|()| w.add_delete(&marker, None))
                    }
                    _ => w.add_delete(&marker, None),
                },
                Ok(Err(ZkError::NoNode)) => w.add_delete(&marker, None),
                // Unknown: keep the marker (it ends with the session).
                _ => return,
            };
            if built.is_ok() {
                let _ = this
                    .bounded("delete", async { w.commit().await.map_err(multi_err) })
                    .await;
            }
        });
    }
}
