//! A set of keys in one statement (C18): every row or none, on the
//! database's clock, each row with its own token.

use std::collections::HashMap;
use std::time::Duration;

use lease_api::backend::{OwnerId, validate_key_set};
use lease_api::{FencingToken, Lease, LeaseError, LeaseKey, LeaseProvider, Result, TryAcquireAll};
use sqlx::Row;
use tokio::time::Instant;

use crate::orphans::{Flight, Wins};
use crate::provider::{PostgresProvider, from_micros, micros};

/// How often a set is tried again after a concurrent commit inserted one of
/// its rows after the statement's snapshot. Each run takes a fresh snapshot,
/// which sees that commit, so one more run answers.
const RACE_RETRIES: usize = 5;

/// `division_by_zero`: the statement's abort when it won fewer rows than keys.
const PARTIAL_SET: &str = "22012";

/// What one run of the statement found.
enum Answer {
    Won(HashMap<String, i64>),
    Held(String, Option<i64>),
    /// A concurrent commit took a row after the snapshot: nothing written.
    Raced,
}

impl PostgresProvider {
    pub(crate) async fn acquire_set(
        &self,
        keys: &[LeaseKey],
        ttl: Duration,
    ) -> Result<TryAcquireAll> {
        validate_key_set(keys, self.capabilities().multi_key.max_keys)?;
        let ttl = self.capabilities().grant_ttl(ttl)?;
        self.ready().await?;
        let names: Vec<&str> = keys.iter().map(LeaseKey::as_str).collect();
        let count = i64::try_from(keys.len())
            .map_err(|_| LeaseError::Config("too many keys in one set".into()))?;
        let holder = lease_api::holder();
        for _ in 0..RACE_RETRIES {
            let owners: Vec<OwnerId> = keys.iter().map(|_| OwnerId::random()).collect();
            let owner_hex: Vec<String> = owners.iter().map(|o| o.to_hex()).collect();
            let sent_at = Instant::now();
            let flight = Flight::new(
                self,
                &self.inner.sql.acquire_all,
                Wins::Plain {
                    keys: &names,
                    owners: &owner_hex,
                },
            );
            let answer = self
                .bounded("acquire_all", async {
                    let mut c = self.inner.conns.checkout().await?;
                    flight.sent(c.session());
                    let r = sqlx::query(&self.inner.sql.acquire_all)
                        .bind(&self.inner.namespace)
                        .bind(&names)
                        .bind(&owner_hex)
                        .bind(micros(ttl))
                        .bind(&*holder)
                        .bind(count)
                        .fetch_all(c.conn())
                        .await;
                    flight.answered(&r);
                    let r = match r {
                        Err(sqlx::Error::Database(e))
                            if e.code().as_deref() == Some(PARTIAL_SET) =>
                        {
                            Ok(Answer::Raced)
                        }
                        Err(e) => Err(e),
                        Ok(rows) => read_rows(&rows),
                    };
                    c.done(&r);
                    r
                })
                .await?;
            match answer {
                Answer::Won(tokens) => {
                    let mut leases = Vec::with_capacity(keys.len());
                    for (key, owner) in keys.iter().zip(owners) {
                        let token = tokens
                            .get(key.as_str())
                            .and_then(|&t| u64::try_from(t).ok())
                            .ok_or_else(|| {
                                LeaseError::protocol(format!("no token for {key} in a won set"))
                            })?;
                        leases.push(
                            Lease::new(key.clone(), FencingToken(token), owner, ttl, sent_at)
                                .with_holder(std::sync::Arc::clone(&holder)),
                        );
                    }
                    flight.settled();
                    return Ok(TryAcquireAll::Acquired(leases));
                }
                Answer::Held(name, remaining) => {
                    let key = keys.iter().find(|k| k.as_str() == name).ok_or_else(|| {
                        LeaseError::protocol(format!("held key {name:?} not asked for"))
                    })?;
                    flight.settled();
                    return Ok(TryAcquireAll::Held {
                        key: key.clone(),
                        remaining: remaining.map(from_micros),
                    });
                }
                Answer::Raced => {
                    // Nothing was won (the statement was undone, or no row
                    // came back).
                    flight.settled();
                    tracing::debug!(
                        keys = keys.len(),
                        "a set raced a concurrent acquire; trying it again"
                    );
                }
            }
        }
        // Still racing new rows: answer the set as held for a moment, so a
        // waiter tries again soon rather than reporting an outage.
        Ok(TryAcquireAll::Held {
            key: keys[0].clone(),
            remaining: Some(Duration::from_millis(20)),
        })
    }
}

fn read_rows(rows: &[sqlx::postgres::PgRow]) -> Result<Answer, sqlx::Error> {
    let mut won = HashMap::with_capacity(rows.len());
    for row in rows {
        let taken: bool = row.try_get(0)?;
        let key: String = row.try_get(1)?;
        let n: Option<i64> = row.try_get(2)?;
        if !taken {
            return Ok(Answer::Held(key, n));
        }
        if let Some(token) = n {
            won.insert(key, token);
        }
    }
    // No row at all: every row raced, and nothing was written.
    Ok(if won.is_empty() {
        Answer::Raced
    } else {
        Answer::Won(won)
    })
}
