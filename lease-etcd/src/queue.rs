//! Fair waiting on etcd: the `WaitQueue` of `EtcdProvider`.

use std::time::Duration;

use crate::provider::{EtcdProvider, prefix_end};
use async_trait::async_trait;
use etcd_client::{EventType, GetOptions, PutOptions, WatchStream};
use lease_api::backend::{KeyWatch, Place, Ticket, WaitQueue};
use lease_api::{LeaseError, LeaseKey, Result};

impl EtcdProvider {
    /// Waits for etcd to confirm a new watch: from then on, every change of
    /// its key is delivered.
    pub(crate) async fn confirmed(&self, stream: &mut WatchStream) -> Result<()> {
        let limit = self.inner.config.request_timeout;
        match tokio::time::timeout(limit, stream.message()).await {
            Ok(Ok(Some(r))) if r.created() => Ok(()),
            Ok(Err(e)) => Err(self.map_err(e)),
            _ => Err(LeaseError::Unavailable {
                message: format!(
                    "etcd at {} did not confirm a watch in time",
                    self.inner.display
                ),
                source: None,
            }),
        }
    }

    /// The prefix of `key`'s queue of waiters: beside the lease keys of the
    /// namespace, under a NUL byte no lease key contains, and closed by
    /// another NUL so that the queue of `a` is not a prefix of that of `a/b`.
    pub(crate) fn queue_prefix(&self, key: &LeaseKey) -> String {
        format!("{}\0q/{}\0/", self.inner.prefix, key.as_str())
    }

    /// A waiter's etcd key: the queue prefix and its etcd lease id.
    pub(crate) fn ticket_key(&self, ticket: &Ticket) -> String {
        format!(
            "{}{:016x}",
            self.queue_prefix(ticket.key()),
            ticket.handle()
        )
    }
}

/// Fair waiting the way etcd's `concurrency` mutex queues: each waiter puts
/// a key under the queue prefix, attached to an etcd lease of its own, and
/// its create revision is its place. A waiter watches the key just ahead
/// (the greatest smaller create revision); a dead waiter's key goes when its
/// etcd lease runs out, which the watch sees as a deletion.
#[async_trait]
impl WaitQueue for EtcdProvider {
    async fn join(&self, key: &LeaseKey, ttl: Duration, mark: u64) -> Result<Ticket> {
        let ttl = self.inner.caps.grant_ttl(ttl)?;
        let (id, _) = self.grant(ttl).await?;
        let k = format!("{}{id:016x}", self.queue_prefix(key));
        let put = self
            .call("put", |mut c| async move {
                c.put(k, "", Some(PutOptions::new().with_lease(id))).await
            })
            .await;
        match put {
            Ok(resp) => {
                let seq = resp
                    .header()
                    .map(|h| h.revision())
                    .and_then(|r| u64::try_from(r).ok())
                    .ok_or_else(|| {
                        LeaseError::protocol("etcd answered a put without a revision")
                    })?;
                Ok(Ticket::new(key.clone(), seq, mark).with_handle(id))
            }
            Err(e) => {
                // The key may have been written; it goes with the lease.
                self.revoke_in_background(id);
                Err(e)
            }
        }
    }

    async fn place(&self, ticket: &Ticket) -> Result<Place> {
        let prefix = self.queue_prefix(ticket.key());
        let end = prefix_end(prefix.as_bytes());
        let max = i64::try_from(ticket.seq()).unwrap_or(i64::MAX);
        // Our own key and the one just ahead: the two greatest create
        // revisions up to ours.
        let resp = self
            .call("range", |mut c| async move {
                c.get(
                    prefix,
                    Some(
                        GetOptions::new()
                            .with_range(end)
                            .with_keys_only()
                            .with_max_create_revision(max)
                            .with_sort(
                                etcd_client::SortTarget::Create,
                                etcd_client::SortOrder::Descend,
                            )
                            .with_limit(2),
                    ),
                )
                .await
            })
            .await?;
        let kvs = resp.kvs();
        let own = kvs
            .first()
            .is_some_and(|kv| kv.create_revision() == max && kv.lease() == ticket.handle());
        if !own {
            return Ok(Place::Gone);
        }
        Ok(match kvs.get(1) {
            None => Place::First,
            Some(kv) => Place::Behind {
                // Its key and lease name it; its mark is not stored.
                ahead: Ticket::new(
                    ticket.key().clone(),
                    u64::try_from(kv.create_revision()).unwrap_or(0),
                    0,
                )
                .with_handle(kv.lease()),
                // Its deletion at expiry reaches the watch.
                remaining: None,
            },
        })
    }

    async fn watch_ticket(&self, ahead: &Ticket) -> Result<Box<dyn KeyWatch>> {
        let k = self.ticket_key(ahead);
        // Watch from now on, then look: a deletion before the watch started
        // shows as a missing key, one after it as an event. (Watching from
        // the ticket's create revision would fail once etcd compacted past it.)
        let watched = k.clone();
        let mut stream = self
            .call("watch", |mut c| async move { c.watch(watched, None).await })
            .await?;
        self.confirmed(&mut stream).await?;
        let found = self
            .call("get", |mut c| async move {
                c.get(k, Some(GetOptions::new().with_keys_only())).await
            })
            .await?;
        Ok(Box::new(TicketWatch {
            stream: (!found.kvs().is_empty()).then_some(stream),
        }))
    }

    async fn refresh(&self, ticket: &Ticket, _ttl: Duration) -> Result<bool> {
        self.keep_alive_once(ticket.handle()).await
    }

    async fn leave(&self, ticket: &Ticket) -> Result<()> {
        let k = self.ticket_key(ticket);
        self.call("delete", |mut c| async move { c.delete(k, None).await })
            .await?;
        self.revoke_in_background(ticket.handle());
        Ok(())
    }
}

/// Waits for the deletion of the ticket ahead.
struct TicketWatch {
    stream: Option<WatchStream>,
}

#[async_trait]
impl KeyWatch for TicketWatch {
    async fn changed(&mut self, max: Duration) {
        let Some(stream) = self.stream.as_mut() else {
            return;
        };
        let deleted = async {
            loop {
                match stream.message().await {
                    Ok(Some(resp)) if resp.canceled() => return,
                    Ok(Some(resp)) => {
                        if resp
                            .events()
                            .iter()
                            .any(|e| e.event_type() == EventType::Delete)
                        {
                            return;
                        }
                    }
                    _ => return,
                }
            }
        };
        let _ = tokio::time::timeout(max, deleted).await;
        self.stream = None;
    }
}
