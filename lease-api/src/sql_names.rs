//! Names the SQL adapters paste into statements (tables, schemas,
//! columns): checked before any statement is built.

use crate::LeaseError;

/// Checks an SQL identifier: an ASCII letter or `_`, then ASCII letters,
/// digits or `_`, at most `max_len` bytes (63 in PostgreSQL, 64 in MySQL).
/// The adapters quote names anyway; this keeps them sane and keeps out
/// anything that could close the quote.
///
/// ```
/// use lease_api::backend::validate_sql_identifier;
///
/// assert!(validate_sql_identifier("table", "lease_leases", 63).is_ok());
/// assert!(validate_sql_identifier("table", "x\"; DROP TABLE y", 63).is_err());
/// ```
///
/// # Errors
/// [`LeaseError::Config`] naming `what`, the name and the rule.
pub fn validate_sql_identifier(what: &str, name: &str, max_len: usize) -> Result<(), LeaseError> {
    let mut chars = name.chars();
    let ok_first = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let ok_rest = chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok_first && ok_rest && name.len() <= max_len {
        Ok(())
    } else {
        Err(LeaseError::Config(format!(
            "invalid {what} {name:?}: use 1-{max_len} ASCII letters, digits and underscores, not starting with a digit"
        )))
    }
}
