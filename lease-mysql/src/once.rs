//! Once-per-slot claims: exactly one caller wins each (resource, slot).

use std::sync::Arc;
use std::time::Duration;

use lease_api::backend::OwnerId;
use lease_api::claims::{CLAIM_ATTEMPTS, validate_claim_name as check_name, validate_retention};
pub use lease_api::claims::{OnceClaim, SlotHolder};
use lease_api::{FencingToken, LeaseError, Result};
use sqlx::Row;
use tokio::sync::OnceCell;

use crate::MysqlProvider;
use crate::batch::{self, bytes};
use crate::counter::{Counter, counter_table};
use crate::error::tolerate_existing;
use crate::provider::{from_micros, micros};
use crate::sql::validate_identifier;

/// The table once-claims live in unless told otherwise.
pub const CLAIMS_TABLE: &str = "lease_claims";

/// Unique claims: `claim_once(resource, slot)` returns a token to exactly
/// one caller per (resource, slot), ever, or until a retention the caller
/// chose runs out. The distributed-cron primitive: every instance of a
/// service calls it at 02:00 with slot `2026-12-04T02:00`, and one runs the
/// job. Unlike a lease, the claim does not end when the winner finishes or
/// crashes, so a slow instance that arrives after the winner's job is over
/// still cannot run it a second time.
///
/// A claim is one batch, one round trip: draw a token from the table's
/// counter row, `INSERT .. ON DUPLICATE KEY UPDATE` the slot's row
/// (`namespace, resource, slot` as the key, binary columns), read back
/// whose it is, commit. It is committed before it returns; with
/// `innodb_flush_log_at_trx_commit = 1` a database crash keeps it.
///
/// ```no_run
/// # async fn demo() -> lease_api::Result<()> {
/// use lease_mysql::{MysqlProvider, OnceClaims};
///
/// let claims = OnceClaims::new(&MysqlProvider::from_url("mysql://app@127.0.0.1/app")?);
/// if let Some(claim) = claims.claim_once("nightly-report", "2026-12-04", None).await? {
///     println!("this instance runs tonight's report (token {})", claim.token);
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct OnceClaims {
    provider: MysqlProvider,
    /// The table, quoted (and qualified when a database is named).
    table: String,
    database: Option<String>,
    name: String,
    counter: Arc<Counter>,
    migrated: Arc<OnceCell<()>>,
}

impl std::fmt::Debug for OnceClaims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnceClaims")
            .field("provider", &self.provider)
            .field("table", &self.name)
            .finish_non_exhaustive()
    }
}

impl OnceClaims {
    /// Claims in `lease_claims` of the URL's database, in `provider`'s
    /// namespace.
    pub fn new(provider: &MysqlProvider) -> Self {
        Self::build(
            provider,
            None,
            CLAIMS_TABLE,
            Counter::new(None, CLAIMS_TABLE),
        )
    }

    /// Claims in `table` of `database` (`None`: the URL's) instead.
    ///
    /// # Errors
    /// [`LeaseError::Config`] for a malformed database or table name, or a
    /// table name over 52 bytes.
    pub fn in_table(provider: &MysqlProvider, database: Option<&str>, table: &str) -> Result<Self> {
        if let Some(db) = database {
            validate_identifier("database", db)?;
        }
        validate_identifier("table", table)?;
        let counter = counter_table(database, table)?;
        Ok(Self::build(provider, database, table, counter))
    }

    fn build(
        provider: &MysqlProvider,
        database: Option<&str>,
        table: &str,
        counter: Counter,
    ) -> Self {
        let quoted = match database {
            Some(db) => format!("`{db}`.`{table}`"),
            None => format!("`{table}`"),
        };
        OnceClaims {
            provider: provider.clone(),
            table: quoted,
            database: database.map(str::to_owned),
            name: table.to_owned(),
            counter: Arc::new(counter),
            migrated: Arc::new(OnceCell::new()),
        }
    }

    /// Creates the claims table and its token counter if missing (only
    /// then: a role that may only read and write rows uses tables made for
    /// it). Happens on first use by itself.
    ///
    /// # Errors
    /// `Unavailable` when the database is down; `Denied` without the
    /// privilege to create a missing table.
    pub async fn migrate(&self) -> Result<()> {
        let t = &self.table;
        self.provider
            .bounded("the claims migration", async {
                let mut conn = self.provider.connect_session().await?;
                let there: Option<i64> = sqlx::query_scalar(
                    "SELECT 1 FROM information_schema.TABLES
                      WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?",
                )
                .bind(&self.database)
                .bind(&self.name)
                .fetch_optional(&mut conn)
                .await?;
                if there.is_none() {
                    // Binary columns: slots and resources compare byte for
                    // byte, whatever the server's default collation.
                    let create = format!(
                        "CREATE TABLE IF NOT EXISTS {t} (
                            namespace  VARBINARY(255)  NOT NULL,
                            resource   VARBINARY(1024) NOT NULL,
                            slot       VARBINARY(1024) NOT NULL,
                            token      BIGINT UNSIGNED NOT NULL,
                            holder     VARBINARY(255)  NULL,
                            claimed_at DATETIME(6)     NOT NULL,
                            expires_at DATETIME(6)     NULL,
                            claim_id   VARBINARY(32)   NULL,
                            PRIMARY KEY (namespace, resource, slot)
                        ) ENGINE=InnoDB"
                    );
                    tolerate_existing(sqlx::query(&create).execute(&mut conn).await)?;
                }
                self.counter.ensure(&mut conn, t, "token").await
            })
            .await
    }

    async fn ready(&self) -> Result<()> {
        crate::provider::in_runtime()?;
        self.migrated
            .get_or_try_init(|| self.migrate())
            .await
            .map(|_| ())
    }

    /// The batch of one claim attempt: draw, insert or take over, read back
    /// whose the slot is (by this call's claim id), commit.
    ///
    /// The `ON DUPLICATE KEY UPDATE` assigns left to right, each assignment
    /// seeing the ones before it: `token` is decided first, from the row as
    /// it was (taken over only when its retention ran out), and every later
    /// column asks whether `token` is now this attempt's fresh draw. A live
    /// row with this call's claim id is its own earlier attempt, whose
    /// answer was lost: left as it is, and read back as this call's.
    fn claim_sql(
        &self,
        resource: &str,
        slot: &str,
        retention: Option<Duration>,
        claim_id: &str,
    ) -> String {
        let t = &self.table;
        let ns = bytes(self.provider.inner.namespace.as_bytes());
        let (resource, slot) = (bytes(resource.as_bytes()), bytes(slot.as_bytes()));
        let holder = bytes(lease_api::holder().as_bytes());
        let expires = match retention {
            Some(r) => format!("UTC_TIMESTAMP(6) + INTERVAL {} MICROSECOND", micros(r)),
            None => "NULL".into(),
        };
        let won = "token <=> VALUES(token)";
        format!(
            "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION;
             {draw};
             INSERT INTO {t} (namespace, resource, slot, token, holder, claimed_at, expires_at, claim_id)
             SELECT {ns}, {resource}, {slot}, LAST_INSERT_ID(), {holder}, UTC_TIMESTAMP(6), {expires}, '{claim_id}'
               FROM DUAL WHERE LAST_INSERT_ID() > 0
             ON DUPLICATE KEY UPDATE
                token = IF(expires_at IS NOT NULL AND expires_at <= UTC_TIMESTAMP(6), VALUES(token), token),
                holder = IF({won}, VALUES(holder), holder),
                claimed_at = IF({won}, VALUES(claimed_at), claimed_at),
                claim_id = IF({won}, VALUES(claim_id), claim_id),
                expires_at = IF({won}, VALUES(expires_at), expires_at);
             SELECT (SELECT token FROM {t}
                      WHERE namespace = {ns} AND resource = {resource} AND slot = {slot}
                        AND claim_id = '{claim_id}'),
                    LAST_INSERT_ID();
             COMMIT",
            draw = self.counter.draw()
        )
    }

    /// Claims `slot` of `resource`: `Some` for exactly one caller, `None`
    /// for every other, for as long as the claim is retained (`None`:
    /// forever; else it can be claimed again once `retention` has passed
    /// on the database clock, counted from the claim: choose a retention
    /// longer than the work can take).
    ///
    /// Each call carries a claim id of its own. When an attempt's answer is
    /// lost (the connection broke, the statement timed out), the call tries
    /// again with the same id, three times in all: an attempt that did
    /// commit then answers with its own claim, never `None`.
    ///
    /// # Errors
    /// `Config` for an empty or NUL-carrying resource or slot or a zero
    /// retention; `Unavailable` when the database stays down through the
    /// attempts. After that error the claim may or may not have been made:
    /// calling again is a new claim, whose `None` may be this caller's own
    /// earlier win ([`holder`](Self::holder) shows whose).
    pub async fn claim_once(
        &self,
        resource: &str,
        slot: &str,
        retention: Option<Duration>,
    ) -> Result<Option<OnceClaim>> {
        check_name("resource", resource)?;
        check_name("slot", slot)?;
        validate_retention(retention)?;
        self.ready().await?;
        let claim_id = OwnerId::random().to_hex();
        let sql = self.claim_sql(resource, slot, retention, &claim_id);
        let mut pause = Duration::from_millis(100);
        let mut attempts = 0;
        let (token, drawn) = loop {
            attempts += 1;
            let answer = transaction!(self.provider, "claim", |conn| async {
                let rows = batch::rows(conn, &sql).await?;
                let mut out = (None, 0);
                if let Some(row) = rows.first() {
                    out = (row.try_get::<Option<u64>, _>(0)?, row.try_get::<u64, _>(1)?);
                }
                Ok(out)
            });
            match answer {
                Ok(answer) => break answer,
                Err(e) if e.is_transient() && attempts < CLAIM_ATTEMPTS => {
                    tracing::debug!(resource, slot, error = %e, "a claim's answer was lost; trying again with its id");
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
                Err(e) => return Err(e),
            }
        };
        if drawn == 0 {
            return Err(LeaseError::Config(format!(
                "the token counter of {} has no row: run OnceClaims::migrate (claimed nothing)",
                self.table
            )));
        }
        Ok(token.map(|t| OnceClaim::new(FencingToken(t))))
    }

    /// Who holds `slot` of `resource`, if it is claimed and retained.
    ///
    /// # Errors
    /// `Unavailable` when the database is down.
    pub async fn holder(&self, resource: &str, slot: &str) -> Result<Option<SlotHolder>> {
        check_name("resource", resource)?;
        check_name("slot", slot)?;
        self.ready().await?;
        let sql = format!(
            "SELECT token, holder,
                    TIMESTAMPDIFF(MICROSECOND, claimed_at, UTC_TIMESTAMP(6)),
                    TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at)
               FROM {} WHERE namespace = ? AND resource = ? AND slot = ?
                AND (expires_at IS NULL OR expires_at > UTC_TIMESTAMP(6))",
            self.table
        );
        let row = transaction!(self.provider, "claim lookup", |conn| async {
            sqlx::query(&sql)
                .bind(self.provider.inner.namespace.as_bytes())
                .bind(resource.as_bytes())
                .bind(slot.as_bytes())
                .fetch_optional(conn)
                .await
        })?;
        let Some(row) = row else { return Ok(None) };
        let decode = |e: sqlx::Error| self.provider.map_err(e);
        let token: u64 = row.try_get(0).map_err(decode)?;
        let holder: Option<Vec<u8>> = row.try_get(1).map_err(decode)?;
        let age: i64 = row.try_get(2).map_err(decode)?;
        let left: Option<i64> = row.try_get(3).map_err(decode)?;
        Ok(Some(SlotHolder::new(
            FencingToken(token),
            holder.map(|h| String::from_utf8_lossy(&h).into_owned()),
            from_micros(age),
            left.map(from_micros),
        )))
    }

    /// Takes back the claim `claim` of `slot`, when the work it was for
    /// never started (the command could not be run): the slot can be
    /// claimed again. A claim since taken over (another token) is left
    /// alone; returns whether this one was removed.
    ///
    /// # Errors
    /// `Unavailable` when the database is down.
    pub async fn unclaim(&self, resource: &str, slot: &str, claim: &OnceClaim) -> Result<bool> {
        check_name("resource", resource)?;
        check_name("slot", slot)?;
        self.ready().await?;
        let sql = format!(
            "DELETE FROM {} WHERE namespace = ? AND resource = ? AND slot = ? AND token = ?",
            self.table
        );
        let done = transaction!(self.provider, "unclaim", |conn| async {
            sqlx::query(&sql)
                .bind(self.provider.inner.namespace.as_bytes())
                .bind(resource.as_bytes())
                .bind(slot.as_bytes())
                .bind(claim.token.get())
                .execute(conn)
                .await
        })?;
        Ok(done.rows_affected() == 1)
    }

    /// Deletes this namespace's claims whose retention has run out, and
    /// returns how many went. Claims kept forever are never deleted.
    ///
    /// # Errors
    /// `Unavailable` when the database is down.
    pub async fn purge_expired(&self) -> Result<u64> {
        self.ready().await?;
        let sql = format!(
            "DELETE FROM {} WHERE namespace = ? AND expires_at <= UTC_TIMESTAMP(6)",
            self.table
        );
        let done = transaction!(self.provider, "claim purge", |conn| async {
            sqlx::query(&sql)
                .bind(self.provider.inner.namespace.as_bytes())
                .execute(conn)
                .await
        })?;
        Ok(done.rows_affected())
    }
}
