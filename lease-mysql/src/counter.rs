//! The token counters of the claims: a one-row table per claims table,
//! whose row is bumped with `LAST_INSERT_ID(v + 1)` inside the claim's
//! transaction. MySQL has no sequences (MariaDB's are not MySQL's), and an
//! `AUTO_INCREMENT` draw is neither ordered by commit nor, on Galera, by
//! node; a counter row locked until the claim commits is both.

use lease_api::{LeaseError, Result};
use sqlx::mysql::MySqlConnection;

use crate::error::tolerate_existing;

/// A claims table's token counter.
#[derive(Debug)]
pub(crate) struct Counter {
    /// The counter table, quoted (and qualified when a database is named).
    table: String,
    database: Option<String>,
    name: String,
}

/// The counter of `table`: `<table>_lease_token`, in the same database.
///
/// # Errors
/// `Config` when the name would pass MySQL's 64-byte limit (a table name
/// over 52 bytes).
pub(crate) fn counter_table(database: Option<&str>, table: &str) -> Result<Counter> {
    let name = format!("{table}_lease_token");
    if name.len() > 64 {
        return Err(LeaseError::Config(format!(
            "invalid table {table:?} for claims: at most 52 bytes, so that its token counter `{name}` fits MySQL's 64"
        )));
    }
    Ok(Counter::new(database, table))
}

impl Counter {
    /// The counter of `table`, unchecked: for names known to fit.
    pub(crate) fn new(database: Option<&str>, table: &str) -> Self {
        let name = format!("{table}_lease_token");
        let quoted = match database {
            Some(db) => format!("`{db}`.`{name}`"),
            None => format!("`{name}`"),
        };
        Counter {
            table: quoted,
            database: database.map(str::to_owned),
            name,
        }
    }

    /// The statements that draw the next token into `LAST_INSERT_ID()`,
    /// for a batch inside a transaction: 0 when the counter row is missing
    /// (so a claim writes nothing rather than a token from before).
    pub(crate) fn draw(&self) -> String {
        format!(
            "DO LAST_INSERT_ID(0); UPDATE {} SET v = LAST_INSERT_ID(v + 1) WHERE id = 1",
            self.table
        )
    }

    /// Creates the counter table and its row if missing, the row starting
    /// at the greatest token in `column` of `claims` (a quoted table), so a
    /// lost counter never hands a token out again.
    pub(crate) async fn ensure(
        &self,
        conn: &mut MySqlConnection,
        claims: &str,
        column: &str,
    ) -> Result<(), sqlx::Error> {
        let there: Option<i64> = sqlx::query_scalar(
            "SELECT 1 FROM information_schema.TABLES
              WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?",
        )
        .bind(&self.database)
        .bind(&self.name)
        .fetch_optional(&mut *conn)
        .await?;
        if there.is_none() {
            let create = format!(
                "CREATE TABLE IF NOT EXISTS {} (
                    id TINYINT UNSIGNED NOT NULL PRIMARY KEY,
                    v  BIGINT UNSIGNED  NOT NULL
                 ) ENGINE=InnoDB",
                self.table
            );
            tolerate_existing(sqlx::query(&create).execute(&mut *conn).await)?;
        }
        let row: Option<u64> =
            sqlx::query_scalar(&format!("SELECT v FROM {} WHERE id = 1", self.table))
                .fetch_optional(&mut *conn)
                .await?;
        if row.is_none() {
            let seed: Option<u64> = sqlx::query_scalar(&format!(
                "SELECT CAST(COALESCE(MAX({column}), 0) AS UNSIGNED) FROM {claims}"
            ))
            .fetch_one(&mut *conn)
            .await?;
            sqlx::query(&format!(
                "INSERT IGNORE INTO {} (id, v) VALUES (1, ?)",
                self.table
            ))
            .bind(seed.unwrap_or(0))
            .execute(&mut *conn)
            .await?;
        }
        Ok(())
    }
}
