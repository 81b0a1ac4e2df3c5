//! Job-queue claims on the user's own table: `FOR UPDATE SKIP LOCKED`.

use std::time::Duration;

use lease_api::backend::OwnerId;
use lease_api::claims::validate_visibility;
pub use lease_api::claims::{Completion, Outcome, QueueConfig};
use lease_api::{FencingToken, LeaseError, Result};
use sqlx::mysql::{MySql, MySqlRow};
use sqlx::{Row, Transaction};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::MysqlProvider;
use crate::batch;
use crate::counter::{Counter, counter_table};
use crate::error::tolerate_existing;
use crate::provider::micros;
use crate::sql::validate_identifier;

/// Rows claimed together by one [`JobQueue::claim_next`]: one owner, one
/// fencing token, one visibility deadline.
#[derive(Debug)]
pub struct Claim {
    owner: OwnerId,
    token: FencingToken,
    ids: Vec<i64>,
    rows: Vec<MySqlRow>,
    valid_until: Instant,
}

impl Claim {
    /// The claimed rows' keys.
    pub fn ids(&self) -> &[i64] {
        &self.ids
    }

    /// The claimed rows, every column (the claim columns included), in the
    /// queue's order.
    pub fn rows(&self) -> &[MySqlRow] {
        &self.rows
    }

    /// True when nothing was claimed: no eligible row was free.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The claim's fencing token: greater than the token of every claim of
    /// this queue committed before it (it is drawn from the queue's counter
    /// row after the rows are locked, and the counter row stays locked until
    /// the claim commits), so a resource outside the database can refuse a
    /// worker whose rows were claimed again since.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The claim's owner id.
    pub fn owner(&self) -> OwnerId {
        self.owner
    }

    /// Until when, on this process's monotonic clock, no other worker can
    /// claim these rows: the claim's send time plus the visibility.
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }
}

/// What `by_claim` runs: the condition a row of the claim must still meet,
/// and what to do to the rows that do.
#[derive(Clone, Copy)]
enum Change {
    Complete,
    Extend(Duration),
    Release,
}

/// A job queue on a table of yours: workers claim the next rows with
/// `SELECT .. FOR UPDATE SKIP LOCKED`, so concurrent workers never wait for
/// each other and never get the same row, and mark them claimed with an
/// owner, a fencing token and a visibility deadline on the database clock.
///
/// A claim is two round trips: one locks the next free rows (skipping
/// rows other workers are claiming), one draws the token, marks the rows
/// and commits, in one batch. A row whose claim ran out (its worker crashed
/// or stalled) can be claimed again; completing, extending or releasing is
/// compared by owner and token in the database, so a stale worker changes
/// nothing. [`complete_in`](Self::complete_in) completes inside your own
/// transaction, so the work's writes and the completion commit together or
/// not at all: each job's effect happens exactly once.
///
/// Four columns are added to your table (`lease_owner`, `lease_token`,
/// `lease_until`, `lease_done_at`), with an index `lease_pending` on
/// (`lease_done_at`, key) and a one-row table `<table>_lease_token` holding
/// the token counter.
///
/// On Galera, keep every worker on one node (the provider's host list does
/// this): `SKIP LOCKED` sees only its own node's locks, and claims made
/// through two nodes at once are not shown safe.
///
/// ```no_run
/// # async fn demo() -> lease_api::Result<()> {
/// use std::time::Duration;
/// use lease_mysql::{JobQueue, MysqlProvider, QueueConfig};
///
/// let provider = MysqlProvider::from_url("mysql://app@127.0.0.1/app")?;
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
    provider: MysqlProvider,
    /// The table, quoted (and qualified when the config names a database).
    table: String,
    /// The key column, quoted.
    id: String,
    config: QueueConfig,
    order: String,
    counter: Counter,
    /// Whether the index of pending rows is there, once migrated.
    migrated: OnceCell<bool>,
}

impl std::fmt::Debug for JobQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobQueue")
            .field("provider", &self.provider)
            .field("table", &self.config.table)
            .field("visibility", &self.config.visibility)
            .finish_non_exhaustive()
    }
}

/// How long [`JobQueue::migrate`] may take: adding the index of pending
/// rows to a large table is not a quick statement.
pub const MIGRATION_LIMIT: Duration = Duration::from_secs(300);

/// Whether `column` is among `columns` (name, data type) with an integer
/// type (`tinyint` .. `bigint`).
fn integer_key(columns: &[(String, String)], column: &str) -> bool {
    columns.iter().any(|(name, ty)| {
        name.eq_ignore_ascii_case(column)
            && matches!(
                ty.to_ascii_lowercase().as_str(),
                "tinyint" | "smallint" | "mediumint" | "int" | "integer" | "bigint"
            )
    })
}

/// The first column of every row, as keys.
fn ints(rows: &[MySqlRow]) -> Result<Vec<i64>, sqlx::Error> {
    rows.iter().map(|r| r.try_get::<i64, _>(0)).collect()
}

/// `ids` as an SQL list (integers: nothing to escape).
fn id_list(ids: &[i64]) -> String {
    let mut out = String::with_capacity(ids.len() * 8);
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&id.to_string());
    }
    out
}

impl JobQueue {
    /// A queue on `config`'s table, using `provider`'s connections.
    ///
    /// # Errors
    /// [`LeaseError::Config`] for a malformed database, table or column
    /// name, a table name over 52 bytes, a zero visibility or an empty
    /// filter or order.
    pub fn new(provider: &MysqlProvider, config: QueueConfig) -> Result<Self> {
        if let Some(db) = &config.schema {
            validate_identifier("database", db)?;
        }
        validate_identifier("table", &config.table)?;
        validate_identifier("column", &config.id_column)?;
        config.validate()?;
        let counter = counter_table(config.schema.as_deref(), &config.table)?;
        let table = match &config.schema {
            Some(db) => format!("`{db}`.`{}`", config.table),
            None => format!("`{}`", config.table),
        };
        let id = format!("`{}`", config.id_column);
        let order = config.order.clone().unwrap_or_else(|| id.clone());
        Ok(JobQueue {
            provider: provider.clone(),
            table,
            id,
            order,
            counter,
            config,
            migrated: OnceCell::new(),
        })
    }

    /// Adds the claim columns, the index of pending rows and the token
    /// counter if they are missing (each piece only when missing: on Galera
    /// every DDL statement runs on all nodes in total order). Safe from many
    /// processes at once. It waits at most 2 s for the table's metadata lock
    /// behind open transactions (and fails rather than stall the claims),
    /// and up to [`MIGRATION_LIMIT`] for the work itself: adding the index
    /// to a large table takes a while (online, writes go on).
    ///
    /// # Errors
    /// `Backend` for a missing table; `Config` for a key column that is not
    /// an integer; `Unavailable` when the database is down; `Denied`
    /// without the privilege.
    pub async fn migrate(&self) -> Result<()> {
        let (t, id) = (&self.table, &self.id);
        let columns = [
            ("lease_owner", "VARBINARY(32) NULL"),
            ("lease_token", "BIGINT UNSIGNED NULL"),
            ("lease_until", "DATETIME(6) NULL"),
            ("lease_done_at", "DATETIME(6) NULL"),
        ];
        let present = lease_api::backend::bounded(
            "the queue migration",
            MIGRATION_LIMIT,
            async {
                let mut conn = self.provider.connect_session().await?;
                let present: Vec<(String, String)> = sqlx::query_as(
                    "SELECT CAST(COLUMN_NAME AS CHAR), CAST(DATA_TYPE AS CHAR)
                       FROM information_schema.COLUMNS
                      WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?",
                )
                .bind(&self.config.schema)
                .bind(&self.config.table)
                .fetch_all(&mut conn)
                .await?;
                if present.is_empty() {
                    // No table: the server says so, in its own words (1146).
                    sqlx::query(&format!("SELECT 1 FROM {t} LIMIT 0"))
                        .execute(&mut conn)
                        .await?;
                }
                if !integer_key(&present, &self.config.id_column) {
                    return Ok(present);
                }
                // ALTER TABLE waits for every open transaction on the table,
                // and every claim would queue behind it: give up instead. The
                // work itself may take longer than a statement may.
                sqlx::query("SET SESSION lock_wait_timeout = 2 /*M!, max_statement_time = 0 */")
                    .execute(&mut conn)
                    .await?;
                for (name, ty) in columns {
                    if !present.iter().any(|(p, _)| p.eq_ignore_ascii_case(name)) {
                        let add = format!("ALTER TABLE {t} ADD COLUMN `{name}` {ty}");
                        tolerate_existing(sqlx::query(&add).execute(&mut conn).await)?;
                    }
                }
                if !self.has_index(&mut conn).await? {
                    let add = format!(
                        "ALTER TABLE {t} ADD INDEX `lease_pending` (`lease_done_at`, {id})"
                    );
                    tolerate_existing(sqlx::query(&add).execute(&mut conn).await)?;
                }
                self.counter.ensure(&mut conn, t, "lease_token").await?;
                Ok(present)
            },
            |e| self.provider.map_err(e),
        )
        .await?;
        if !integer_key(&present, &self.config.id_column) {
            return Err(LeaseError::Config(format!(
                "the job table {t} has no integer key column {id}: a job queue's key must be an integer type"
            )));
        }
        Ok(())
    }

    /// Whether the table has the index of pending rows.
    /// Whether the table has the index of pending rows: `lease_pending` on
    /// (`lease_done_at`, key), not only an index of that name.
    async fn has_index(&self, conn: &mut sqlx::MySqlConnection) -> Result<bool, sqlx::Error> {
        let columns: Vec<String> = sqlx::query_scalar(
            "SELECT CAST(COLUMN_NAME AS CHAR) FROM information_schema.STATISTICS
              WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?
                AND INDEX_NAME = 'lease_pending' ORDER BY SEQ_IN_INDEX",
        )
        .bind(&self.config.schema)
        .bind(&self.config.table)
        .fetch_all(&mut *conn)
        .await?;
        Ok(columns.len() >= 2
            && columns[0].eq_ignore_ascii_case("lease_done_at")
            && columns[1].eq_ignore_ascii_case(&self.config.id_column))
    }

    /// Migrates on first use (unless told not to); whether the index of
    /// pending rows is there, which decides how rows are picked.
    async fn ready(&self) -> Result<bool> {
        crate::provider::in_runtime()?;
        let indexed = self
            .migrated
            .get_or_try_init(|| async {
                if self.config.migrate {
                    self.migrate().await?;
                }
                transaction!(self.provider, "the queue's index lookup", |conn| async {
                    self.has_index(conn).await
                })
            })
            .await?;
        Ok(*indexed)
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
        self.claim_for(limit, self.config.visibility).await
    }

    /// [`claim_next`](Self::claim_next) with another visibility timeout.
    ///
    /// # Errors
    /// As [`claim_next`](Self::claim_next); `Config` for a zero visibility.
    pub async fn claim_for(&self, limit: usize, visibility: Duration) -> Result<Claim> {
        validate_visibility(visibility)?;
        let indexed = self.ready().await?;
        let owner = OwnerId::random();
        let (t, id, order) = (&self.table, &self.id, &self.order);
        let filter = self.config.filter.as_deref().unwrap_or("TRUE");
        let eligible = format!(
            "lease_done_at IS NULL AND (lease_until IS NULL OR lease_until <= UTC_TIMESTAMP(6)) AND ({filter})"
        );
        // READ COMMITTED: rows a locking read looks at but does not take
        // (they fail the filter) are unlocked at once, and no gap is locked
        // against new jobs.
        let begin = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION";
        // InnoDB locks every row a locking read reads before it sorts: an
        // `ORDER BY .. LIMIT n FOR UPDATE` that needs a sort locks every
        // eligible row. Only a scan in the key's index order, which stops at
        // the limit, locks just the rows it takes; any other order is taken
        // in windows (see `pick_in_windows`).
        let by_index = self.config.order.is_none() && indexed;
        let pick = format!(
            "{begin}; SELECT CAST({id} AS SIGNED) FROM {t} FORCE INDEX (`lease_pending`)
              WHERE {eligible} ORDER BY {id} LIMIT {limit} FOR UPDATE SKIP LOCKED"
        );
        let owner_hex = owner.to_hex();
        let visibility_us = micros(visibility);
        let sent_at = Instant::now();
        let (ids, rows) = transaction!(self.provider, "claim", |conn| async {
            let ids = if by_index {
                ints(&batch::rows(conn, &pick).await?)?
            } else {
                batch::rows(conn, begin).await?;
                self.pick_in_windows(conn, &eligible, limit).await?
            };
            if ids.is_empty() {
                batch::rows(conn, "ROLLBACK").await?;
                return Ok((ids, Vec::new()));
            }
            let list = id_list(&ids);
            // The token is drawn after the rows are locked, and the
            // counter row stays locked until the commit that ends the
            // batch: a later claim of a row draws a greater token. The
            // first row answered is the draw (0: no counter row).
            let take = format!(
                "{draw}; SELECT LAST_INSERT_ID() AS lease_claim_draw;
                 UPDATE {t} SET lease_owner = '{owner_hex}', lease_token = LAST_INSERT_ID(),
                        lease_until = UTC_TIMESTAMP(6) + INTERVAL {visibility_us} MICROSECOND
                  WHERE {id} IN ({list}) AND {eligible} AND LAST_INSERT_ID() > 0;
                 SELECT CAST({id} AS SIGNED) AS lease_claim_id, {t}.* FROM {t}
                  WHERE {id} IN ({list}) AND lease_owner = '{owner_hex}'
                  ORDER BY {order};
                 COMMIT",
                draw = self.counter.draw()
            );
            let rows = batch::rows(conn, &take).await?;
            Ok((ids, rows))
        })?;
        let mut rows = rows;
        if rows.is_empty() {
            return Ok(Claim {
                owner,
                token: FencingToken(0),
                ids,
                rows,
                valid_until: lease_api::backend::deadline_after(sent_at, visibility),
            });
        }
        let draw = rows.remove(0);
        let decode = |e: sqlx::Error| self.provider.map_err(e);
        if draw.try_get::<u64, _>(0).map_err(decode)? == 0 {
            return Err(LeaseError::Config(format!(
                "the token counter of {} has no row: run JobQueue::migrate (claimed nothing)",
                self.table
            )));
        }
        let decode = |e: sqlx::Error| self.provider.map_err(e);
        let mut claimed = Vec::with_capacity(rows.len());
        let mut token = 0;
        for row in &rows {
            claimed.push(row.try_get::<i64, _>("lease_claim_id").map_err(decode)?);
            token = row.try_get::<u64, _>("lease_token").map_err(decode)?;
        }
        Ok(Claim {
            owner,
            token: FencingToken(token),
            ids: claimed,
            rows,
            valid_until: lease_api::backend::deadline_after(sent_at, visibility),
        })
    }

    /// Picks up to `limit` eligible rows in the queue's order, locking only
    /// those: reads the next window of eligible keys in order (a plain
    /// read, no locks), then locks the ones still eligible and not being
    /// claimed by another worker (`SKIP LOCKED` by key), and moves on to
    /// the next window until it has `limit` rows or no eligible row is left.
    async fn pick_in_windows(
        &self,
        conn: &mut sqlx::MySqlConnection,
        eligible: &str,
        limit: usize,
    ) -> Result<Vec<i64>, sqlx::Error> {
        let (t, id, order) = (&self.table, &self.id, &self.order);
        let mut picked = Vec::new();
        // Keys already looked at, taken or not: left out of the next window
        // (not skipped by an offset, which would count rows that others'
        // commits have since made ineligible).
        let mut seen: Vec<i64> = Vec::new();
        while picked.len() < limit {
            let want = limit - picked.len();
            let unseen = if seen.is_empty() {
                String::new()
            } else {
                format!(" AND {id} NOT IN ({})", id_list(&seen))
            };
            // The key breaks ties: the same rows in the same order each time.
            let window = ints(
                &batch::rows(
                    conn,
                    &format!(
                        "SELECT CAST({id} AS SIGNED) FROM {t} WHERE {eligible}{unseen}
                          ORDER BY {order}, {id} LIMIT {want}"
                    ),
                )
                .await?,
            )?;
            if window.is_empty() {
                break;
            }
            let locked: std::collections::HashSet<i64> = ints(
                &batch::rows(
                    conn,
                    &format!(
                        "SELECT CAST({id} AS SIGNED) FROM {t}
                          WHERE {id} IN ({}) AND {eligible} FOR UPDATE SKIP LOCKED",
                        id_list(&window)
                    ),
                )
                .await?,
            )?
            .into_iter()
            .collect();
            seen.extend(&window);
            picked.extend(window.into_iter().filter(|i| locked.contains(i)));
        }
        Ok(picked)
    }

    /// The statements for `change` on the rows `ids` of `claim`: lock the
    /// rows still the claim's and list them, then change exactly those.
    fn by_claim_sql(&self, change: Change, claim: &Claim, ids: &[i64]) -> String {
        let (t, id) = (&self.table, &self.id);
        let list = id_list(ids);
        let owner = claim.owner.to_hex();
        let token = claim.token.get();
        let mut ours =
            format!("{id} IN ({list}) AND lease_owner = '{owner}' AND lease_token = {token}");
        // A claim that ran out but was not claimed again may still
        // complete; a completed row is not extended or released.
        if !matches!(
            (change, self.config.completion),
            (Change::Complete, Completion::Delete)
        ) {
            ours.push_str(" AND lease_done_at IS NULL");
        }
        let write = match (change, self.config.completion) {
            (Change::Complete, Completion::Delete) => format!("DELETE FROM {t} WHERE {ours}"),
            (Change::Complete, Completion::Mark) => format!(
                "UPDATE {t} SET lease_done_at = UTC_TIMESTAMP(6), lease_until = NULL WHERE {ours}"
            ),
            (Change::Extend(v), _) => format!(
                "UPDATE {t} SET lease_until = UTC_TIMESTAMP(6) + INTERVAL {} MICROSECOND WHERE {ours}",
                micros(v)
            ),
            (Change::Release, _) => {
                format!("UPDATE {t} SET lease_owner = NULL, lease_until = NULL WHERE {ours}")
            }
        };
        format!("SELECT CAST({id} AS SIGNED) FROM {t} WHERE {ours} FOR UPDATE; {write}")
    }

    async fn by_claim(
        &self,
        what: &'static str,
        change: Change,
        claim: &Claim,
        ids: &[i64],
        tx: Option<&mut Transaction<'_, MySql>>,
    ) -> Result<Outcome> {
        self.ready().await?;
        if ids.is_empty() {
            return Ok(Outcome::default());
        }
        let sql = self.by_claim_sql(change, claim, ids);
        let rows = match tx {
            // In the caller's transaction: it commits or rolls back.
            Some(tx) => self.provider.bounded(what, batch::rows(tx, &sql)).await?,
            None => {
                let sql = format!(
                    "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION; {sql}; COMMIT"
                );
                transaction!(self.provider, what, |conn| async {
                    batch::rows(conn, &sql).await
                })?
            }
        };
        let decode = |e: sqlx::Error| self.provider.map_err(e);
        let done = rows
            .iter()
            .map(|r| r.try_get::<i64, _>(0).map_err(decode))
            .collect::<Result<Vec<i64>>>()?;
        Ok(Outcome::from_done(ids, done))
    }

    /// Completes the rows `ids` of `claim` (deletes or marks them, as the
    /// queue is configured). Rows that are not the claim's any more are
    /// left alone and reported stale.
    ///
    /// # Errors
    /// `Unavailable` when the database is down.
    pub async fn complete(&self, claim: &Claim, ids: &[i64]) -> Result<Outcome> {
        self.by_claim("complete", Change::Complete, claim, ids, None)
            .await
    }

    /// [`complete`](Self::complete) inside your transaction: commit your
    /// writes with it only when the outcome has no stale rows, and the work
    /// and its completion happen together, once. The rows are locked
    /// (`FOR UPDATE`) until your transaction ends.
    ///
    /// ```no_run
    /// # async fn demo(queue: lease_mysql::JobQueue, claim: lease_mysql::Claim, pool: sqlx::MySqlPool) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = pool.begin().await?;
    /// sqlx::query("UPDATE accounts SET paid = TRUE WHERE payout = ?")
    ///     .bind(claim.ids()[0])
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
        tx: &mut Transaction<'_, MySql>,
        claim: &Claim,
        ids: &[i64],
    ) -> Result<Outcome> {
        self.by_claim("complete", Change::Complete, claim, ids, Some(tx))
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
        validate_visibility(visibility)?;
        let sent_at = Instant::now();
        let ids = claim.ids.clone();
        let outcome = self
            .by_claim("extend", Change::Extend(visibility), claim, &ids, None)
            .await?;
        let rows = std::mem::take(&mut claim.rows);
        let (ids, rows): (Vec<i64>, Vec<MySqlRow>) = ids
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
        self.by_claim("release", Change::Release, claim, ids, None)
            .await
    }
}
