//! Renewing many leases at once (`extend_many`): one `UPDATE` for the whole
//! batch, then one `SELECT` of the rows it renewed.

use std::collections::HashSet;
use std::time::Duration;

use lease_api::{Lease, LeaseError, Result};
use tokio::time::Instant;

use crate::provider::{MysqlProvider, micros};

/// The most leases one batch takes (each costs five bind parameters).
pub(crate) const BATCH: usize = 1000;

impl MysqlProvider {
    /// Extends each lease by its own TTL, compared by owner and token, in two
    /// statements: an `UPDATE` of every row still held by its lease, then a
    /// `SELECT` of the rows held by those leases now. A row the update
    /// renewed is in the answer (it is valid for another TTL); one it did
    /// not renew had expired by then, and expiry only moves forward under
    /// its holder, so it is not.
    pub(crate) async fn extend_batch(&self, leases: &[Lease]) -> Result<Vec<Result<Lease>>> {
        let caps = lease_api::LeaseProvider::capabilities(self);
        let ttls: Vec<Result<Duration>> = leases.iter().map(|l| caps.grant_ttl(l.ttl())).collect();
        let sent: Vec<(&Lease, Duration)> = leases
            .iter()
            .zip(&ttls)
            .filter_map(|(l, t)| t.as_ref().ok().map(|t| (l, *t)))
            .collect();
        let sent_at = Instant::now();
        let mut renewed = HashSet::new();
        if !sent.is_empty() {
            self.ready().await?;
            let tuples = vec!["(?, ?, ?)"; sent.len()].join(", ");
            let cases = " WHEN ? THEN ?".repeat(sent.len());
            let t = &self.inner.sql.table;
            let update = format!(
                "UPDATE `{t}` SET expires_at = UTC_TIMESTAMP(6) + INTERVAL (CASE k{cases} END) MICROSECOND
                  WHERE namespace = ? AND (k, owner, token) IN ({tuples}) AND expires_at > UTC_TIMESTAMP(6)"
            );
            let select = format!(
                "SELECT k, token FROM `{t}`
                  WHERE namespace = ? AND (k, owner, token) IN ({tuples}) AND expires_at > UTC_TIMESTAMP(6)"
            );
            let ns = self.inner.namespace.as_bytes();
            let rows: Vec<(Vec<u8>, u64)> = self
                .bounded("extend", async {
                    let mut c = self.inner.conns.checkout().await?;
                    let r = async {
                        let mut q = sqlx::query(&update);
                        for (l, ttl) in &sent {
                            q = q.bind(l.key().as_str().as_bytes()).bind(micros(*ttl));
                        }
                        q = q.bind(ns);
                        for (l, _) in &sent {
                            q = q
                                .bind(l.key().as_str().as_bytes())
                                .bind(l.owner().to_hex())
                                .bind(l.token().get());
                        }
                        q.execute(c.conn()).await?;
                        let mut s = sqlx::query_as(&select).bind(ns);
                        for (l, _) in &sent {
                            s = s
                                .bind(l.key().as_str().as_bytes())
                                .bind(l.owner().to_hex())
                                .bind(l.token().get());
                        }
                        s.fetch_all(c.conn()).await
                    }
                    .await;
                    c.done(&r);
                    r
                })
                .await?;
            renewed.extend(rows);
        }
        Ok(leases
            .iter()
            .zip(ttls)
            .map(|(lease, ttl)| {
                let ttl = ttl?;
                let k = (
                    lease.key().as_str().as_bytes().to_vec(),
                    lease.token().get(),
                );
                if renewed.contains(&k) {
                    Ok(lease.renewed(ttl, sent_at))
                } else {
                    Err(LeaseError::lost(lease))
                }
            })
            .collect())
    }
}
