//! The provider's background clean-ups of holder nodes and markers: after
//! an acquire whose outcome is unknown, and once a lease is gone. A holder
//! node is never left without its owner's marker, which a takeover checks
//! (see `plan::claim`).

use std::time::Duration;

use lease_api::LeaseKey;
use lease_api::backend::OwnerId;
use tokio::time::Instant;
use zookeeper_client::{Client, CreateMode, Error as ZkError};

use crate::plan::{self, Step};
use crate::provider::{Paths, ZkProvider, multi_err, parse_holder};

impl ZkProvider {
    /// Deletes `node` if it carries `data` (ours), then `also`, after a
    /// read/write claim whose outcome is unknown (each node's name holds its
    /// owner, so no other owner's node can sit at that path); in the
    /// background, on the same session.
    pub(crate) fn remove_if_ours_in_background(
        &self,
        client: Client,
        (node, also): (String, String),
        data: Vec<u8>,
    ) {
        let until = Instant::now() + self.inner.config.session_timeout;
        self.inner.cleanups.spawn(async move {
            while Instant::now() < until {
                let look =
                    tokio::time::timeout(Duration::from_secs(1), client.get_data(&node)).await;
                if let Ok(Ok((current, stat))) = look
                    && current == data
                    && let Ok(Ok(())) = tokio::time::timeout(
                        Duration::from_secs(1),
                        client.delete(&node, Some(stat.version)),
                    )
                    .await
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let _ = tokio::time::timeout(Duration::from_secs(1), client.delete(&also, None)).await;
        });
    }

    /// Deletes the holder node if it carries `data` (our owner), with our
    /// marker and at the epoch it was read at, after a claim whose outcome
    /// is unknown; in the background, on the same session.
    pub(crate) fn remove_holder_if_ours_in_background(
        &self,
        client: Client,
        (paths, owner): (Paths, OwnerId),
        data: Vec<u8>,
    ) {
        // The claim may also run when the connection was dropped and the
        // session resumes: look again until the session could have expired.
        let until = Instant::now() + self.inner.config.session_timeout;
        let this = self.clone();
        self.inner.cleanups.spawn(async move {
            while Instant::now() < until {
                let look = tokio::time::timeout(
                    Duration::from_secs(1),
                    this.read_holder_and_epoch(&client, &paths),
                )
                .await;
                if let Ok(Ok(Some(read))) = look
                    && read.data == data
                {
                    let steps = plan::forget(read.epoch, read.stat.version);
                    if this.run_steps(&client, &paths, owner, &steps).await {
                        tracing::info!(key = %paths.key, "removed the holder node of an acquire that had timed out");
                        return;
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            // The marker of a lease nobody got (its multi committed or not):
            // requests of one session run in order, so this runs after it.
            // Never while our holder node is still there: a takeover checks
            // the judged holder's marker (see `plan::claim`).
            let look =
                tokio::time::timeout(Duration::from_secs(1), client.get_data(&paths.holder)).await;
            let holder_ours = match look {
                Ok(Ok((current, _))) => current == data,
                Ok(Err(ZkError::NoNode)) => false,
                _ => true, // unknown: keep the marker
            };
            if !holder_ours {
                this.run_steps(&client, &paths, owner, &[Step::DeleteMarker])
                    .await;
            }
        });
    }

    /// Deletes `owner`'s marker of `key` in the background, once its lease
    /// is gone (lost, released, or taken over): a marker only serves the
    /// one-multi path of a lease still held. A holder node of ours still
    /// there goes in the same multi once expired (at the epoch it was read
    /// at, so not once anyone acquired since), or the marker stays: a
    /// holder node is never left without its marker, which a takeover
    /// deletes (see `plan::claim`). `holder_deleted`: the caller itself
    /// just deleted this owner's holder node (a checked release), so the
    /// marker goes without reading the holder first.
    pub(crate) fn drop_marker_in_background(
        &self,
        key: &LeaseKey,
        owner: OwnerId,
        holder_deleted: bool,
    ) {
        let paths = self.paths(key);
        let this = self.clone();
        self.inner.cleanups.spawn(async move {
            let Ok(client) = this.client().await else {
                return;
            };
            if holder_deleted {
                this.run_steps(&client, &paths, owner, &[Step::DeleteMarker])
                    .await;
                return;
            }
            let steps = match this.read_holder_and_epoch(&client, &paths).await {
                Ok(Some(read)) => match parse_holder(&read.data) {
                    Some((o, ttl, _)) if o == owner => {
                        // Ours: it goes only once expired on the server's
                        // clock (a lease rebuilt with our owner and token,
                        // or one on an older session, may still hold it).
                        let ttl = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
                        let now = this.shared_now(&client).await;
                        if !now.is_ok_and(|now| now >= read.stat.mtime.saturating_add(ttl)) {
                            return;
                        }
                        plan::forget(read.epoch, read.stat.version)
                    }
                    _ => vec![Step::DeleteMarker],
                },
                Ok(None) => vec![Step::DeleteMarker],
                // Unknown: keep the marker (it ends with the session).
                Err(_) => return,
            };
            this.run_steps(&client, &paths, owner, &steps).await;
        });
    }

    /// Runs `steps` as one multi for `owner` on `paths`; whether it committed.
    async fn run_steps(
        &self,
        client: &Client,
        paths: &Paths,
        owner: OwnerId,
        steps: &[Step],
    ) -> bool {
        let marker = paths.marker(owner);
        let ephemeral = CreateMode::Ephemeral.with_acls(self.acls());
        let target = paths.target(&marker, None, b"", &ephemeral);
        let mut w = client.new_multi_writer();
        if plan::write(&mut w, steps, &target).is_err() {
            return false;
        }
        matches!(
            self.bounded("delete", async { w.commit().await.map_err(multi_err) })
                .await,
            Ok(Ok(_))
        )
    }
}
