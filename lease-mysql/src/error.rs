//! What the server's errors mean for the caller: a refusal, an outage that
//! may pass, or an answer. A leaf module.

use sqlx::mysql::MySqlDatabaseError;

/// The server's error number (`ER_*`), for a database error.
pub(crate) fn error_number(e: &sqlx::Error) -> Option<u16> {
    match e {
        sqlx::Error::Database(d) => d
            .try_downcast_ref::<MySqlDatabaseError>()
            .map(MySqlDatabaseError::number),
        _ => None,
    }
}

/// A failed TLS handshake or certificate check, a refused login (1045 access
/// denied, 1044 no access to the database, 1698 no password login, 3159 TLS
/// required) or a missing privilege (1142, 1143, 1227).
pub(crate) fn is_denied(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Tls(_))
        || matches!(e, sqlx::Error::Io(io) if io.get_ref().is_some_and(|i| lease_api::backend::is_tls_refusal(i)))
        || matches!(
            error_number(e),
            Some(1044 | 1045 | 1142 | 1143 | 1227 | 1698 | 3159)
        )
}

/// Errors that may pass: the server is down, restarting, overloaded, or
/// timed a statement out; a lock wait or deadlock (1205, 1213; Galera's
/// certification conflict is reported as 1213); too many connections (1040);
/// the connection killed or the server shutting down (1927, 1053, 2006,
/// 2013, MySQL's idle disconnect 4031); a statement over
/// `max_statement_time` (1969); a Galera node that is not ready (1047); a
/// server in read-only mode (1290, 1836), as a demoted node is.
pub(crate) fn is_unavailable(e: &sqlx::Error) -> bool {
    matches!(
        e,
        sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::Protocol(_)
    ) || matches!(
        error_number(e),
        Some(1040 | 1047 | 1053 | 1205 | 1213 | 1290 | 1836 | 1927 | 1969 | 2006 | 2013 | 4031)
    )
}

/// A DDL statement's answer, with "it is there already" (a duplicate column
/// 1060, key 1061 or table 1050, from another process migrating at the
/// same moment) counted as done.
pub(crate) fn tolerate_existing<T>(r: Result<T, sqlx::Error>) -> Result<(), sqlx::Error> {
    match r {
        Ok(_) => Ok(()),
        Err(e) if matches!(error_number(&e), Some(1050 | 1060 | 1061)) => Ok(()),
        Err(e) => Err(e),
    }
}
