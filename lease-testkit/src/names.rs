//! Names no other test run uses.

/// A name no other test run uses: `prefix`, `_` and 12 random hex digits (also a
/// valid SQL identifier when `prefix` is one).
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}
