//! Running one backend in a fresh copy of this program: the parent starts
//! the child and reads its result, the child writes it as JSON.

use serde::Serialize;

/// Runs one backend once in a fresh copy of this program and reads back its
/// result.
pub(crate) fn run_child<T: serde::de::DeserializeOwned>(
    backend: &str,
    smoke: bool,
    extra: &[String],
) -> Result<T, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let json = std::env::temp_dir().join(format!(
        "lease-bench-{}-{backend}.json",
        uuid::Uuid::new_v4().simple()
    ));
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("--backends")
        .arg(backend)
        .arg("--child-json")
        .arg(&json);
    if smoke {
        cmd.arg("--smoke");
    }
    cmd.args(extra);
    let status = cmd.status().map_err(|e| e.to_string())?;
    let read = std::fs::read(&json);
    let _ = std::fs::remove_file(&json);
    if !status.success() {
        return Err(format!("its process ended with {status}"));
    }
    let bytes = read.map_err(|e| e.to_string())?;
    serde_json::from_slice(&bytes).map_err(|e| e.to_string())
}

/// A child's result, for the parent to read; exits on failure.
pub(crate) fn write_child_json<T: Serialize>(json: &std::path::Path, result: &T) {
    let written = serde_json::to_vec(result)
        .map_err(std::io::Error::other)
        .and_then(|bytes| std::fs::write(json, bytes));
    if let Err(e) = written {
        eprintln!("lease-bench: cannot write {}: {e}", json.display());
        std::process::exit(1);
    }
}
