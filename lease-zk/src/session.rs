//! The ZooKeeper side of a `LeaseSession`: holder nodes on a ZooKeeper
//! session of its own, which is what keeps them.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lease_api::backend::SessionStore;
use lease_api::{Lease, LeaseError, LeaseKey, LeaseProvider, Result, TryAcquire};
use tokio::time::Instant;
use zookeeper_client::{Error as ZkError, MultiReadResult};

use crate::provider::{ZkProvider, bounded_validity, parse_holder};

/// The TTL written into the holder node of a session's lease, by which other
/// clients judge expiry: a hundred years, so the node ends only with the
/// ZooKeeper session it is ephemeral on (or a release).
pub(crate) const SESSION_BOUND_TTL: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The most holder nodes one renewal reads in one multi-read.
const BATCH: usize = 1000;

/// A `LeaseSession` on ZooKeeper: a provider with its own client, so the
/// session's holder nodes live and die with one ZooKeeper session. Renewal
/// is the client's own heartbeat; the session's loop proves the session
/// alive at the leader with one write per round (the clock probe) and reads
/// the holder nodes, a thousand per multi-read, to check that each node is
/// still this lease's.
#[derive(Debug)]
pub(crate) struct ZkSessionStore {
    provider: ZkProvider,
    /// When the last write that went through the leader was sent (and on
    /// which session): the proof that the session was alive there then.
    proof: tokio::sync::Mutex<Option<(Instant, i64)>>,
}

/// How long one leader proof serves the renewal calls of a round.
const PROOF_REUSE: Duration = Duration::from_millis(200);

impl ZkSessionStore {
    pub(crate) fn new(provider: ZkProvider) -> Self {
        ZkSessionStore {
            provider,
            proof: tokio::sync::Mutex::new(None),
        }
    }

    /// When a write of this session last reached the leader. A follower
    /// answers reads locally, even one cut off from the leader that has
    /// already expired our session; a write goes through the leader, which
    /// refuses it for an expired session. So validity counts from the
    /// write's send time, and the reads only say which nodes are still ours.
    async fn leader_proof(&self, client: &zookeeper_client::Client) -> Result<Instant> {
        let mut proof = self.proof.lock().await;
        let session = client.session_id().0;
        if let Some((sent, on)) = *proof
            && on == session
            && sent.elapsed() < PROOF_REUSE
        {
            return Ok(sent);
        }
        let sent = Instant::now();
        self.provider.probe_clock(client).await?;
        *proof = Some((sent, session));
        Ok(sent)
    }
}

#[async_trait]
impl SessionStore for ZkSessionStore {
    async fn try_acquire(&self, key: &LeaseKey, ttl: Duration) -> Result<TryAcquire> {
        self.provider
            .try_acquire_recording(key, ttl, SESSION_BOUND_TTL)
            .await
    }

    async fn renew(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        let client = self.provider.client().await?;
        let mut reader = client.new_multi_reader();
        for lease in leases {
            let path = self.provider.holder_path(lease.key());
            reader
                .add_get_data(&path)
                .map_err(|e| self.provider.map_err(e))?;
        }
        let sent_at = self.leader_proof(&client).await?;
        let answers = self
            .provider
            .bounded("session renewal", reader.commit())
            .await?
            .map_err(|e| self.provider.map_err(e))?;
        if answers.len() != leases.len() {
            return Err(LeaseError::protocol(format!(
                "a multi-read of {} nodes returned {} answers",
                leases.len(),
                answers.len()
            )));
        }
        let session = client.session_id().0;
        let timeout = client.session_timeout();
        Ok(leases
            .iter()
            .zip(answers)
            .map(|(lease, answer)| match answer {
                MultiReadResult::Data { data, stat } => {
                    let ours = parse_holder(&data)
                        .is_some_and(|(owner, _, _)| owner == lease.owner())
                        && u64::try_from(stat.czxid).ok() == Some(lease.token().get())
                        && stat.ephemeral_owner == session;
                    if ours {
                        Ok(bounded_validity(
                            lease.renewed(lease.ttl(), sent_at),
                            timeout,
                        ))
                    } else {
                        Err(LeaseError::lost(lease))
                    }
                }
                MultiReadResult::Error {
                    err: ZkError::NoNode,
                } => Err(LeaseError::lost(lease)),
                MultiReadResult::Error { err } => Err(self.provider.map_err(err)),
                other => Err(LeaseError::protocol(format!(
                    "unexpected multi-read answer from ZooKeeper: {other:?}"
                ))),
            })
            .collect())
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.provider.release(lease).await
    }

    fn batch_limit(&self) -> usize {
        BATCH
    }

    fn tied_to_session(&self) -> bool {
        true
    }

    async fn abandon(&self) {
        self.provider.close_session().await;
    }

    async fn close(&self) {
        // The holder nodes go with the session: close it now rather than
        // when the last clone of its client is dropped.
        self.provider.close_session().await;
    }
}

/// The provider's own `session_store`: a store on a new ZooKeeper session.
pub(crate) fn open(provider: &ZkProvider) -> Result<Arc<dyn SessionStore>> {
    Ok(Arc::new(ZkSessionStore::new(provider.fresh()?)))
}
