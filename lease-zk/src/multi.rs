//! A set of keys in one multi (C18): for every key, the holder node and the
//! owner's marker created and the epoch bumped, all in one transaction.
//! Expired holders are taken over in the same multi, each at the holder
//! version and epoch it was judged expired at.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use lease_api::backend::{OwnerId, validate_key_set};
use lease_api::{LeaseKey, Result, TryAcquireAll};
use tokio::time::Instant;
use zookeeper_client::{Client, CreateMode, Error as ZkError, MultiWriteResult};

use crate::provider::{
    HolderRead, Judged, Paths, ZkProvider, holder_data, multi_err, parse_holder,
};

/// Rounds of look-and-claim before a contended set is answered as held.
const ROUNDS: usize = 4;

impl ZkProvider {
    pub(crate) async fn acquire_set(
        &self,
        keys: &[LeaseKey],
        ttl: Duration,
    ) -> Result<TryAcquireAll> {
        validate_key_set(keys, self.caps().multi_key.max_keys)?;
        let ttl = self.caps().grant_ttl(ttl)?;
        let client = self.client().await?;
        let paths: Vec<Paths> = keys.iter().map(|k| self.paths(k)).collect();
        let owners: Vec<OwnerId> = keys.iter().map(|_| OwnerId::random()).collect();
        let label = lease_api::holder();
        let data: Vec<Vec<u8>> = owners
            .iter()
            .map(|o| holder_data(*o, ttl, &label))
            .collect();
        let mut judged: Vec<Option<Judged>> = vec![None; keys.len()];
        let mut contended = 0;
        for _ in 0..ROUNDS {
            let sent_at = Instant::now();
            match self
                .claim_set(&client, &paths, &owners, &data, &judged)
                .await?
            {
                Ok((zxid, epochs)) => {
                    let session = (client.session_timeout(), client.session_id().0);
                    let mut leases = Vec::with_capacity(keys.len());
                    for ((key, owner), epoch) in keys.iter().zip(&owners).zip(epochs) {
                        leases.push(
                            self.lease_from(
                                key,
                                *owner,
                                ttl,
                                sent_at,
                                (zxid, epoch, session.0, session.1),
                            )?
                            .with_holder(Arc::clone(&label)),
                        );
                    }
                    return Ok(TryAcquireAll::Acquired(leases));
                }
                Err(ZkError::NoNode) => {
                    // A key's first acquire: its key node is made once.
                    join_all(paths.iter().map(|p| self.ensure_key_node(&client, p)))
                        .await
                        .into_iter()
                        .collect::<Result<Vec<()>>>()?;
                    judged = vec![None; keys.len()];
                    continue;
                }
                Err(ZkError::NodeExists | ZkError::BadVersion) => {}
                Err(e) => return Err(self.map_err(e)),
            }
            // Some holder is there (or moved on): judge each on the server's
            // clock, the holder and the epoch read together.
            // All at once: a large set costs one round trip here, not one per key.
            let read = join_all(paths.iter().map(|p| self.read_holder_and_epoch(&client, p)))
                .await
                .into_iter()
                .collect::<Result<Vec<_>>>()?;
            let now = self.shared_now(&client).await?;
            judged = vec![None; keys.len()];
            for (i, found) in read.into_iter().enumerate() {
                let Some(HolderRead {
                    data: data_now,
                    stat,
                    epoch,
                    owner: judged_owner,
                }) = found
                else {
                    continue;
                };
                let holder_ttl = parse_holder(&data_now).map_or(Duration::ZERO, |(_, t, _)| t);
                let expires =
                    stat.mtime + i64::try_from(holder_ttl.as_millis()).unwrap_or(i64::MAX);
                if now < expires {
                    let remaining =
                        Duration::from_millis(u64::try_from(expires - now).unwrap_or(0))
                            .min(holder_ttl);
                    return Ok(TryAcquireAll::Held {
                        key: keys[i].clone(),
                        remaining: Some(remaining),
                    });
                }
                contended = i;
                judged[i] = Some(Judged {
                    epoch,
                    holder_version: stat.version,
                    owner: judged_owner,
                });
            }
        }
        Ok(TryAcquireAll::Held {
            key: keys[contended].clone(),
            remaining: None,
        })
    }

    /// One multi for the whole set: per key, the takeover checks (when
    /// judged expired), the holder node, the marker and the epoch bump.
    /// Returns the transaction's zxid and each key's new epoch.
    async fn claim_set(
        &self,
        client: &Client,
        paths: &[Paths],
        owners: &[OwnerId],
        data: &[Vec<u8>],
        judged: &[Option<Judged>],
    ) -> Result<Result<(i64, Vec<i32>), ZkError>> {
        let mut w = client.new_multi_writer();
        let ephemeral = CreateMode::Ephemeral.with_acls(self.acls());
        let built = (|| {
            for (((p, owner), d), j) in paths.iter().zip(owners).zip(data).zip(judged) {
                let marker = p.marker(*owner);
                let judged_marker = j.and_then(|j| j.owner).map(|o| p.marker(o));
                let target = p.target(&marker, judged_marker.as_deref(), d, &ephemeral);
                let steps = crate::plan::claim(j.map(|j| j.plan()));
                crate::plan::write(&mut w, &steps, &target)?;
            }
            Ok::<(), ZkError>(())
        })();
        if let Err(e) = built {
            return Err(self.map_err(e));
        }
        let results = match self
            .bounded("acquire_all", async { w.commit().await.map_err(multi_err) })
            .await
        {
            Ok(r) => r,
            Err(e) => {
                // The multi may still commit: clean up every key of it, on
                // the same session, after it.
                for ((p, owner), d) in paths.iter().zip(owners).zip(data) {
                    self.remove_holder_if_ours_in_background(
                        client.clone(),
                        (p.clone(), *owner),
                        d.clone(),
                    );
                }
                return Err(e);
            }
        };
        Ok(results.and_then(|results| {
            // One set-data per key, in order; one transaction, one zxid.
            let stats: Vec<_> = results
                .into_iter()
                .filter_map(|r| match r {
                    MultiWriteResult::SetData { stat } => Some(stat),
                    _ => None,
                })
                .collect();
            let zxid = stats.first().map(|s| s.mzxid);
            match zxid {
                Some(zxid) if stats.len() == paths.len() => {
                    Ok((zxid, stats.iter().map(|s| s.version).collect()))
                }
                _ => Err(ZkError::UnexpectedError(format!(
                    "a set multi of {} keys returned {} set-data results",
                    paths.len(),
                    stats.len()
                ))),
            }
        }))
    }
}
