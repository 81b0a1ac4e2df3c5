//! Fair waiting on ZooKeeper: the `WaitQueue` of `ZkProvider`.

use std::time::Duration;

use async_trait::async_trait;
use lease_api::backend::{KeyWatch, OwnerId, Place, Ticket, WaitQueue};
use lease_api::{LeaseError, LeaseKey, Result};
use tokio::time::Instant;
use zookeeper_client::{Client, CreateMode, Error as ZkError};

use crate::provider::ZkProvider;
use crate::watch::ZkWatch;

impl ZkProvider {
    /// The parent of `key`'s waiters: a child of the key node, beside the
    /// holder node.
    fn waiters_path(&self, key: &LeaseKey) -> String {
        format!("{}/waiters", self.paths(key).key)
    }

    /// A waiter's node: `w-`, its join's mark, and its sequence number as
    /// ZooKeeper names sequential nodes.
    fn ticket_path(&self, ticket: &Ticket) -> String {
        format!(
            "{}/{}{}",
            self.waiters_path(ticket.key()),
            ticket_prefix(ticket.mark()),
            sequence_suffix(ticket.seq())
        )
    }
}

impl ZkProvider {
    /// Deletes the waiter node carrying `mark` under `waiters`, after a join
    /// whose outcome is unknown; in the background, on the same session,
    /// until the session could have expired.
    fn remove_marked_in_background(&self, client: Client, waiters: String, mark: String) {
        let until = Instant::now() + self.inner.config.session_timeout;
        self.inner.cleanups.spawn(async move {
            while Instant::now() < until {
                let step = Duration::from_secs(1);
                if let Ok(Ok(children)) =
                    tokio::time::timeout(step, client.list_children(&waiters)).await
                {
                    for child in children {
                        let path = format!("{waiters}/{child}");
                        if let Ok(Ok((data, _))) =
                            tokio::time::timeout(step, client.get_data(&path)).await
                            && data == mark.as_bytes()
                        {
                            let _ = tokio::time::timeout(step, client.delete(&path, None)).await;
                            tracing::info!(node = %path, "removed the waiter node of a join that had failed");
                            return;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
    }
}

/// The name of a waiter node before ZooKeeper's sequence suffix: `w-`, the
/// join's mark in 16 hex digits, `-`. The mark makes the node this join's
/// even if the waiters node were made again and its numbers given twice.
fn ticket_prefix(mark: u64) -> String {
    format!("w-{mark:016x}-")
}

/// The (sequence number, mark) of a waiter node's name.
fn parse_ticket(name: &str) -> Option<(u64, u64)> {
    let (mark, seq) = name.strip_prefix("w-")?.split_once('-')?;
    Some((seq.parse().ok()?, u64::from_str_radix(mark, 16).ok()?))
}

/// ZooKeeper's suffix of sequence number `seq`: ten digits, nineteen past
/// `i32::MAX`.
fn sequence_suffix(seq: u64) -> String {
    if seq <= u64::from(i32::MAX.unsigned_abs()) {
        format!("{seq:010}")
    } else {
        format!("{seq:019}")
    }
}

/// Fair waiting as Curator's fair lock queues: each waiter creates an
/// ephemeral sequential node under the key's `waiters` node and watches the
/// node just ahead of it. A dead waiter's node goes with its session.
#[async_trait]
impl WaitQueue for ZkProvider {
    async fn join(&self, key: &LeaseKey, ttl: Duration, mark: u64) -> Result<Ticket> {
        self.caps().grant_ttl(ttl)?;
        let client = self.client().await?;
        let paths = self.paths(key);
        let waiters = self.waiters_path(key);
        let mode = CreateMode::EphemeralSequential.with_acls(self.acls());
        let node = format!("{waiters}/{}", ticket_prefix(mark));
        // The node's data names this create, so one whose answer was lost
        // can be found and removed (on ZooKeeper a ticket lives as long as
        // the session, not a TTL), and never the node of a retry.
        let attempt = OwnerId::random().to_hex();
        for _ in 0..3 {
            let created = match self
                .bounded(
                    "joining the queue",
                    client.create(&node, attempt.as_bytes(), &mode),
                )
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    self.remove_marked_in_background(client.clone(), waiters.clone(), attempt);
                    return Err(e);
                }
            };
            match created {
                Ok((_, seq)) => {
                    let seq = u64::try_from(seq.into_i64()).map_err(|_| {
                        LeaseError::protocol("ZooKeeper gave a negative sequence number")
                    })?;
                    return Ok(Ticket::new(key.clone(), seq, mark));
                }
                // The key node or its waiters node does not exist yet.
                Err(ZkError::NoNode) => {
                    self.ensure_key_node(&client, &paths).await?;
                    let made = client.create(
                        &waiters,
                        b"",
                        &CreateMode::Persistent.with_acls(self.acls()),
                    );
                    match self.bounded("creating the waiters node", made).await? {
                        Ok(_) | Err(ZkError::NodeExists) => {}
                        Err(e) => return Err(self.map_err(e)),
                    }
                }
                Err(e @ ZkError::ConnectionLoss) => {
                    self.remove_marked_in_background(client.clone(), waiters.clone(), attempt);
                    return Err(self.map_err(e));
                }
                Err(e) => return Err(self.map_err(e)),
            }
        }
        Err(LeaseError::protocol(
            "ZooKeeper kept answering that the waiters node is missing",
        ))
    }

    async fn place(&self, ticket: &Ticket) -> Result<Place> {
        let client = self.client().await?;
        let children = match self
            .bounded(
                "list",
                client.list_children(&self.waiters_path(ticket.key())),
            )
            .await?
        {
            Ok(c) => c,
            Err(ZkError::NoNode) => return Ok(Place::Gone),
            Err(e) => return Err(self.map_err(e)),
        };
        let mut own = false;
        let mut ahead: Option<(u64, u64)> = None;
        for child in &children {
            let Some((seq, mark)) = parse_ticket(child) else {
                continue;
            };
            if seq == ticket.seq() {
                own = mark == ticket.mark();
            } else if seq < ticket.seq() && ahead.is_none_or(|(a, _)| seq > a) {
                ahead = Some((seq, mark));
            }
        }
        Ok(match (own, ahead) {
            (false, _) => Place::Gone,
            (true, None) => Place::First,
            (true, Some((seq, mark))) => Place::Behind {
                ahead: Ticket::new(ticket.key().clone(), seq, mark),
                // It goes with its waiter's session.
                remaining: None,
            },
        })
    }

    async fn watch_ticket(&self, ahead: &Ticket) -> Result<Box<dyn KeyWatch>> {
        let client = self.client().await?;
        let (stat, watcher) = self
            .bounded(
                "watch",
                client.check_and_watch_stat(&self.ticket_path(ahead)),
            )
            .await?
            .map_err(|e| self.map_err(e))?;
        // A node that is gone already wakes the waiter at once.
        Ok(Box::new(ZkWatch {
            watcher: stat.map(|_| watcher),
        }))
    }

    async fn refresh(&self, ticket: &Ticket, _ttl: Duration) -> Result<bool> {
        // The node lives as long as the session: it is refreshed by the
        // session's heartbeats, and only a new session has lost it.
        let client = self.client().await?;
        let stat = self
            .bounded("exists", client.check_stat(&self.ticket_path(ticket)))
            .await?
            .map_err(|e| self.map_err(e))?;
        Ok(stat.is_some())
    }

    async fn leave(&self, ticket: &Ticket) -> Result<()> {
        let client = self.client().await?;
        match self
            .bounded(
                "leaving the queue",
                client.delete(&self.ticket_path(ticket), None),
            )
            .await?
        {
            Ok(()) | Err(ZkError::NoNode) => Ok(()),
            Err(e) => Err(self.map_err(e)),
        }
    }
}
