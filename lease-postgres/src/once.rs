//! Once-per-slot claims: exactly one caller wins each (resource, slot).

use std::time::Duration;

use lease_api::claims::{CLAIM_ATTEMPTS, validate_claim_name as check_name};
pub use lease_api::claims::{OnceClaim, SlotHolder};
use lease_api::{FencingToken, Result};
use sqlx::Row;
use tokio::sync::OnceCell;

use crate::PostgresProvider;
use crate::provider::micros;
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
/// A claim is one `INSERT .. ON CONFLICT` in a table of its own
/// (`namespace, resource, slot` as the key), committed before it returns:
/// a database crash keeps it (with `fsync` and `synchronous_commit` on).
///
/// ```no_run
/// # async fn demo() -> lease_api::Result<()> {
/// use lease_postgres::{OnceClaims, PostgresProvider};
///
/// let claims = OnceClaims::new(&PostgresProvider::from_url("postgres://app@127.0.0.1/app")?);
/// if let Some(claim) = claims.claim_once("nightly-report", "2026-12-04", None).await? {
///     println!("this instance runs tonight's report (token {})", claim.token);
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct OnceClaims {
    provider: PostgresProvider,
    claim: String,
    claim_without_id: String,
    holder: String,
    purge: String,
    unclaim: String,
    exists: String,
    has_claim_id: String,
    migrate: Vec<String>,
    add_claim_id: String,
    /// Whether the table has claim ids, once migrated (or found as it is).
    migrated: std::sync::Arc<OnceCell<bool>>,
}

impl std::fmt::Debug for OnceClaims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnceClaims")
            .field("provider", &self.provider)
            .finish_non_exhaustive()
    }
}

impl OnceClaims {
    /// Claims in `public.lease_claims`, in `provider`'s namespace.
    pub fn new(provider: &PostgresProvider) -> Self {
        Self::build(provider, "public", CLAIMS_TABLE)
    }

    /// Claims in `schema.table` instead.
    ///
    /// # Errors
    /// [`LeaseError::Config`] for a malformed schema or table name.
    pub fn in_table(provider: &PostgresProvider, schema: &str, table: &str) -> Result<Self> {
        validate_identifier("schema", schema)?;
        validate_identifier("table", table)?;
        Ok(Self::build(provider, schema, table))
    }

    fn build(provider: &PostgresProvider, schema: &str, table: &str) -> Self {
        let t = format!("\"{schema}\".\"{table}\"");
        let seq = format!("\"{schema}\".\"{table}_token\"");
        let create_schema = (schema != "public")
            .then(|| format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""))
            .into_iter();
        OnceClaims {
            provider: provider.clone(),
            // A row whose retention ran out is taken over in place; the
            // sequence is drawn on conflicts too, which only leaves gaps. A
            // live row with this call's claim id ($6) and holder is its own
            // earlier attempt, whose answer was lost: it answers with that
            // row, unchanged (and waits for that attempt if it still runs).
            claim: {
                let own = "(c.claim_id = EXCLUDED.claim_id AND c.holder = EXCLUDED.holder \
                           AND (c.expires_at IS NULL OR c.expires_at > clock_timestamp()))";
                format!(
                    "INSERT INTO {t} AS c (namespace, resource, slot, token, holder, claimed_at, expires_at, claim_id)
                     VALUES ($1, $2, $3, nextval('{seq}'), $4, clock_timestamp(),
                             clock_timestamp() + $5::bigint * interval '1 microsecond', $6)
                     ON CONFLICT (namespace, resource, slot) DO UPDATE
                        SET token = CASE WHEN {own} THEN c.token ELSE EXCLUDED.token END,
                            holder = CASE WHEN {own} THEN c.holder ELSE EXCLUDED.holder END,
                            claimed_at = CASE WHEN {own} THEN c.claimed_at ELSE EXCLUDED.claimed_at END,
                            expires_at = CASE WHEN {own} THEN c.expires_at ELSE EXCLUDED.expires_at END,
                            claim_id = EXCLUDED.claim_id
                      WHERE {own}
                         OR (c.expires_at IS NOT NULL AND c.expires_at <= clock_timestamp())
                     RETURNING c.token"
                )
            },
            // Before claim ids (a table this role cannot add the column to).
            claim_without_id: format!(
                "INSERT INTO {t} AS c (namespace, resource, slot, token, holder, claimed_at, expires_at)
                 VALUES ($1, $2, $3, nextval('{seq}'), $4, clock_timestamp(),
                         clock_timestamp() + $5::bigint * interval '1 microsecond')
                 ON CONFLICT (namespace, resource, slot) DO UPDATE
                    SET token = EXCLUDED.token, holder = EXCLUDED.holder,
                        claimed_at = EXCLUDED.claimed_at, expires_at = EXCLUDED.expires_at
                  WHERE c.expires_at IS NOT NULL AND c.expires_at <= clock_timestamp()
                 RETURNING c.token"
            ),
            holder: format!(
                "SELECT token, holder,
                        (extract(epoch from (clock_timestamp() - claimed_at)) * 1000000)::bigint,
                        (extract(epoch from (expires_at - clock_timestamp())) * 1000000)::bigint
                   FROM {t} WHERE namespace = $1 AND resource = $2 AND slot = $3
                    AND (expires_at IS NULL OR expires_at > clock_timestamp())"
            ),
            purge: format!(
                "DELETE FROM {t} WHERE namespace = $1 AND expires_at <= clock_timestamp()"
            ),
            unclaim: format!(
                "DELETE FROM {t} WHERE namespace = $1 AND resource = $2 AND slot = $3 AND token = $4"
            ),
            // A role that may only read and write rows can use an existing
            // table: the DDL runs only when something is missing.
            exists: format!(
                "SELECT to_regclass('{}') IS NOT NULL AND to_regclass('{}') IS NOT NULL",
                t.replace('\'', "''"),
                seq.replace('\'', "''")
            ),
            has_claim_id: format!(
                "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('{}')
                                   AND attname = 'claim_id' AND NOT attisdropped)",
                t.replace('\'', "''"),
            ),
            // Tables made before claims had ids get the column.
            add_claim_id: format!("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS claim_id text NULL"),
            migrate: create_schema
                .chain([
                    format!(
                        "CREATE TABLE IF NOT EXISTS {t} (
                            namespace  text        NOT NULL,
                            resource   text        NOT NULL,
                            slot       text        NOT NULL,
                            token      bigint      NOT NULL,
                            holder     text        NULL,
                            claimed_at timestamptz NOT NULL,
                            expires_at timestamptz NULL,
                            PRIMARY KEY (namespace, resource, slot)
                        )"
                    ),
                    format!("CREATE SEQUENCE IF NOT EXISTS {seq}"),
                ])
                .collect(),
            migrated: std::sync::Arc::new(OnceCell::new()),
        }
    }

    /// Creates the claims table and its token sequence if missing, and adds
    /// the claim id column to a table made before it (on first use by
    /// itself).
    ///
    /// # Errors
    /// `Unavailable` when the database is down; `Backend` without the privilege.
    pub async fn migrate(&self) -> Result<()> {
        let pool = self.provider.pool()?;
        self.provider
            .bounded("the claims migration", async {
                let there: Option<bool> = sqlx::query_scalar(&self.exists).fetch_one(pool).await?;
                let has_id: Option<bool> = sqlx::query_scalar(&self.has_claim_id)
                    .fetch_one(pool)
                    .await?;
                if there == Some(true) && has_id == Some(true) {
                    return Ok(());
                }
                let mut tx = pool.begin().await?;
                sqlx::query("SELECT pg_advisory_xact_lock(hashtext('lease-postgres migrate'))")
                    .execute(&mut *tx)
                    .await?;
                for statement in self.migrate.iter().chain([&self.add_claim_id]) {
                    sqlx::query(statement).execute(&mut *tx).await?;
                }
                tx.commit().await
            })
            .await
    }

    /// Migrates on first use; whether the table has claim ids. A role that
    /// may only read and write rows uses an older table as it is (its claims
    /// then carry no id: a lost answer is an error, as before ids).
    async fn ready(&self) -> Result<bool> {
        let with_ids = self
            .migrated
            .get_or_try_init(|| async {
                let Err(e) = self.migrate().await else {
                    return Ok(true);
                };
                let pool = self.provider.pool()?;
                let (there, has_id) = self
                    .provider
                    .bounded("the claims table lookup", async {
                        let there: Option<bool> =
                            sqlx::query_scalar(&self.exists).fetch_one(pool).await?;
                        let has_id: Option<bool> = sqlx::query_scalar(&self.has_claim_id)
                            .fetch_one(pool)
                            .await?;
                        Ok((there, has_id))
                    })
                    .await?;
                if there != Some(true) {
                    return Err(e);
                }
                tracing::warn!(error = %e, "could not migrate the claims table; using it as it is");
                Ok(has_id == Some(true))
            })
            .await?;
        Ok(*with_ids)
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
        lease_api::claims::validate_retention(retention)?;
        let with_ids = self.ready().await?;
        let claim_id = lease_api::backend::OwnerId::random().to_hex();
        let (statement, attempts_allowed) = if with_ids {
            (&self.claim, CLAIM_ATTEMPTS)
        } else {
            (&self.claim_without_id, 1)
        };
        let mut pause = Duration::from_millis(100);
        let mut attempts = 0;
        let token: Option<i64> = loop {
            attempts += 1;
            // On a connection with a server-side statement limit: a claim the
            // client gave up on does not commit later, unseen; and an attempt
            // after it waits for it if it is still running (the same row).
            let answer = self
                .provider
                .bounded("claim", async {
                    let mut c = self.provider.conns().checkout().await?;
                    let holder = lease_api::holder();
                    let mut q = sqlx::query_scalar(statement)
                        .bind(self.provider.namespace_str())
                        .bind(resource)
                        .bind(slot)
                        .bind(&*holder)
                        .bind(retention.map(micros));
                    if with_ids {
                        q = q.bind(&claim_id);
                    }
                    let r = q.fetch_optional(c.conn()).await;
                    c.done(&r);
                    r
                })
                .await;
            match answer {
                Ok(token) => break token,
                Err(e) if e.is_transient() && attempts < attempts_allowed => {
                    tracing::debug!(resource, slot, error = %e, "a claim's answer was lost; trying again with its id");
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
                Err(e) => return Err(e),
            }
        };
        Ok(token.map(|t| OnceClaim::new(FencingToken(u64::try_from(t).unwrap_or(0)))))
    }

    /// Who holds `slot` of `resource`, if it is claimed and retained.
    ///
    /// # Errors
    /// `Unavailable` when the database is down.
    pub async fn holder(&self, resource: &str, slot: &str) -> Result<Option<SlotHolder>> {
        check_name("resource", resource)?;
        check_name("slot", slot)?;
        self.ready().await?;
        let row = self
            .provider
            .bounded(
                "claim lookup",
                sqlx::query(&self.holder)
                    .bind(self.provider.namespace_str())
                    .bind(resource)
                    .bind(slot)
                    .fetch_optional(self.provider.pool()?),
            )
            .await?;
        let Some(row) = row else { return Ok(None) };
        let decode = |e: sqlx::Error| self.provider.map_err(e);
        let token: i64 = row.try_get(0).map_err(decode)?;
        let age: i64 = row.try_get(2).map_err(decode)?;
        let left: Option<i64> = row.try_get(3).map_err(decode)?;
        Ok(Some(SlotHolder::new(
            FencingToken(u64::try_from(token).unwrap_or(0)),
            row.try_get(1).map_err(decode)?,
            crate::provider::from_micros(age),
            left.map(crate::provider::from_micros),
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
        let token = i64::try_from(claim.token.get()).unwrap_or(-1);
        let done = self
            .provider
            .bounded("unclaim", async {
                let mut c = self.provider.conns().checkout().await?;
                let r = sqlx::query(&self.unclaim)
                    .bind(self.provider.namespace_str())
                    .bind(resource)
                    .bind(slot)
                    .bind(token)
                    .execute(c.conn())
                    .await;
                c.done(&r);
                r
            })
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Deletes this namespace's claims whose retention has run out, and
    /// returns how many went. Claims kept forever are never deleted.
    ///
    /// # Errors
    /// `Unavailable` when the database is down.
    pub async fn purge_expired(&self) -> Result<u64> {
        self.ready().await?;
        let done = self
            .provider
            .bounded(
                "claim purge",
                sqlx::query(&self.purge)
                    .bind(self.provider.namespace_str())
                    .execute(self.provider.pool()?),
            )
            .await?;
        Ok(done.rows_affected())
    }
}
