//! Read/write leases on ZooKeeper (C19): under the key node, a persistent
//! `rw` node whose children are the writer (`w-<owner>`), the readers (`r-<owner>`)
//! and the waiting writers (`q-<id>`), all ephemeral, with `owner:ttl:label`
//! data; and `rw-epoch`, rewritten by every writer, whose mzxid is the last
//! writer's token. An acquire reads the children (expiry judged on the
//! server's clock, as for a plain holder) and commits one multi that checks
//! the `rw` node's version and bumps it: any acquire or release in between
//! changed it, so the decision was made on the state it commits on. A
//! child's czxid is its token.

use std::sync::Arc;
use std::time::Duration;

use lease_api::backend::{KeyWatch, LeaseHandle, OwnerId};
use lease_api::{
    FencingToken, Lease, LeaseError, LeaseInfo, LeaseKey, LeaseKind, Result, RwInfo, TryAcquire,
};
use tokio::time::Instant;
use zookeeper_client::{
    Client, CreateMode, Error as ZkError, MultiReadResult, MultiWriteResult, Stat,
};

use crate::provider::{ZkProvider, bounded_validity, holder_data, multi_err, parse_holder};
use crate::watch::ZkWatch;

/// Rounds of read-and-commit before a contended key is answered as held.
const ROUNDS: usize = 4;

/// One child of the `rw` node, as read.
struct Child {
    name: String,
    owner: Option<OwnerId>,
    label: Option<String>,
    stat: Stat,
    /// Until when it lives, on the server's clock (ms).
    until: i64,
}

/// The `rw` node's children and version, read together with the epoch.
struct RwState {
    version: i32,
    children: Vec<Child>,
    /// The last writer's token (the `rw-epoch` node's mzxid); `None`: no
    /// writer yet, and no `rw-epoch` node.
    epoch: Option<i64>,
    now: i64,
}

impl RwState {
    fn live(&self, prefix: &str) -> impl Iterator<Item = &Child> {
        self.children
            .iter()
            .filter(move |c| c.name.starts_with(prefix) && c.until > self.now)
    }

    fn expired(&self) -> impl Iterator<Item = &Child> {
        self.children.iter().filter(|c| c.until <= self.now)
    }

    fn remaining(&self, until: Option<i64>) -> Option<Duration> {
        until.map(|u| Duration::from_millis(u64::try_from(u - self.now).unwrap_or(0)))
    }
}

impl ZkProvider {
    fn rw_paths(&self, key: &LeaseKey) -> (String, String) {
        let key = self.paths(key).key;
        (format!("{key}/rw"), format!("{key}/rw-epoch"))
    }

    fn rw_child(&self, lease: &Lease) -> Option<String> {
        let (rw, _) = self.rw_paths(lease.key());
        match lease.kind() {
            LeaseKind::Write => Some(format!("{rw}/w-{}", lease.owner().to_hex())),
            LeaseKind::Read { .. } => Some(format!("{rw}/r-{}", lease.owner().to_hex())),
            LeaseKind::Exclusive => None,
        }
    }

    /// The state of the key's read/write lease; `None` when its `rw` node
    /// does not exist yet.
    async fn rw_state(&self, client: &Client, key: &LeaseKey) -> Result<Option<RwState>> {
        let (rw, epoch) = self.rw_paths(key);
        let (names, stat) = match self
            .bounded("get children", client.get_children(&rw))
            .await?
        {
            Ok(v) => v,
            Err(ZkError::NoNode) => return Ok(None),
            Err(e) => return Err(self.map_err(e)),
        };
        let mut r = client.new_multi_reader();
        for n in &names {
            r.add_get_data(&format!("{rw}/{n}"))
                .map_err(|e| self.map_err(e))?;
        }
        r.add_get_data(&epoch).map_err(|e| self.map_err(e))?;
        let read = self
            .bounded("get", r.commit())
            .await?
            .map_err(|e| self.map_err(e))?;
        let now = self.shared_now(client).await?;
        let mut children = Vec::with_capacity(names.len());
        let mut last = None;
        for (i, result) in read.into_iter().enumerate() {
            let MultiReadResult::Data { data, stat } = result else {
                continue; // gone since the listing (a release, a session's end)
            };
            match names.get(i) {
                Some(name) => {
                    let parsed = parse_holder(&data);
                    let ttl = parsed.as_ref().map_or(Duration::ZERO, |(_, t, _)| *t);
                    children.push(Child {
                        name: name.clone(),
                        owner: parsed.as_ref().map(|(o, _, _)| *o),
                        label: parsed.and_then(|(_, _, l)| l),
                        until: stat.mtime + i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX),
                        stat,
                    });
                }
                None => last = Some(stat.mzxid),
            }
        }
        Ok(Some(RwState {
            version: stat.version,
            children,
            epoch: last,
            now,
        }))
    }

    /// A reader (`writer` is `None`) or the writer (`Some(waiting)`).
    pub(crate) async fn take_rw(
        &self,
        key: &LeaseKey,
        ttl: Duration,
        writer: Option<Option<OwnerId>>,
    ) -> Result<TryAcquire> {
        let ttl = self.caps().grant_ttl(ttl)?;
        let client = self.client().await?;
        let (rw, epoch_path) = self.rw_paths(key);
        let owner = OwnerId::random();
        let label = lease_api::holder();
        let data = holder_data(owner, ttl, &label);
        let ephemeral = CreateMode::Ephemeral.with_acls(self.acls());
        let mut last_busy = None;
        for _ in 0..ROUNDS {
            let sent_at = Instant::now();
            let Some(state) = self.rw_state(&client, key).await? else {
                self.ensure_key_node(&client, &self.paths(key)).await?;
                let made = client.create(&rw, b"", &CreateMode::Persistent.with_acls(self.acls()));
                match self.bounded("creating the read/write node", made).await? {
                    Ok(_) | Err(ZkError::NodeExists) => continue,
                    Err(e) => return Err(self.map_err(e)),
                }
            };
            let busy = match writer {
                None => state
                    .live("w")
                    .chain(state.live("q-"))
                    .map(|c| c.until)
                    .max(),
                Some(_) => state
                    .live("w")
                    .chain(state.live("r-"))
                    .map(|c| c.until)
                    .max(),
            };
            let waiting = writer.flatten().map(|w| format!("q-{}", w.to_hex()));
            let mut m = client.new_multi_writer();
            let built = (|| {
                m.add_check_version(&rw, state.version)?;
                for c in state.expired() {
                    m.add_delete(&format!("{rw}/{}", c.name), Some(c.stat.version))?;
                }
                match (busy, &waiting) {
                    // Held: a waiting writer records (or renews) itself.
                    (Some(_), Some(q)) => {
                        let path = format!("{rw}/{q}");
                        let mine = holder_data(OwnerId::random(), ttl, "");
                        match state
                            .children
                            .iter()
                            .find(|c| &c.name == q && c.until > state.now)
                        {
                            Some(c) => m.add_set_data(&path, &mine, Some(c.stat.version))?,
                            None => m.add_create(&path, &mine, &ephemeral)?,
                        }
                    }
                    (Some(_), None) => {}
                    (None, _) if writer.is_some() => {
                        m.add_create(&format!("{rw}/w-{}", owner.to_hex()), &data, &ephemeral)?;
                        if state.epoch.is_some() {
                            m.add_set_data(&epoch_path, b"", None)?;
                        } else {
                            m.add_create(
                                &epoch_path,
                                b"",
                                &CreateMode::Persistent.with_acls(self.acls()),
                            )?;
                        }
                        if let Some(q) = &waiting
                            && let Some(c) = state
                                .children
                                .iter()
                                .find(|c| &c.name == q && c.until > state.now)
                        {
                            m.add_delete(&format!("{rw}/{q}"), Some(c.stat.version))?;
                        }
                    }
                    (None, _) => {
                        m.add_create(&format!("{rw}/r-{}", owner.to_hex()), &data, &ephemeral)?;
                    }
                }
                m.add_set_data(&rw, b"", None)
            })();
            if let Err(e) = built {
                return Err(self.map_err(e));
            }
            if busy.is_some() && waiting.is_none() {
                // Nothing to record: answer without writing (the expired
                // children go with the next write).
                return Ok(TryAcquire::Held {
                    remaining: state.remaining(busy),
                });
            }
            let committed = match self
                .bounded("read/write multi", async {
                    m.commit().await.map_err(multi_err)
                })
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    if busy.is_none() {
                        // The multi may still commit: remove our node if it did.
                        let mine = match writer {
                            Some(_) => format!("{rw}/w-{}", owner.to_hex()),
                            None => format!("{rw}/r-{}", owner.to_hex()),
                        };
                        self.remove_if_ours_in_background(
                            client.clone(),
                            (mine.clone(), mine),
                            data.clone(),
                        );
                    }
                    return Err(e);
                }
            };
            let results = match committed {
                Ok(r) => r,
                // Someone acted between the read and the multi: look again.
                Err(ZkError::BadVersion | ZkError::NodeExists | ZkError::NoNode) => continue,
                Err(e) => return Err(self.map_err(e)),
            };
            if busy.is_some() {
                last_busy = busy;
                return Ok(TryAcquire::Held {
                    remaining: state.remaining(last_busy),
                });
            }
            // The `rw` node's set-data is last: its mzxid is the multi's zxid,
            // the created node's czxid, the token.
            let zxid = results
                .iter()
                .rev()
                .find_map(|r| match r {
                    MultiWriteResult::SetData { stat } => Some(stat.mzxid),
                    _ => None,
                })
                .ok_or_else(|| LeaseError::protocol("a read/write multi returned no set-data"))?;
            let token = u64::try_from(zxid)
                .ok()
                .filter(|t| *t > 0)
                .ok_or_else(|| LeaseError::protocol(format!("ZooKeeper returned zxid {zxid}")))?;
            let kind = match writer {
                Some(_) => LeaseKind::Write,
                None => LeaseKind::Read {
                    writer_epoch: FencingToken(
                        u64::try_from(state.epoch.unwrap_or(0)).unwrap_or(0),
                    ),
                },
            };
            // The child's data version: extend and release check it, and
            // only this owner ever creates a child of this name.
            let lease = Lease::new(key.clone(), FencingToken(token), owner, ttl, sent_at)
                .with_holder(Arc::clone(&label))
                .with_kind(kind)
                .with_handle(LeaseHandle::ZkKeyVersion(0));
            return Ok(TryAcquire::Acquired(bounded_validity(
                lease,
                client.session_timeout(),
            )));
        }
        Ok(TryAcquire::Held {
            remaining: last_busy.map(|_| Duration::from_millis(10)),
        })
    }

    /// Extend of a reader or writer; `None` for a plain lease. One
    /// set-data at the child's version the lease carries: the child's name
    /// holds the owner, so no other lease's node can match, and a child
    /// another acquire removed (as expired) is gone, so a late extend cannot
    /// revive it.
    pub(crate) async fn extend_rw(&self, lease: &Lease, ttl: Duration) -> Option<Result<Lease>> {
        let path = self.rw_child(lease)?;
        Some(
            async {
                let ttl = self.caps().grant_ttl(ttl)?;
                let LeaseHandle::ZkKeyVersion(version) = lease.handle() else {
                    return Err(LeaseError::lost(lease));
                };
                let client = self.client().await?;
                let sent_at = Instant::now();
                let data = holder_data(lease.owner(), ttl, lease.holder());
                match self
                    .bounded("extend", client.set_data(&path, &data, Some(version)))
                    .await?
                {
                    Ok(stat) => Ok(bounded_validity(
                        lease
                            .renewed(ttl, sent_at)
                            .with_handle(LeaseHandle::ZkKeyVersion(stat.version)),
                        client.session_timeout(),
                    )),
                    Err(ZkError::BadVersion | ZkError::NoNode) => Err(LeaseError::lost(lease)),
                    Err(e) => Err(self.map_err(e)),
                }
            }
            .await,
        )
    }

    /// Release of a reader or writer; `None` for a plain lease.
    pub(crate) async fn release_rw(&self, lease: &Lease) -> Option<Result<()>> {
        let path = self.rw_child(lease)?;
        Some(self.remove_child(lease.key(), &path, Some(lease)).await)
    }

    /// Deletes `path` (at the version `lease` carries, when given) and bumps
    /// the `rw` node, which wakes the watchers.
    async fn remove_child(&self, key: &LeaseKey, path: &str, lease: Option<&Lease>) -> Result<()> {
        let client = self.client().await?;
        let version = match lease.map(Lease::handle) {
            Some(LeaseHandle::ZkKeyVersion(v)) => Some(v),
            Some(_) => return lease.map_or(Ok(()), |l| Err(LeaseError::not_held(l))),
            None => None,
        };
        let (rw, _) = self.rw_paths(key);
        let mut m = client.new_multi_writer();
        m.add_delete(path, version).map_err(|e| self.map_err(e))?;
        m.add_set_data(&rw, b"", None)
            .map_err(|e| self.map_err(e))?;
        match self
            .bounded("release", async { m.commit().await.map_err(multi_err) })
            .await?
        {
            Ok(_) => Ok(()),
            Err(ZkError::BadVersion | ZkError::NoNode) => match lease {
                Some(l) => Err(LeaseError::not_held(l)),
                None => Ok(()),
            },
            Err(e) => Err(self.map_err(e)),
        }
    }

    pub(crate) async fn withdraw(&self, key: &LeaseKey, waiting: OwnerId) -> Result<()> {
        let (rw, _) = self.rw_paths(key);
        self.remove_child(key, &format!("{rw}/q-{}", waiting.to_hex()), None)
            .await
    }

    pub(crate) async fn inspect_rw_lease(&self, key: &LeaseKey) -> Result<RwInfo> {
        let client = self.client().await?;
        let mut info = RwInfo::default();
        let Some(state) = self.rw_state(&client, key).await? else {
            return Ok(info);
        };
        info.writer_epoch = FencingToken(u64::try_from(state.epoch.unwrap_or(0)).unwrap_or(0));
        let held = |c: &Child| {
            LeaseInfo::new(
                FencingToken(u64::try_from(c.stat.czxid).unwrap_or(0)),
                state.remaining(Some(c.until)).unwrap_or_default(),
                c.owner,
                c.label.clone(),
            )
        };
        info.writer = state.live("w").next().map(held);
        info.readers = state.live("r-").map(held).collect();
        info.readers.sort_by_key(|r| r.token);
        info.writers_waiting = state.live("q-").count();
        Ok(info)
    }

    /// Every acquire and release bumps the `rw` node: its watch wakes on any.
    pub(crate) async fn watch_rw_lease(&self, key: &LeaseKey) -> Result<Box<dyn KeyWatch>> {
        let client = self.client().await?;
        let (rw, _) = self.rw_paths(key);
        let (stat, watcher) = self
            .bounded("watch", client.check_and_watch_stat(&rw))
            .await?
            .map_err(|e| self.map_err(e))?;
        Ok(Box::new(ZkWatch {
            watcher: stat.map(|_| watcher),
        }))
    }
}
