//! The MySQL/MariaDB floor: one statement per operation on a plain
//! connection, and for handoff the fastest wake MySQL has, a session's
//! `GET_LOCK` on which the waiter blocks in the server.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use leases::Result;
use sqlx::Connection;

use crate::common::{Raw, err, handoff_rounds};

/// On a plain connection, not a pool: sqlx's pool pings each connection as
/// it comes back, a second round trip the floor must not pay.
pub(crate) struct MysqlRaw {
    conn: sqlx::MySqlConnection,
    url: String,
}

const ACQUIRE: &str = "INSERT INTO lease_bench_raw (k, owner, expires) VALUES (?, ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)
     ON DUPLICATE KEY UPDATE owner = IF(expires <= UTC_TIMESTAMP(6), VALUES(owner), owner),
                             expires = IF(owner <=> VALUES(owner), VALUES(expires), expires)";

impl MysqlRaw {
    pub(crate) async fn connect(url: &str) -> Result<MysqlRaw> {
        let url = url.replacen("mariadb://", "mysql://", 1);
        let mut conn = sqlx::MySqlConnection::connect(&url).await.map_err(err)?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS lease_bench_raw (k VARBINARY(512) PRIMARY KEY, owner VARBINARY(32), expires DATETIME(6)) ENGINE=InnoDB",
        )
        .execute(&mut conn)
        .await
        .map_err(err)?;
        Ok(MysqlRaw { conn, url })
    }
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

#[async_trait]
impl Raw for MysqlRaw {
    fn name(&self) -> &'static str {
        "one upsert / update / delete statement each, via sqlx; handoff: a blocking GET_LOCK"
    }
    async fn acquire(&mut self, key: &str, ttl: Duration) -> Result<()> {
        sqlx::query(ACQUIRE)
            .bind(key.as_bytes())
            .bind("o")
            .bind(micros(ttl))
            .execute(&mut self.conn)
            .await
            .map_err(err)?;
        Ok(())
    }
    async fn extend(&mut self, key: &str, ttl: Duration) -> Result<()> {
        sqlx::query("UPDATE lease_bench_raw SET expires = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND WHERE k = ? AND owner = 'o'")
            .bind(micros(ttl))
            .bind(key.as_bytes())
            .execute(&mut self.conn)
            .await
            .map_err(err)?;
        Ok(())
    }
    async fn release(&mut self, key: &str) -> Result<()> {
        sqlx::query("DELETE FROM lease_bench_raw WHERE k = ? AND owner = 'o'")
            .bind(key.as_bytes())
            .execute(&mut self.conn)
            .await
            .map_err(err)?;
        Ok(())
    }
    /// The holder's session holds `GET_LOCK(key)`; the waiter blocks in
    /// `GET_LOCK(key, 30)` on its own session and returns the moment the
    /// holder's `RELEASE_LOCK` runs: the least a MySQL handoff can cost.
    async fn handoff(&mut self, key: &str, rounds: usize) -> Result<Option<Vec<Duration>>> {
        let name = format!("lease-bench-raw/{key}");
        let (url, n) = (self.url.clone(), name.clone());
        let waiter = move || {
            let (url, n) = (url.clone(), n.clone());
            async move {
                let mut conn = sqlx::MySqlConnection::connect(&url).await.map_err(err)?;
                let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 30)")
                    .bind(&n)
                    .fetch_one(&mut conn)
                    .await
                    .map_err(err)?;
                let t1 = Instant::now();
                if got != Some(1) {
                    return Err(err("GET_LOCK timed out"));
                }
                sqlx::query("DO RELEASE_LOCK(?)")
                    .bind(&n)
                    .execute(&mut conn)
                    .await
                    .map_err(err)?;
                Ok(t1)
            }
        };
        let conn = &mut self.conn;
        let out = handoff_rounds!(
            rounds,
            {
                sqlx::query("DO GET_LOCK(?, 5)")
                    .bind(&name)
                    .execute(&mut *conn)
                    .await
                    .map_err(err)?;
            },
            waiter,
            {
                sqlx::query("DO RELEASE_LOCK(?)")
                    .bind(&name)
                    .execute(&mut *conn)
                    .await
                    .map_err(err)?;
            }
        );
        Ok(Some(out))
    }
}
