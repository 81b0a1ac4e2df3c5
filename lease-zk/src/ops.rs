//! The lease operations of `ZkProvider`: acquire, extend, release, inspect and watch.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lease_api::backend::{KeyWatch, LeaseHandle, OwnerId, SessionStore, WaitQueue};
use lease_api::{
    Capabilities, FencingToken, Lease, LeaseError, LeaseInfo, LeaseKey, LeaseProvider, Result,
    RwInfo, TryAcquire, TryAcquireAll,
};
use tokio::time::Instant;
use zookeeper_client::{CreateMode, Error as ZkError};

use crate::plan;
use crate::provider::{
    HolderRead, Judged, ZkProvider, bounded_validity, holder_data, multi_err, parse_holder,
};
use crate::watch::ZkWatch;

impl ZkProvider {
    /// Extend, without the bookkeeping of `issued`.
    async fn extend_once(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let ttl = self.caps().grant_ttl(ttl)?;
        let lost = || LeaseError::lost(lease);
        let client = self.client().await?;
        let paths = self.paths(lease.key());
        let Some(epoch) = key_version(lease) else {
            return Err(lost());
        };
        let sent_at = Instant::now();
        // The holder's new data, and the holder version it must still have
        // (`None`: our marker must still be there instead).
        let (data, holder_version) =
            if self
                .inner
                .issued
                .fast_path(lease, epoch, client.session_id().0)
            {
                // One of ours, on this session, valid: the epoch and our
                // marker prove nobody acquired since (see `issued`).
                (holder_data(lease.owner(), ttl, lease.holder()), None)
            } else {
                let (current, now) = tokio::join!(
                    self.bounded("get", client.get_data(&paths.holder)),
                    self.server_now(&client)
                );
                let (data, stat) = match current? {
                    Ok(v) => v,
                    Err(ZkError::NoNode) => return Err(lost()),
                    Err(e) => return Err(self.map_err(e)),
                };
                let now = now?;
                let Some((owner, old_ttl, label)) = parse_holder(&data) else {
                    return Err(lost());
                };
                let expires = stat.mtime + i64::try_from(old_ttl.as_millis()).unwrap_or(i64::MAX);
                // The node must live on the session we renew through: a node left on
                // an older session of ours dies with that session, whatever we extend.
                if owner != lease.owner()
                    || u64::try_from(stat.czxid).ok() != Some(lease.token().get())
                    || stat.ephemeral_owner != client.session_id().0
                    || now >= expires
                {
                    return Err(lost());
                }
                // Keep the label the acquire recorded.
                let label = label.as_deref().unwrap_or(lease.holder());
                (holder_data(owner, ttl, label), Some(stat.version))
            };
        let marker = paths.marker(lease.owner());
        let mut w = client.new_multi_writer();
        let ephemeral = CreateMode::Ephemeral.with_acls(self.acls());
        let target = paths.target(&marker, None, &data, &ephemeral);
        if let Err(e) = plan::write(&mut w, &plan::extend(epoch, holder_version), &target) {
            return Err(self.map_err(e));
        }
        match self
            .bounded("extend", async { w.commit().await.map_err(multi_err) })
            .await?
        {
            Ok(_) => Ok(bounded_validity(
                lease.renewed(ttl, sent_at),
                client.session_timeout(),
            )),
            Err(ZkError::BadVersion | ZkError::NoNode) => Err(lost()),
            Err(e) => Err(self.map_err(e)),
        }
    }

    /// Release, without the bookkeeping of `issued`.
    async fn release_once(&self, lease: &Lease) -> Result<()> {
        let not_held = || LeaseError::not_held(lease);
        let client = self.client().await?;
        let paths = self.paths(lease.key());
        let Some(epoch) = key_version(lease) else {
            return Err(not_held());
        };
        // The holder version the node must still have, and whether the lease
        // already ran out (then the node still goes, so waiters wake now, but
        // the answer is NotHeld, C7).
        let (holder_version, expired) =
            if self
                .inner
                .issued
                .fast_path(lease, epoch, client.session_id().0)
            {
                // One of ours, on this session, valid: the epoch and our
                // marker prove nobody acquired since (see `issued`).
                (None, false)
            } else {
                // Key node versions repeat across keys and namespaces: check that the
                // holder node is this lease's (owner and czxid) before deleting it.
                let (current, now) = self.read_synced(&client, &paths.holder).await?;
                let (data, stat) = match current {
                    Ok(v) => v,
                    Err(ZkError::NoNode) => return Err(not_held()),
                    Err(e) => return Err(self.map_err(e)),
                };
                let now = now?;
                let Some((owner, ttl, _)) = parse_holder(&data) else {
                    return Err(not_held());
                };
                if owner != lease.owner()
                    || u64::try_from(stat.czxid).ok() != Some(lease.token().get())
                {
                    return Err(not_held());
                }
                let expired =
                    now >= stat.mtime + i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
                (Some(stat.version), expired)
            };
        let mut w = client.new_multi_writer();
        let marker = paths.marker(lease.owner());
        let ephemeral = CreateMode::Ephemeral.with_acls(self.acls());
        let target = paths.target(&marker, None, b"", &ephemeral);
        if let Err(e) = plan::write(&mut w, &plan::release(epoch, holder_version), &target) {
            return Err(self.map_err(e));
        }
        match self
            .bounded("release", async { w.commit().await.map_err(multi_err) })
            .await?
        {
            Ok(_) => {
                // The one-multi release took the marker with it; a checked
                // release leaves it to remove.
                if holder_version.is_some() {
                    self.drop_marker_in_background(lease.key(), lease.owner(), true);
                }
                if expired { Err(not_held()) } else { Ok(()) }
            }
            Err(ZkError::BadVersion | ZkError::NoNode) => Err(not_held()),
            Err(e) => Err(self.map_err(e)),
        }
    }
}

impl ZkProvider {
    /// Acquire with `ttl` as the lease's, and `recorded` as the TTL written
    /// in the holder node, by which others judge expiry: the same, or
    /// `SESSION_BOUND_TTL` for a lease that ends only with the session.
    pub(crate) async fn try_acquire_recording(
        &self,
        key: &LeaseKey,
        ttl: Duration,
        recorded: Duration,
    ) -> Result<TryAcquire> {
        let client = self.client().await?;
        let paths = self.paths(key);
        let owner = OwnerId::random();
        let label = lease_api::holder();
        let data = holder_data(owner, recorded, &label);
        for _ in 0..4 {
            let sent_at = Instant::now();
            match self.claim(&client, &paths, (owner, &data), None).await? {
                Ok((zxid, epoch)) => {
                    let granted = (zxid, epoch, client.session_timeout(), client.session_id().0);
                    return Ok(TryAcquire::Acquired(
                        self.lease_from(key, owner, ttl, sent_at, granted)?
                            .with_holder(Arc::clone(&label)),
                    ));
                }
                Err(ZkError::NoNode) => {
                    self.ensure_key_node(&client, &paths).await?;
                    continue;
                }
                Err(ZkError::NodeExists) => {}
                Err(e) => return Err(self.map_err(e)),
            }
            // Held: judge expiry on the server's clock, on the holder node and
            // the epoch read together (one consistent snapshot).
            let HolderRead {
                data: data_now,
                stat,
                epoch,
                owner: judged_owner,
            } = match self.read_holder_and_epoch(&client, &paths).await? {
                Some(v) => v,
                None => continue,
            };
            let now = self.shared_now(&client).await?;
            let holder_ttl = parse_holder(&data_now).map_or(Duration::ZERO, |(_, t, _)| t);
            let expires = stat.mtime + i64::try_from(holder_ttl.as_millis()).unwrap_or(i64::MAX);
            if now < expires {
                let remaining = Duration::from_millis(u64::try_from(expires - now).unwrap_or(0))
                    .min(holder_ttl);
                return Ok(TryAcquire::Held {
                    remaining: Some(remaining),
                });
            }
            let sent_at = Instant::now();
            let judged = Judged {
                epoch,
                holder_version: stat.version,
                owner: judged_owner,
            };
            match self
                .claim(&client, &paths, (owner, &data), Some(judged))
                .await?
            {
                Ok((zxid, epoch)) => {
                    let granted = (zxid, epoch, client.session_timeout(), client.session_id().0);
                    return Ok(TryAcquire::Acquired(
                        self.lease_from(key, owner, ttl, sent_at, granted)?
                            .with_holder(Arc::clone(&label)),
                    ));
                }
                // Someone else acted first; look again.
                Err(ZkError::BadVersion | ZkError::NoNode | ZkError::NodeExists) => continue,
                Err(e) => return Err(self.map_err(e)),
            }
        }
        Ok(TryAcquire::Held { remaining: None })
    }
}

#[async_trait]
impl LeaseProvider for ZkProvider {
    fn capabilities(&self) -> &Capabilities {
        self.caps()
    }

    fn namespace(&self) -> &str {
        &self.inner.config.namespace
    }

    async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        let ttl = self.caps().grant_ttl(ttl)?;
        self.try_acquire_recording(key, ttl, ttl).await
    }

    /// One multi for the whole set (see `multi.rs`).
    async fn try_acquire_all(&self, keys: &[LeaseKey], ttl: Duration) -> Result<TryAcquireAll> {
        self.acquire_set(keys, ttl).await
    }

    async fn try_acquire_read(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        self.take_rw(key, ttl, None).await
    }

    async fn try_acquire_write(
        &self,
        key: &LeaseKey,
        ttl: Duration,
        waiting: Option<OwnerId>,
    ) -> Result<TryAcquire> {
        self.take_rw(key, ttl, Some(waiting)).await
    }

    async fn withdraw_writer(&self, key: &LeaseKey, waiting: OwnerId) -> Result<()> {
        self.withdraw(key, waiting).await
    }

    async fn inspect_rw(&self, key: &LeaseKey) -> Result<RwInfo> {
        self.inspect_rw_lease(key).await
    }

    async fn watch_rw(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        self.watch_rw_lease(key).await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        if let Some(answer) = self.extend_rw(lease, ttl).await {
            return answer;
        }
        let extended = self.extend_once(lease, ttl).await;
        match &extended {
            Ok(renewed) => self.inner.issued.renewed(renewed),
            Err(LeaseError::Lost { .. }) => {
                // Only a lease we issued: a lease rebuilt with our owner id
                // and another token must not remove the holder's marker.
                if self.inner.issued.forget(lease) {
                    self.drop_marker_in_background(lease.key(), lease.owner(), false);
                }
            }
            Err(_) => {}
        }
        extended
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        if let Some(answer) = self.release_rw(lease).await {
            return answer;
        }
        let released = self.release_once(lease).await;
        // After a transient error the lease may still be held: a retry keeps
        // its fast path.
        if matches!(released, Ok(()) | Err(LeaseError::NotHeld { .. })) {
            let issued = self.inner.issued.forget(lease);
            if issued && released.is_err() {
                // Ours, taken over or purged: its marker may be left. (Only
                // a lease we issued: one rebuilt with our owner id and another
                // token must not remove the holder's marker.)
                self.drop_marker_in_background(lease.key(), lease.owner(), false);
            }
        }
        released
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>> {
        let client = self.client().await?;
        let paths = self.paths(key);
        let (current, now) = self.read_synced(&client, &paths.holder).await?;
        let (data, stat) = match current {
            Ok(v) => v,
            Err(ZkError::NoNode) => return Ok(None),
            Err(e) => return Err(self.map_err(e)),
        };
        let now = now?;
        let Some((owner, ttl, holder)) = parse_holder(&data) else {
            return Ok(None);
        };
        let expires = stat.mtime + i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        if now >= expires {
            return Ok(None);
        }
        Ok(Some(LeaseInfo::new(
            FencingToken(u64::try_from(stat.czxid).unwrap_or(0)),
            // The clock sample is a lower bound; never report more than the TTL.
            Duration::from_millis(u64::try_from(expires - now).unwrap_or(0)).min(ttl),
            Some(owner),
            holder,
        )))
    }

    async fn session_store(&self, ttl: Duration) -> Result<Option<Arc<dyn SessionStore>>> {
        let _ = ttl;
        crate::session::open(self).map(Some)
    }

    async fn flush(&self, limit: Duration) {
        lease_api::backend::drain(&self.inner.cleanups, limit).await;
    }

    /// The exists watch reports whether the holder node is there as it
    /// registers: a release before it is seen, so `acquire` tries first.
    fn watch_reports_state(&self) -> bool {
        true
    }

    fn wait_queue(&self) -> Option<&dyn WaitQueue> {
        Some(self)
    }

    async fn watch(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        let client = self.client().await?;
        let paths = self.paths(key);
        let (stat, watcher) = self
            .bounded("watch", client.check_and_watch_stat(&paths.holder))
            .await?
            .map_err(|e| self.map_err(e))?;
        Ok(Box::new(ZkWatch {
            // No holder node: nothing to wait for, the next try may win at once.
            watcher: stat.map(|_| watcher),
        }))
    }
}

/// The key node version a lease of ours was created under; `None` for a
/// lease of another backend (or a negative version, which no acquire hands
/// out): such a lease holds nothing here. Never pass -1 on: to ZooKeeper it
/// means "any version".
fn key_version(lease: &Lease) -> Option<i32> {
    match lease.handle() {
        LeaseHandle::ZkKeyVersion(v) if v >= 0 => Some(v),
        _ => None,
    }
}
