//! The statements, built once per provider from the validated table name.
//!
//! Every statement reads the database clock with `UTC_TIMESTAMP(6)`, which
//! MySQL and MariaDB evaluate once per statement, so one statement sees one
//! instant. It does not depend on the session's `time_zone`.

use lease_api::LeaseError;

/// Checks a table name: a letter or `_`, then letters, digits or `_`, at most
/// 64 bytes (MySQL's limit). Quoted in SQL anyway; this keeps names sane and
/// keeps anything that could close the quote out.
pub(crate) fn validate_identifier(what: &str, name: &str) -> Result<(), LeaseError> {
    lease_api::backend::validate_sql_identifier(what, name, 64)
}

#[derive(Debug)]
pub(crate) struct Statements {
    /// The table's name, unquoted.
    pub table: String,
    pub create_table: String,
    pub acquire: String,
    pub extend: String,
    pub release: String,
    /// Releases what an acquire without an answer may have won: key and
    /// owner, whatever the expiry (a row of ours that ran out and was not
    /// taken since holds nobody either way).
    pub release_owned: String,
    pub inspect: String,
    pub state: String,
    pub fence: String,
    pub purge: String,
}

/// Who won an acquire, from the one answer (the server sends the row count
/// and `LAST_INSERT_ID()` back with it; sqlx asks for found rows):
/// - a new row: count 1, `LAST_INSERT_ID()` 1, the token;
/// - a released or expired row taken: count 2 (changed), `LAST_INSERT_ID()`
///   the new token;
/// - a held row: count 1 (found, unchanged: `token + 0 * ..` keeps it),
///   `LAST_INSERT_ID()` the holder's remaining µs plus 2, so never 1.
///
/// So a loser learns the holder's time left without a second statement.
///
/// `ON DUPLICATE KEY UPDATE` assigns columns left to right, each later one
/// seeing the earlier ones' new values. So `owner` is decided first, from
/// the row as it was; every later column asks whether `owner` is now this
/// attempt's (a fresh random id), which is true exactly when it won.
const WON: &str = "owner <=> VALUES(owner)";

impl Statements {
    pub(crate) fn new(table: &str) -> Self {
        let t = format!("`{table}`");
        let now = "UTC_TIMESTAMP(6)";
        let remaining = format!("TIMESTAMPDIFF(MICROSECOND, {now}, expires_at)");
        Statements {
            table: table.to_owned(),
            // Binary columns: keys compare byte for byte, so `a`, `A`, `a `
            // and `á` are four keys, whatever the server's default collation.
            create_table: format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                    namespace  VARBINARY(255)   NOT NULL,
                    k          VARBINARY(1024)  NOT NULL,
                    owner      VARBINARY(32)    NULL,
                    token      BIGINT UNSIGNED  NOT NULL,
                    expires_at DATETIME(6)      NULL,
                    holder     VARBINARY(255)   NULL,
                    PRIMARY KEY (namespace, k)
                ) ENGINE=InnoDB"
            ),
            acquire: format!(
                "INSERT INTO {t} (namespace, k, owner, token, expires_at, holder)
                 VALUES (?, ?, ?, LAST_INSERT_ID(1), {now} + INTERVAL ? MICROSECOND, ?)
                 ON DUPLICATE KEY UPDATE
                    owner = IF(owner IS NULL OR expires_at <= {now}, VALUES(owner), owner),
                    token = IF({WON}, LAST_INSERT_ID(token + 1),
                               token + 0 * LAST_INSERT_ID(2 + GREATEST({remaining}, 0))),
                    expires_at = IF({WON}, VALUES(expires_at), expires_at),
                    holder = IF({WON}, VALUES(holder), holder)"
            ),
            extend: format!(
                "UPDATE {t} SET expires_at = {now} + INTERVAL ? MICROSECOND
                  WHERE namespace = ? AND k = ? AND owner = ? AND token = ? AND expires_at > {now}"
            ),
            release: format!(
                "UPDATE {t} SET owner = NULL, expires_at = NULL, holder = NULL
                  WHERE namespace = ? AND k = ? AND owner = ? AND token = ? AND expires_at > {now}"
            ),
            release_owned: format!(
                "UPDATE {t} SET owner = NULL, expires_at = NULL, holder = NULL
                  WHERE namespace = ? AND k = ? AND owner = ?"
            ),
            inspect: format!(
                "SELECT token, owner, {remaining}, holder FROM {t}
                  WHERE namespace = ? AND k = ? AND owner IS NOT NULL AND expires_at > {now}"
            ),
            // What a waiter reads: the token, and whether the key is free.
            state: format!(
                "SELECT token, CAST(owner IS NULL OR expires_at <= {now} AS SIGNED) FROM {t}
                  WHERE namespace = ? AND k = ?"
            ),
            fence: format!(
                "SELECT 1 FROM {t}
                  WHERE namespace = ? AND k = ? AND owner = ? AND token = ? AND expires_at > {now}
                  LOCK IN SHARE MODE"
            ),
            purge: format!("DELETE FROM {t} WHERE LEFT(namespace, LENGTH(?)) = ?"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_checked() {
        for ok in ["leases", "_x", "a1_b2", &"t".repeat(64)] {
            assert!(validate_identifier("table", ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "1abc",
            "a-b",
            "a b",
            "x`; DROP TABLE y; --",
            "a.b",
            "é",
            &"t".repeat(65),
        ] {
            assert!(validate_identifier("table", bad).is_err(), "{bad}");
        }
    }
}
