//! `TempDir`: a temporary directory removed when its owner drops it.

use std::path::Path;

/// A fresh temporary directory (`tempfile`'s), removed when the owner drops it.
#[derive(Debug)]
pub struct TempDir(tempfile::TempDir);

impl TempDir {
    /// Creates it, its name starting with `prefix`.
    ///
    /// # Panics
    /// If the directory cannot be created.
    pub fn new(prefix: &str) -> Self {
        TempDir(
            tempfile::Builder::new()
                .prefix(&format!("{prefix}-"))
                .tempdir()
                .expect("create temp dir"),
        )
    }

    /// Creates one inside `parent`, its name starting with `prefix`.
    ///
    /// # Panics
    /// If the directory cannot be created.
    pub fn new_in(parent: &Path, prefix: &str) -> Self {
        TempDir(
            tempfile::Builder::new()
                .prefix(&format!("{prefix}-"))
                .tempdir_in(parent)
                .expect("create temp dir"),
        )
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        self.0.path()
    }
}
