//! Job-queue claims on the user's own table: `FOR UPDATE SKIP LOCKED`.

use std::time::Duration;

use lease_api::backend::OwnerId;
use lease_api::{FencingToken, Result};
use sqlx::Row;
use sqlx::postgres::{PgConnection, PgRow};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::PostgresProvider;
use crate::provider::micros;
use crate::sql::validate_identifier;

pub use lease_api::claims::{Completion, Outcome, QueueConfig};

/// Rows claimed together by one [`JobQueue::claim_next`]: one owner, one
/// fencing token, one visibility deadline.
#[derive(Debug)]
pub struct Claim {
    owner: OwnerId,
    token: FencingToken,
    ids: Vec<i64>,
    rows: Vec<PgRow>,
    valid_until: Instant,
}

impl Claim {
    /// The claimed rows' keys.
    pub fn ids(&self) -> &[i64] {
        &self.ids
    }

    /// The claimed rows, every column (the claim columns included), in the
    /// queue's order.
    pub fn rows(&self) -> &[PgRow] {
        &self.rows
    }

    /// True when nothing was claimed: no eligible row was free.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The claim's fencing token: greater than the token of every earlier
    /// claim of the same rows (it is drawn after the rows are locked), so a
    /// resource outside the database can refuse a worker whose rows were
    /// claimed again since.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The claim's owner id.
    pub fn owner(&self) -> OwnerId {
        self.owner
    }

    /// Until when, on this process's monotonic clock, no other worker can
    /// claim these rows: the statement's send time plus the visibility.
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }
}

struct QueueSql {
    claim: String,
    complete: String,
    extend: String,
    release: String,
    has_columns: String,
    migrate: Vec<String>,
}

/// A job queue on a table of yours: workers claim the next rows with
/// `SELECT .. FOR UPDATE SKIP LOCKED`, so concurrent workers never wait for
/// each other and never get the same row, and mark them claimed with an
/// owner, a fencing token and a visibility deadline on the database clock.
///
/// A row whose claim ran out (its worker crashed or stalled) can be claimed
/// again; completing, extending or releasing is compared by owner and token
/// in the database, so a stale worker changes nothing.
/// [`complete_in`](Self::complete_in) completes inside your own transaction,
/// so the work's writes and the completion commit together or not at all:
/// each job's effect happens exactly once.
///
/// Four columns are added to your table (`lease_owner`, `lease_token`,
/// `lease_until`, `lease_done_at`), with a sequence
/// `<table>_lease_token` for the tokens and an index of pending rows on the
/// key column.
///
/// ```no_run
/// # async fn demo() -> lease_api::Result<()> {
/// use std::time::Duration;
/// use lease_postgres::{JobQueue, PostgresProvider, QueueConfig};
///
/// let provider = PostgresProvider::from_url("postgres://app@127.0.0.1/app")?;
/// let queue = JobQueue::new(
///     &provider,
///     QueueConfig::new("payouts")
///         .filter("status = 'ready'")
///         .visibility(Duration::from_secs(60)),
/// )?;
/// loop {
///     let claim = queue.claim_next(100).await?;
///     if claim.is_empty() {
///         break;
///     }
///     // ... pay out claim.ids() ...
///     let outcome = queue.complete(&claim, claim.ids()).await?;
///     assert!(outcome.all_done(), "rows claimed again meanwhile: {:?}", outcome.stale);
/// }
/// # Ok(()) }
/// ```
pub struct JobQueue {
    provider: PostgresProvider,
    sql: QueueSql,
    visibility: Duration,
    migrate: bool,
    migrated: OnceCell<()>,
}

impl std::fmt::Debug for JobQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobQueue")
            .field("provider", &self.provider)
            .field("visibility", &self.visibility)
            .finish_non_exhaustive()
    }
}

impl JobQueue {
    /// A queue on `config`'s table, using `provider`'s connections.
    ///
    /// # Errors
    /// [`LeaseError::Config`] for a malformed schema, table or column name,
    /// a zero visibility or an empty filter or order.
    pub fn new(provider: &PostgresProvider, config: QueueConfig) -> Result<Self> {
        let schema = config.schema.as_deref().unwrap_or("public");
        validate_identifier("schema", schema)?;
        validate_identifier("table", &config.table)?;
        validate_identifier("column", &config.id_column)?;
        config.validate()?;
        let t = format!("\"{schema}\".\"{}\"", config.table);
        let id = format!("\"{}\"", config.id_column);
        let seq_name = format!("{}_lease_token", config.table);
        let seq = format!("\"{schema}\".\"{seq_name}\"");
        let filter = config.filter.as_deref().unwrap_or("true");
        let order = config.order.clone().unwrap_or_else(|| id.clone());
        let index = format!("\"{}_lease_pending\"", config.table);
        // The rows are ours while owner and token match; a claim that ran
        // out but was not claimed again may still complete.
        let ours = "lease_owner = $2 AND lease_token = $3";
        let sql = QueueSql {
            claim: format!(
                "WITH picked AS (
                    SELECT {id} FROM {t}
                     WHERE lease_done_at IS NULL
                       AND (lease_until IS NULL OR lease_until <= clock_timestamp())
                       AND ({filter})
                     ORDER BY {order}
                     LIMIT $1
                     FOR UPDATE SKIP LOCKED
                 ),
                 tok AS MATERIALIZED (
                    -- Drawn after the rows are locked: a later claim of a row
                    -- always draws after the earlier one committed. The clock
                    -- is read once too: every row of a claim runs out at the
                    -- same instant (read per row, a batch came back in parts).
                    SELECT nextval('{seq}') AS token, clock_timestamp() AS at
                      FROM (SELECT count(*) FROM picked) AS locked
                 ),
                 claimed AS (
                    UPDATE {t} AS j
                       SET lease_owner = $2, lease_token = tok.token,
                           lease_until = tok.at + $3::bigint * interval '1 microsecond'
                      FROM picked, tok
                     WHERE j.{id} = picked.{id}
                    RETURNING j.*
                 )
                 SELECT (SELECT token FROM tok) AS lease_claim_token, claimed.{id}::bigint AS lease_claim_id, claimed.*
                   FROM claimed ORDER BY {order}"
            ),
            complete: match config.completion {
                Completion::Delete => format!(
                    "DELETE FROM {t} WHERE {id} = ANY($1) AND {ours} RETURNING {id}::bigint"
                ),
                Completion::Mark => format!(
                    "UPDATE {t} SET lease_done_at = clock_timestamp(), lease_until = NULL
                      WHERE {id} = ANY($1) AND {ours} AND lease_done_at IS NULL RETURNING {id}::bigint"
                ),
            },
            extend: format!(
                "UPDATE {t} SET lease_until = (SELECT clock_timestamp()) + $4::bigint * interval '1 microsecond'
                  WHERE {id} = ANY($1) AND {ours} AND lease_done_at IS NULL RETURNING {id}::bigint"
            ),
            release: format!(
                "UPDATE {t} SET lease_owner = NULL, lease_until = NULL
                  WHERE {id} = ANY($1) AND {ours} AND lease_done_at IS NULL RETURNING {id}::bigint"
            ),
            has_columns: format!(
                "SELECT count(*) = 4 AND to_regclass('{seq}') IS NOT NULL FROM pg_attribute
                  WHERE attrelid = to_regclass('{t}') AND NOT attisdropped
                    AND attname IN ('lease_owner', 'lease_token', 'lease_until', 'lease_done_at')"
            ),
            migrate: vec![
                format!(
                    "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS lease_owner text NULL,
                       ADD COLUMN IF NOT EXISTS lease_token bigint NULL,
                       ADD COLUMN IF NOT EXISTS lease_until timestamptz NULL,
                       ADD COLUMN IF NOT EXISTS lease_done_at timestamptz NULL"
                ),
                format!("CREATE SEQUENCE IF NOT EXISTS {seq}"),
                format!("CREATE INDEX IF NOT EXISTS {index} ON {t} ({id}) WHERE lease_done_at IS NULL"),
            ],
        };
        Ok(JobQueue {
            provider: provider.clone(),
            sql,
            visibility: config.visibility,
            migrate: config.migrate,
            migrated: OnceCell::new(),
        })
    }

    /// Adds the claim columns, the token sequence and the index of pending
    /// rows if they are missing. Safe from many processes at once (under a
    /// transaction-level advisory lock); takes no lock on the table when
    /// everything is there already.
    ///
    /// # Errors
    /// `Unavailable` when the database is down; `Backend` for a missing
    /// table or privilege.
    pub async fn migrate(&self) -> Result<()> {
        let sql = &self.sql;
        let pool = self.provider.pool()?;
        self.provider
            .bounded("the queue migration", async {
                let ready: Option<bool> =
                    sqlx::query_scalar(&sql.has_columns).fetch_one(pool).await?;
                if ready == Some(true) {
                    return Ok(());
                }
                let mut tx = pool.begin().await?;
                sqlx::query("SELECT pg_advisory_xact_lock(hashtext('lease-postgres migrate'))")
                    .execute(&mut *tx)
                    .await?;
                // Another process may have migrated while we waited.
                let ready: Option<bool> = sqlx::query_scalar(&sql.has_columns)
                    .fetch_one(&mut *tx)
                    .await?;
                if ready == Some(true) {
                    return tx.commit().await;
                }
                // ALTER TABLE queues for an exclusive lock behind every open
                // transaction on the table, and every claim would queue
                // behind it: give up instead, and let the next call retry.
                sqlx::query("SET LOCAL lock_timeout = '2s'")
                    .execute(&mut *tx)
                    .await?;
                for statement in &sql.migrate {
                    sqlx::query(statement).execute(&mut *tx).await?;
                }
                tx.commit().await
            })
            .await
    }

    async fn ready(&self) -> Result<()> {
        if self.migrate {
            self.migrated.get_or_try_init(|| self.migrate()).await?;
        }
        Ok(())
    }

    /// Claims up to `limit` eligible rows nobody holds, in the queue's
    /// order, skipping rows other workers are claiming right now, for the
    /// queue's visibility timeout. An empty claim means no eligible row was
    /// free.
    ///
    /// # Errors
    /// `Unavailable` when the database is down; `Backend` for an error in
    /// the filter or order, or a missing table.
    pub async fn claim_next(&self, limit: usize) -> Result<Claim> {
        self.claim_for(limit, self.visibility).await
    }

    /// [`claim_next`](Self::claim_next) with another visibility timeout.
    ///
    /// # Errors
    /// As [`claim_next`](Self::claim_next); `Config` for a zero visibility.
    pub async fn claim_for(&self, limit: usize, visibility: Duration) -> Result<Claim> {
        lease_api::claims::validate_visibility(visibility)?;
        self.ready().await?;
        let owner = OwnerId::random();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let sent_at = Instant::now();
        let rows = self
            .provider
            .bounded(
                "claim",
                // On a connection whose server-side statement limit is the
                // response timeout: a claim the client gave up on does not
                // commit later and strand its rows. Not prepared: its
                // `RETURNING *` would break on a prepared plan once the
                // table gains a column.
                async {
                    let mut c = self.provider.conns().checkout().await?;
                    let r = sqlx::query(&self.sql.claim)
                        .persistent(false)
                        .bind(limit)
                        .bind(owner.to_hex())
                        .bind(micros(visibility))
                        .fetch_all(c.conn())
                        .await;
                    c.done(&r);
                    r
                },
            )
            .await?;
        let decode = |e: sqlx::Error| self.provider.map_err(e);
        let mut ids = Vec::with_capacity(rows.len());
        let mut token = 0;
        for row in &rows {
            ids.push(row.try_get::<i64, _>("lease_claim_id").map_err(decode)?);
            token = row.try_get::<i64, _>("lease_claim_token").map_err(decode)?;
        }
        Ok(Claim {
            owner,
            token: FencingToken(u64::try_from(token).unwrap_or(0)),
            ids,
            rows,
            valid_until: lease_api::backend::deadline_after(sent_at, visibility),
        })
    }

    async fn by_claim(
        &self,
        what: &'static str,
        statement: &str,
        claim: &Claim,
        ids: &[i64],
        visibility: Option<Duration>,
        conn: Option<&mut PgConnection>,
    ) -> Result<Outcome> {
        self.ready().await?;
        let token = i64::try_from(claim.token.get()).unwrap_or(-1);
        let mut query = sqlx::query_scalar::<_, i64>(statement)
            .bind(ids)
            .bind(claim.owner.to_hex())
            .bind(token);
        if let Some(v) = visibility {
            query = query.bind(micros(v));
        }
        let done = match conn {
            Some(c) => self.provider.bounded(what, query.fetch_all(c)).await?,
            None => {
                self.provider
                    .bounded(what, async {
                        let mut c = self.provider.conns().checkout().await?;
                        let r = query.fetch_all(c.conn()).await;
                        c.done(&r);
                        r
                    })
                    .await?
            }
        };
        Ok(Outcome::from_done(ids, done))
    }

    /// Completes the rows `ids` of `claim` (deletes or marks them, as the
    /// queue is configured). Rows that are not the claim's any more are
    /// left alone and reported stale.
    ///
    /// # Errors
    /// `Unavailable` when the database is down.
    pub async fn complete(&self, claim: &Claim, ids: &[i64]) -> Result<Outcome> {
        self.by_claim("complete", &self.sql.complete, claim, ids, None, None)
            .await
    }

    /// [`complete`](Self::complete) inside your transaction (or on your
    /// connection): commit your writes with it only when the outcome has no
    /// stale rows, and the work and its completion happen together, once.
    ///
    /// ```no_run
    /// # async fn demo(queue: lease_postgres::JobQueue, claim: lease_postgres::Claim, pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = pool.begin().await?;
    /// sqlx::query("UPDATE accounts SET paid = true WHERE payout = ANY($1)")
    ///     .bind(claim.ids())
    ///     .execute(&mut *tx)
    ///     .await?;
    /// if queue.complete_in(&mut tx, &claim, claim.ids()).await?.all_done() {
    ///     tx.commit().await?;
    /// } // else: dropped, rolled back; another worker has those rows now
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// `Unavailable` when the database is down.
    pub async fn complete_in(
        &self,
        conn: &mut PgConnection,
        claim: &Claim,
        ids: &[i64],
    ) -> Result<Outcome> {
        self.by_claim("complete", &self.sql.complete, claim, ids, None, Some(conn))
            .await
    }

    /// Pushes the visibility deadline of `claim`'s rows to database-now +
    /// `visibility`. The claim keeps only the rows it still holds and gets
    /// its new local deadline; on an error it is left as it was.
    ///
    /// # Errors
    /// `Unavailable` when the database is down; `Config` for a zero
    /// visibility.
    pub async fn extend(&self, claim: &mut Claim, visibility: Duration) -> Result<Outcome> {
        lease_api::claims::validate_visibility(visibility)?;
        let sent_at = Instant::now();
        let ids = claim.ids.clone();
        let outcome = self
            .by_claim(
                "extend",
                &self.sql.extend,
                claim,
                &ids,
                Some(visibility),
                None,
            )
            .await?;
        let rows = std::mem::take(&mut claim.rows);
        let (ids, rows): (Vec<i64>, Vec<PgRow>) = ids
            .into_iter()
            .zip(rows)
            .filter(|(id, _)| outcome.done.contains(id))
            .unzip();
        claim.ids = ids;
        claim.rows = rows;
        claim.valid_until = lease_api::backend::deadline_after(sent_at, visibility);
        Ok(outcome)
    }

    /// Gives the rows `ids` of `claim` back at once, for another worker to
    /// claim (a graceful shutdown, a job this worker cannot do).
    ///
    /// # Errors
    /// `Unavailable` when the database is down.
    pub async fn release(&self, claim: &Claim, ids: &[i64]) -> Result<Outcome> {
        self.by_claim("release", &self.sql.release, claim, ids, None, None)
            .await
    }
}
