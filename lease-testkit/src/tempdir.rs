//! `TempDir`: a temporary directory removed when its owner drops it.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// This process's directory for everything the test kit creates:
/// `lease-testkit-<pid>` in the temporary directory.
///
/// A suite that keeps a server in a `static` never drops it, so its
/// directory outlives the process. The first call therefore also removes
/// the directories of processes that are gone: a run leaves at most its own
/// behind, never a pile.
fn process_root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let tmp = std::env::temp_dir();
        if let Ok(entries) = std::fs::read_dir(&tmp) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(pid) = name
                    .strip_prefix("lease-testkit-")
                    .and_then(|p| p.parse::<i32>().ok())
                else {
                    continue;
                };
                let gone = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
                    == Err(nix::errno::Errno::ESRCH);
                if gone {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let root = tmp.join(format!("lease-testkit-{}", std::process::id()));
        std::fs::create_dir_all(&root).expect("create the test kit's directory");
        root
    })
}

/// A fresh temporary directory (`tempfile`'s), removed when the owner drops it.
#[derive(Debug)]
pub struct TempDir(tempfile::TempDir);

impl TempDir {
    /// Creates it in this process's directory (`lease-testkit-<pid>`), its
    /// name starting with `prefix`.
    ///
    /// # Panics
    /// If the directory cannot be created.
    pub fn new(prefix: &str) -> Self {
        Self::new_in(process_root(), prefix)
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
