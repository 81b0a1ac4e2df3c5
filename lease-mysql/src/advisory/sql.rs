//! The statements of the advisory-lock mode, on the token table.
//!
//! Each acquire, extend and release is one statement on the lease's own
//! session. `GET_LOCK`, `IS_USED_LOCK` and `RELEASE_LOCK` are evaluated
//! inside the statement that reads or writes the token row, so the lock and
//! the row change in one round trip.

#[derive(Debug)]
pub(super) struct AdvisorySql {
    pub acquire: String,
    pub held_for: String,
    pub extend: String,
    pub release: String,
    pub holder_of: String,
    pub clear: String,
    pub inspect: String,
}

impl AdvisorySql {
    pub(super) fn new(table: &str) -> Self {
        let t = format!("`{table}`");
        let now = "UTC_TIMESTAMP(6)";
        let mine = "namespace = ? AND k = ? AND owner = ? AND token = ?";
        AdvisorySql {
            // The row is written only when GET_LOCK took the lock, and then
            // the new token is left in LAST_INSERT_ID (sent back with the
            // answer). Binds: namespace, key, owner, µs, holder, lock name.
            acquire: format!(
                "INSERT INTO {t} (namespace, k, token, owner, expires_at, holder)
                 SELECT ?, ?, LAST_INSERT_ID(1), ?, {now} + INTERVAL ? MICROSECOND, ?
                   FROM DUAL WHERE GET_LOCK(?, 0) = 1
                 ON DUPLICATE KEY UPDATE
                    token = LAST_INSERT_ID(token + 1), owner = VALUES(owner),
                    expires_at = VALUES(expires_at), holder = VALUES(holder)"
            ),
            // After a miss: the holder's time left as recorded (µs).
            held_for: format!(
                "SELECT GREATEST(TIMESTAMPDIFF(MICROSECOND, {now}, expires_at), 0) FROM {t}
                  WHERE namespace = ? AND k = ? AND owner IS NOT NULL"
            ),
            // On the lease's session: only while this session holds the lock.
            extend: format!(
                "UPDATE {t} SET expires_at = {now} + INTERVAL ? MICROSECOND
                  WHERE {mine} AND IS_USED_LOCK(?) = CONNECTION_ID()"
            ),
            // On the lease's session: the row cleared and the lock given
            // back in one statement.
            release: format!(
                "UPDATE {t} SET owner = NULL, expires_at = NULL,
                        holder = IF(RELEASE_LOCK(?) = 1, NULL, NULL)
                  WHERE {mine} AND IS_USED_LOCK(?) = CONNECTION_ID()"
            ),
            // A lease held elsewhere: the session that holds its lock.
            holder_of: format!(
                "SELECT CAST(IS_USED_LOCK(?) AS UNSIGNED) FROM {t} WHERE {mine} FOR UPDATE"
            ),
            clear: format!(
                "UPDATE {t} SET owner = NULL, expires_at = NULL, holder = NULL WHERE {mine}"
            ),
            inspect: format!(
                "SELECT token, owner, GREATEST(TIMESTAMPDIFF(MICROSECOND, {now}, expires_at), 0), holder
                   FROM {t}
                  WHERE namespace = ? AND k = ? AND owner IS NOT NULL AND IS_USED_LOCK(?) IS NOT NULL"
            ),
        }
    }
}
