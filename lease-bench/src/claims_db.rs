//! The stores the claims section runs on, behind one face: PostgreSQL and
//! MySQL/MariaDB each have a lease table, an advisory mode, a job queue and
//! once-per-slot claims, with types of their own.

use std::sync::Arc;
use std::time::Duration;

use leases::lease_mysql::{self as my, MysqlConfig, MysqlProvider};
use leases::lease_postgres::{self as pg, PostgresConfig, PostgresProvider};
use leases::{LeaseError, LeaseProvider};

pub(crate) type BoxErr = Box<dyn std::error::Error + Send + Sync>;

/// A lease mode's name in the report, and its provider.
pub(crate) type Mode = (String, Arc<dyn LeaseProvider>);

/// Which database, and a pool on it for the job tables.
#[derive(Clone)]
pub(crate) enum Db {
    Postgres { url: String, pool: sqlx::PgPool },
    Mysql { url: String, pool: sqlx::MySqlPool },
}

/// A job queue of either store.
pub(crate) enum Queue {
    Postgres(pg::JobQueue),
    Mysql(my::JobQueue),
}

/// Once-per-slot claims of either store.
#[derive(Clone)]
pub(crate) enum Once {
    Postgres(pg::OnceClaims),
    Mysql(my::OnceClaims),
}

impl Db {
    pub(crate) async fn postgres(url: &str) -> Result<Self, BoxErr> {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(20)
            .connect(url)
            .await?;
        Ok(Db::Postgres {
            url: url.into(),
            pool,
        })
    }

    pub(crate) async fn mysql(url: &str) -> Result<Self, BoxErr> {
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(20)
            .connect(url)
            .await?;
        Ok(Db::Mysql {
            url: url.into(),
            pool,
        })
    }

    /// The store's name in the report.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Db::Postgres { .. } => "PostgreSQL",
            Db::Mysql { .. } => "MariaDB",
        }
    }

    /// The lease table and the advisory mode, in `namespace`.
    pub(crate) fn providers(&self, namespace: &str) -> Result<Vec<Mode>, BoxErr> {
        Ok(match self {
            Db::Postgres { url, .. } => vec![
                (
                    "lease table (PostgresProvider)".into(),
                    Arc::new(PostgresProvider::new(
                        PostgresConfig::new(url).namespace(namespace),
                    )?) as Arc<dyn LeaseProvider>,
                ),
                (
                    "advisory lock (AdvisoryProvider)".into(),
                    Arc::new(pg::AdvisoryProvider::new(
                        PostgresConfig::new(url).namespace(namespace),
                    )?),
                ),
            ],
            Db::Mysql { url, .. } => vec![
                (
                    "lease table (MysqlProvider)".into(),
                    Arc::new(MysqlProvider::new(
                        MysqlConfig::new(url).namespace(namespace),
                    )?) as Arc<dyn LeaseProvider>,
                ),
                (
                    "GET_LOCK (AdvisoryProvider)".into(),
                    Arc::new(my::AdvisoryProvider::new(
                        MysqlConfig::new(url).namespace(namespace),
                    )?),
                ),
            ],
        })
    }

    /// A lease provider for the lease-per-job run, with `connections`.
    pub(crate) fn lease_provider(
        &self,
        namespace: &str,
        connections: u32,
    ) -> Result<Arc<dyn LeaseProvider>, BoxErr> {
        Ok(match self {
            Db::Postgres { url, .. } => Arc::new(PostgresProvider::new(
                PostgresConfig::new(url)
                    .namespace(namespace)
                    .max_connections(connections),
            )?),
            Db::Mysql { url, .. } => Arc::new(MysqlProvider::new(
                MysqlConfig::new(url)
                    .namespace(namespace)
                    .max_connections(connections),
            )?),
        })
    }

    /// A table `table` of `jobs` rows, ids 1..=jobs, none done.
    pub(crate) async fn job_table(&self, table: &str, jobs: usize) -> Result<(), BoxErr> {
        let n = i64::try_from(jobs)?;
        match self {
            Db::Postgres { pool, .. } => {
                sqlx::query(&format!(
                    "CREATE TABLE {table} (id bigint PRIMARY KEY, done boolean NOT NULL DEFAULT false)"
                ))
                .execute(pool)
                .await?;
                sqlx::query(&format!(
                    "INSERT INTO {table} (id) SELECT g FROM generate_series(1, $1) g"
                ))
                .bind(n)
                .execute(pool)
                .await?;
            }
            Db::Mysql { pool, .. } => {
                sqlx::query(&format!(
                    "CREATE TABLE {table} (id BIGINT PRIMARY KEY, done BOOLEAN NOT NULL DEFAULT FALSE)"
                ))
                .execute(pool)
                .await?;
                // MariaDB's sequence tables.
                sqlx::query(&format!(
                    "INSERT INTO {table} (id) SELECT seq FROM seq_1_to_{n}"
                ))
                .execute(pool)
                .await?;
            }
        }
        Ok(())
    }

    /// Rows of `table` meeting `filter`.
    pub(crate) async fn count(&self, table: &str, filter: &str) -> Result<i64, BoxErr> {
        let sql = format!("SELECT COUNT(*) FROM {table} WHERE {filter}");
        Ok(match self {
            Db::Postgres { pool, .. } => sqlx::query_scalar(&sql).fetch_one(pool).await?,
            Db::Mysql { pool, .. } => sqlx::query_scalar(&sql).fetch_one(pool).await?,
        })
    }

    /// Drops `table` and anything claims made beside it.
    pub(crate) async fn drop_table(&self, table: &str) -> Result<(), BoxErr> {
        match self {
            Db::Postgres { pool, .. } => {
                sqlx::query(&format!("DROP TABLE {table}"))
                    .execute(pool)
                    .await?;
            }
            Db::Mysql { pool, .. } => {
                sqlx::query(&format!(
                    "DROP TABLE IF EXISTS {table}, {table}_lease_token"
                ))
                .execute(pool)
                .await?;
            }
        }
        Ok(())
    }

    /// Whether job `id` is done.
    pub(crate) async fn is_done(&self, table: &str, id: i64) -> Result<bool, BoxErr> {
        Ok(match self {
            Db::Postgres { pool, .. } => {
                sqlx::query_scalar(&format!("SELECT done FROM {table} WHERE id = $1"))
                    .bind(id)
                    .fetch_one(pool)
                    .await?
            }
            Db::Mysql { pool, .. } => {
                sqlx::query_scalar(&format!("SELECT done FROM {table} WHERE id = ?"))
                    .bind(id)
                    .fetch_one(pool)
                    .await?
            }
        })
    }

    /// Marks job `id` done if it was not: how many rows changed.
    pub(crate) async fn mark_done(&self, table: &str, id: i64) -> Result<u64, BoxErr> {
        Ok(match self {
            Db::Postgres { pool, .. } => sqlx::query(&format!(
                "UPDATE {table} SET done = true WHERE id = $1 AND NOT done"
            ))
            .bind(id)
            .execute(pool)
            .await?
            .rows_affected(),
            Db::Mysql { pool, .. } => sqlx::query(&format!(
                "UPDATE {table} SET done = TRUE WHERE id = ? AND NOT done"
            ))
            .bind(id)
            .execute(pool)
            .await?
            .rows_affected(),
        })
    }

    /// A job queue on `table` (migrated), with `connections`.
    pub(crate) async fn queue(
        &self,
        namespace: &str,
        table: &str,
        connections: u32,
    ) -> Result<Queue, BoxErr> {
        Ok(match self {
            Db::Postgres { url, .. } => {
                let p = PostgresProvider::new(
                    PostgresConfig::new(url)
                        .namespace(namespace)
                        .max_connections(connections),
                )?;
                let q = pg::JobQueue::new(&p, pg::QueueConfig::new(table))?;
                q.migrate().await?;
                Queue::Postgres(q)
            }
            Db::Mysql { url, .. } => {
                let p = MysqlProvider::new(
                    MysqlConfig::new(url)
                        .namespace(namespace)
                        .max_connections(connections),
                )?;
                let q = my::JobQueue::new(&p, my::QueueConfig::new(table))?;
                q.migrate().await?;
                Queue::Mysql(q)
            }
        })
    }

    /// Once-per-slot claims in the default table (migrated).
    pub(crate) async fn once(&self, namespace: &str, connections: u32) -> Result<Once, BoxErr> {
        Ok(match self {
            Db::Postgres { url, .. } => {
                let c = pg::OnceClaims::new(&PostgresProvider::new(
                    PostgresConfig::new(url)
                        .namespace(namespace)
                        .max_connections(connections),
                )?);
                c.migrate().await?;
                Once::Postgres(c)
            }
            Db::Mysql { url, .. } => {
                let c = my::OnceClaims::new(&MysqlProvider::new(
                    MysqlConfig::new(url)
                        .namespace(namespace)
                        .max_connections(connections),
                )?);
                c.migrate().await?;
                Once::Mysql(c)
            }
        })
    }
}

impl Queue {
    /// Claims up to `batch` rows and completes them: how many were done,
    /// `None` when no row was free.
    pub(crate) async fn claim_and_complete(
        &self,
        batch: usize,
    ) -> Result<Option<usize>, LeaseError> {
        Ok(match self {
            Queue::Postgres(q) => {
                let claim = q.claim_next(batch).await?;
                if claim.is_empty() {
                    return Ok(None);
                }
                Some(q.complete(&claim, claim.ids()).await?.done.len())
            }
            Queue::Mysql(q) => {
                let claim = q.claim_next(batch).await?;
                if claim.is_empty() {
                    return Ok(None);
                }
                Some(q.complete(&claim, claim.ids()).await?.done.len())
            }
        })
    }
}

impl Once {
    /// Whether this call won `slot` of `resource` (kept forever).
    pub(crate) async fn claim(&self, resource: &str, slot: &str) -> Result<bool, LeaseError> {
        Ok(match self {
            Once::Postgres(c) => c.claim_once(resource, slot, None).await?.is_some(),
            Once::Mysql(c) => c.claim_once(resource, slot, None).await?.is_some(),
        })
    }
}

/// How long a lease per job is taken for.
pub(crate) const JOB_LEASE: Duration = Duration::from_secs(30);
