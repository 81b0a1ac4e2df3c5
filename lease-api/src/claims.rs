//! The types shared by the database claims of the SQL adapters (the job
//! queue and the once-per-slot claims of `lease-postgres` and
//! `lease-mysql`), so both speak one vocabulary and check input alike.
//!
//! ```
//! use lease_api::claims::{Outcome, validate_claim_name};
//!
//! let outcome = Outcome::new(vec![1, 2], vec![3]);
//! assert!(!outcome.all_done());
//! assert!(validate_claim_name("slot", "2026-12-04T02:00").is_ok());
//! assert!(validate_claim_name("slot", "").is_err());
//! ```

use std::time::Duration;

use crate::{FencingToken, LeaseError, Result};

/// How many times a once-per-slot claim is sent when its answer is lost
/// (the connection broke, the statement timed out): each try carries the
/// same claim id, so a try that did commit answers with its own claim.
pub const CLAIM_ATTEMPTS: u32 = 3;

/// The longest resource or slot name a once-per-slot claim takes, in bytes.
pub const MAX_CLAIM_NAME_BYTES: usize = 1024;

/// What completing a claimed job row does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    /// Delete the row (the queue holds only work still to do).
    Delete,
    /// Keep the row and set `lease_done_at` to the database clock's now; a
    /// done row is never claimed again.
    Mark,
}

/// Which table holds the jobs, which rows are eligible, and in which order
/// they are claimed: the configuration of a SQL adapter's job queue
/// (`lease_postgres::JobQueue`, `lease_mysql::JobQueue`).
///
/// `filter` and `order` are SQL written by you, pasted into the statement:
/// never build them from your users' input. Compare times with the
/// database clock the claims use (`clock_timestamp()` on PostgreSQL,
/// `UTC_TIMESTAMP(6)` on MySQL).
///
/// ```
/// use std::time::Duration;
/// use lease_api::claims::{Completion, QueueConfig};
///
/// let config = QueueConfig::new("payouts")
///     .filter("status = 'ready'")
///     .visibility(Duration::from_secs(60))
///     .completion(Completion::Mark);
/// assert_eq!(config.id_column, "id");
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct QueueConfig {
    /// The schema of the job table: on PostgreSQL a schema (default
    /// `public`), on MySQL a database (default: the URL's).
    pub schema: Option<String>,
    /// The job table.
    pub table: String,
    /// The table's integer key column. Default `id`.
    pub id_column: String,
    /// A boolean SQL expression over the row's columns that a row must meet
    /// to be claimed, such as `queue = 'emails'`.
    pub filter: Option<String>,
    /// The `ORDER BY` list the next rows are chosen by, over unqualified
    /// column names. Default: the key column.
    pub order: Option<String>,
    /// How long a claim keeps its rows from other workers unless extended:
    /// after it, on the database clock, they can be claimed again.
    /// Default 30 s.
    pub visibility: Duration,
    /// What completing a row does. Default [`Completion::Delete`].
    pub completion: Completion,
    /// Add the claim columns (and what the adapter needs beside them) on
    /// first use. Default true; else run the queue's `migrate` yourself.
    pub migrate: bool,
}

impl QueueConfig {
    /// Jobs in `table` of the default schema, keyed by `id`, claimed in key
    /// order.
    pub fn new(table: impl Into<String>) -> Self {
        QueueConfig {
            schema: None,
            table: table.into(),
            id_column: "id".into(),
            filter: None,
            order: None,
            visibility: Duration::from_secs(30),
            completion: Completion::Delete,
            migrate: true,
        }
    }

    /// Sets the schema (on MySQL: the database).
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }

    /// Sets the key column (an integer type).
    pub fn id_column(mut self, column: impl Into<String>) -> Self {
        self.id_column = column.into();
        self
    }

    /// Claims only rows meeting `filter` (SQL).
    pub fn filter(mut self, filter: impl Into<String>) -> Self {
        self.filter = Some(filter.into());
        self
    }

    /// Claims rows in this order (an SQL `ORDER BY` list).
    pub fn order(mut self, order: impl Into<String>) -> Self {
        self.order = Some(order.into());
        self
    }

    /// Sets the visibility timeout.
    pub fn visibility(mut self, visibility: Duration) -> Self {
        self.visibility = visibility;
        self
    }

    /// Sets what completing a row does.
    pub fn completion(mut self, completion: Completion) -> Self {
        self.completion = completion;
        self
    }

    /// Adds the claim columns on first use (the default), or leaves it to
    /// the queue's `migrate`.
    pub fn migrate(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }

    /// Checks what does not depend on the database: a visibility above
    /// zero and no blank filter or order (names are checked by the
    /// adapter, by its own rules).
    ///
    /// # Errors
    /// [`LeaseError::Config`] saying which.
    pub fn validate(&self) -> Result<()> {
        validate_visibility(self.visibility)?;
        validate_queue_sql(self.filter.as_deref(), self.order.as_deref())
    }
}

/// What completing, extending or releasing claimed rows did, row by row.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Outcome {
    /// Rows that were still this claim's, and are now completed, extended
    /// or released.
    pub done: Vec<i64>,
    /// Rows that are not this claim's any more (claimed again after the
    /// visibility ran out, completed, or never in the claim): untouched.
    pub stale: Vec<i64>,
}

impl Outcome {
    /// An outcome from the rows done and the rows found stale.
    pub fn new(done: Vec<i64>, stale: Vec<i64>) -> Self {
        Outcome { done, stale }
    }

    /// The outcome of asking for `asked`, of which the store did `done`:
    /// every other row asked for is stale.
    pub fn from_done(asked: &[i64], done: Vec<i64>) -> Self {
        let stale = asked
            .iter()
            .filter(|id| !done.contains(id))
            .copied()
            .collect();
        Outcome { done, stale }
    }

    /// True when no row was stale.
    pub fn all_done(&self) -> bool {
        self.stale.is_empty()
    }
}

/// A won once-per-slot claim: the caller that got it is the only one for
/// its slot.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct OnceClaim {
    /// Greater than the token of every claim of this table before it.
    pub token: FencingToken,
}

impl OnceClaim {
    /// A claim with `token`.
    pub fn new(token: FencingToken) -> Self {
        OnceClaim { token }
    }
}

/// Who holds a slot's claim.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SlotHolder {
    /// The winner's token.
    pub token: FencingToken,
    /// The winner's label (`user@host:pid`).
    pub holder: Option<String>,
    /// How long ago it was claimed, on the database clock.
    pub age: Duration,
    /// How long until the claim's retention ends and the slot can be
    /// claimed again; `None` when it is kept forever.
    pub retained_for: Option<Duration>,
}

impl SlotHolder {
    /// A holder as the store reported it.
    pub fn new(
        token: FencingToken,
        holder: Option<String>,
        age: Duration,
        retained_for: Option<Duration>,
    ) -> Self {
        SlotHolder {
            token,
            holder,
            age,
            retained_for,
        }
    }
}

/// Checks a once-claim's resource or slot name: 1 to
/// [`MAX_CLAIM_NAME_BYTES`] bytes, without NUL.
///
/// # Errors
/// [`LeaseError::Config`] naming `what` and the value.
pub fn validate_claim_name(what: &str, name: &str) -> Result<()> {
    if name.is_empty() || name.contains('\0') || name.len() > MAX_CLAIM_NAME_BYTES {
        return Err(LeaseError::Config(format!(
            "a claim's {what} must be 1 to {MAX_CLAIM_NAME_BYTES} bytes without NUL, got {name:?}"
        )));
    }
    Ok(())
}

/// Checks a once-claim's retention: `None` (forever) or more than zero.
///
/// # Errors
/// [`LeaseError::Config`] for a zero retention.
pub fn validate_retention(retention: Option<Duration>) -> Result<()> {
    if retention.is_some_and(|r| r.is_zero()) {
        return Err(LeaseError::Config(
            "a claim's retention must be greater than zero (None keeps it forever)".into(),
        ));
    }
    Ok(())
}

/// Checks a job queue's visibility timeout: more than zero.
///
/// # Errors
/// [`LeaseError::Config`] for a zero visibility.
pub fn validate_visibility(visibility: Duration) -> Result<()> {
    if visibility.is_zero() {
        return Err(LeaseError::Config(
            "a claim's visibility timeout must be greater than zero".into(),
        ));
    }
    Ok(())
}

/// Checks a job queue's SQL filter and order: absent or not blank.
///
/// # Errors
/// [`LeaseError::Config`] naming the blank one.
pub fn validate_queue_sql(filter: Option<&str>, order: Option<&str>) -> Result<()> {
    for (what, sql) in [("filter", filter), ("order", order)] {
        if sql.is_some_and(|s| s.trim().is_empty()) {
            return Err(LeaseError::Config(format!("a job queue's {what} is empty")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_durations_are_checked() {
        assert!(validate_claim_name("slot", &"s".repeat(MAX_CLAIM_NAME_BYTES)).is_ok());
        for bad in ["", "a\0b", &"s".repeat(MAX_CLAIM_NAME_BYTES + 1)] {
            assert!(validate_claim_name("slot", bad).is_err(), "{bad:?}");
        }
        assert!(validate_retention(None).is_ok());
        assert!(validate_retention(Some(Duration::ZERO)).is_err());
        assert!(validate_visibility(Duration::ZERO).is_err());
        assert!(validate_queue_sql(Some(" "), None).is_err());
        assert!(validate_queue_sql(None, Some("id")).is_ok());
    }

    #[test]
    fn rows_not_done_are_stale() {
        let o = Outcome::from_done(&[1, 2, 3], vec![3, 1]);
        assert_eq!(o.stale, vec![2]);
        assert!(!o.all_done());
    }
}
