//! The sections of BENCHMARKS.md that their own runs write between markers
//! (the scaling section, from `--scale`), which a full benchmark run keeps
//! when it rewrites the rest of the file.

use std::path::Path;

const START: &str = "<!-- scaling:start (lease-bench --scale; kept when the rest is rewritten) -->";
const END: &str = "<!-- scaling:end -->";

/// The scaling section of the BENCHMARKS.md in `out`, markers included.
pub(crate) fn kept(out: &Path) -> Option<String> {
    let md = std::fs::read_to_string(out.join("BENCHMARKS.md")).ok()?;
    let from = md.find(START)?;
    let to = md[from..].find(END)? + from + END.len();
    Some(md[from..to].to_owned())
}

/// Writes `body` as the scaling section of the BENCHMARKS.md in `out`: in
/// place of the old one, or at the end.
pub(crate) fn put(out: &Path, body: &str) -> std::io::Result<()> {
    let path = out.join("BENCHMARKS.md");
    let md = std::fs::read_to_string(&path).unwrap_or_else(|_| "# Benchmarks\n".into());
    let section = format!("{START}\n{body}{END}\n");
    let new = match md.find(START) {
        Some(from) => {
            let to = md[from..]
                .find(END)
                .map_or(md.len(), |i| from + i + END.len());
            let rest = md[to..].trim_start_matches('\n');
            format!("{}{section}{rest}", &md[..from])
        }
        None => format!("{}\n\n{section}", md.trim_end()),
    };
    std::fs::write(path, new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_replaces_its_old_self_and_keeps_the_rest() {
        let dir = std::env::temp_dir().join(format!("lease-bench-sections-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::fs::write(dir.join("BENCHMARKS.md"), "# Benchmarks\n\nbody\n").expect("write");
        put(&dir, "first\n").expect("put");
        put(&dir, "second\n").expect("put again");
        let md = std::fs::read_to_string(dir.join("BENCHMARKS.md")).expect("read");
        assert!(md.starts_with("# Benchmarks\n\nbody\n"), "{md}");
        assert!(md.contains("second") && !md.contains("first"), "{md}");
        assert_eq!(md.matches(START).count(), 1, "{md}");
        assert_eq!(
            kept(&dir).as_deref(),
            Some(format!("{START}\nsecond\n{END}").as_str())
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
