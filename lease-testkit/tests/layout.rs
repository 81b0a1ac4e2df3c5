//! The workspace's layout: no crate has a cycle among its top-level
//! modules, and no source file outside tests is over 800 lines.
//!
//! A module depends on another when its code names `crate::other` (directly,
//! in a `use crate::{...}` group, or through a name the crate root re-exports
//! from `other`). Comments and doc links do not count; test modules inside a
//! file do. A cycle means neither module can be understood, moved or split
//! without the other: the fix is a leaf module both use.
//!
//! One kind of edge is not counted: from a module named `error` to the
//! value types its variants carry (lease-api's `LeaseError::Lost` names the
//! `LeaseKey` and `FencingToken` it is about, while `LeaseKey::new` returns a
//! `LeaseError`). That is data naming data, the shape of every Rust error
//! enum (`std::io::Error` and the paths it reports); breaking it would take
//! one error type per value type and a conversion at every `?`.
//!
//! A file over 800 lines does more than one job: split it by job, as the
//! adapters are (config, provider, ops, queue, session, watch).
//!
//! `.ci/run` runs these tests before the rest of the suite.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The crate's modules (file stem or directory name under `src/`) with the
/// files of each, and its root file.
fn modules(src: &Path) -> (BTreeMap<String, Vec<PathBuf>>, Option<PathBuf>) {
    let mut mods: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    let mut root = None;
    let Ok(entries) = fs::read_dir(src) else {
        return (mods, root);
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if name == "bin" {
                continue;
            }
            let mut files = Vec::new();
            collect_rs(&path, &mut files);
            mods.entry(name).or_default().extend(files);
        } else if let Some(stem) = name.strip_suffix(".rs") {
            if stem == "lib" || stem == "main" {
                root = Some(path);
            } else {
                mods.entry(stem.to_owned()).or_default().push(path);
            }
        }
    }
    (mods, root)
}

fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_rs(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The text with `//` comments (doc comments included) removed. A `//`
/// inside a string cuts the rest of that line too, which can only drop a
/// dependency written after it on the same line.
fn code(text: &str) -> String {
    text.lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The first path segment of each item in a `{...}` group starting at `s`
/// (just after the `{`), and the rest after the closing brace.
fn group_heads(s: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0usize;
    let mut at_item_start = true;
    let mut i = 0;
    let bytes = s.as_bytes();
    while i < bytes.len() {
        let c = bytes[i] as char;
        match c {
            '{' => {
                depth += 1;
                at_item_start = false;
            }
            '}' => {
                if depth == 0 {
                    break;
                }
                depth -= 1;
            }
            ',' if depth == 0 => at_item_start = true,
            c if c.is_whitespace() => {}
            _ => {
                if at_item_start && depth == 0 {
                    let id = ident_at(&s[i..]);
                    if !id.is_empty() {
                        heads.push(id.to_owned());
                        i += id.len();
                        at_item_start = false;
                        continue;
                    }
                }
                at_item_start = false;
            }
        }
        i += 1;
    }
    heads
}

/// Every first segment after `crate::` in `text`.
fn crate_heads(text: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + "crate::".len()..];
        // `$crate::` and `other_crate::` are not this crate's paths.
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        let tail = rest.trim_start();
        if let Some(group) = tail.strip_prefix('{') {
            heads.extend(group_heads(group));
        } else {
            let id = ident_at(tail);
            if !id.is_empty() {
                heads.push(id.to_owned());
            }
        }
    }
    heads
}

/// Names the root re-exports, by the module they come from
/// (`pub use module::{A, B}` and `pub use module::A`).
fn root_reexports(root: &str, mods: &BTreeMap<String, Vec<PathBuf>>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let text = code(root);
    for stmt in text.split(';') {
        let stmt = stmt.trim();
        let Some(path) = stmt
            .strip_prefix("pub use ")
            .or_else(|| stmt.strip_prefix("pub(crate) use "))
        else {
            continue;
        };
        let path = path
            .trim()
            .trim_start_matches("crate::")
            .trim_start_matches("self::");
        let module = ident_at(path);
        if !mods.contains_key(module) {
            continue;
        }
        let after = path[module.len()..].trim_start_matches("::");
        let names: Vec<String> = if let Some(group) = after.strip_prefix('{') {
            group
                .trim_end_matches('}')
                .split(',')
                .filter_map(|item| {
                    let item = item.trim();
                    let name = item.rsplit(" as ").next().unwrap_or(item);
                    let name = name.rsplit("::").next().unwrap_or(name).trim();
                    (!name.is_empty() && name != "self").then(|| name.to_owned())
                })
                .collect()
        } else {
            let name = after.rsplit(" as ").next().unwrap_or(after);
            vec![name.rsplit("::").next().unwrap_or(name).trim().to_owned()]
        };
        for name in names {
            out.insert(name, module.to_owned());
        }
    }
    out
}

type Graph = BTreeMap<String, BTreeSet<String>>;

fn graph(src: &Path) -> Graph {
    let (mods, root) = modules(src);
    let reexports = root
        .and_then(|r| fs::read_to_string(r).ok())
        .map(|r| root_reexports(&r, &mods))
        .unwrap_or_default();
    let mut g = Graph::new();
    for (module, files) in &mods {
        let deps = g.entry(module.clone()).or_default();
        if module == "error" {
            continue;
        }
        for file in files {
            let Ok(text) = fs::read_to_string(file) else {
                continue;
            };
            for head in crate_heads(&code(&text)) {
                let target = if mods.contains_key(&head) {
                    Some(head)
                } else {
                    reexports.get(&head).cloned()
                };
                if let Some(t) = target.filter(|t| t != module) {
                    deps.insert(t);
                }
            }
        }
    }
    g
}

/// The groups of modules that reach one another (strongly connected
/// components of more than one module), each sorted; empty when the graph
/// has no cycle.
fn cycles(g: &Graph) -> Vec<Vec<String>> {
    // Two passes (Kosaraju): finish order on `g`, then reach on the reverse.
    fn finish(n: &str, g: &Graph, seen: &mut BTreeSet<String>, order: &mut Vec<String>) {
        if !seen.insert(n.to_owned()) {
            return;
        }
        for m in g.get(n).into_iter().flatten() {
            finish(m, g, seen, order);
        }
        order.push(n.to_owned());
    }
    let mut seen = BTreeSet::new();
    let mut order = Vec::new();
    for n in g.keys() {
        finish(n, g, &mut seen, &mut order);
    }
    let mut reverse = Graph::new();
    for (n, deps) in g {
        for m in deps {
            reverse.entry(m.clone()).or_default().insert(n.clone());
        }
    }
    let mut placed = BTreeSet::new();
    let mut out = Vec::new();
    for n in order.iter().rev() {
        if placed.contains(n) {
            continue;
        }
        let mut group = Vec::new();
        let mut stack = vec![n.clone()];
        while let Some(m) = stack.pop() {
            if !placed.insert(m.clone()) {
                continue;
            }
            for r in reverse.get(&m).into_iter().flatten() {
                if !placed.contains(r) {
                    stack.push(r.clone());
                }
            }
            group.push(m);
        }
        if group.len() > 1 {
            group.sort();
            out.push(group);
        }
    }
    out
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the testkit sits in the workspace")
        .to_path_buf()
}

#[test]
fn no_crate_has_a_module_cycle() {
    let mut found = Vec::new();
    let mut crates = 0;
    for entry in fs::read_dir(workspace()).expect("workspace").flatten() {
        let src = entry.path().join("src");
        if !entry.path().join("Cargo.toml").is_file() || !src.is_dir() {
            continue;
        }
        crates += 1;
        for group in cycles(&graph(&src)) {
            found.push(format!(
                "{}: {} import one another",
                entry.file_name().to_string_lossy(),
                group.join(", ")
            ));
        }
    }
    assert!(crates >= 10, "found only {crates} crates to check");
    assert!(found.is_empty(), "module cycles:\n{}", found.join("\n"));
}

#[test]
fn the_checker_sees_a_cycle_through_a_group_and_a_root_reexport() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    fs::write(
        src.join("lib.rs"),
        "mod a;\nmod b;\npub use b::{Bee, other as Renamed};\n",
    )
    .expect("write");
    // `a` names `b` through the root's re-export, inside a group.
    fs::write(
        src.join("a.rs"),
        "use crate::{Bee, x};\n// crate::c is a comment\n",
    )
    .expect("write");
    fs::write(
        src.join("b.rs"),
        "pub struct Bee;\nfn f() { crate::a::g(); }\n",
    )
    .expect("write");
    let g = graph(src);
    assert_eq!(g["a"], BTreeSet::from(["b".to_owned()]));
    assert_eq!(g["b"], BTreeSet::from(["a".to_owned()]));
    assert_eq!(cycles(&g), vec![vec!["a".to_owned(), "b".to_owned()]]);
    // Without b's call back there is none.
    fs::write(src.join("b.rs"), "pub struct Bee;\n").expect("write");
    assert!(cycles(&graph(src)).is_empty());
}

/// The longest a source file under a crate's `src/` may be.
const MAX_SOURCE_LINES: usize = 800;

#[test]
fn no_source_file_is_over_800_lines() {
    let mut long = Vec::new();
    let mut files = 0;
    for entry in fs::read_dir(workspace()).expect("workspace").flatten() {
        let src = entry.path().join("src");
        if !entry.path().join("Cargo.toml").is_file() || !src.is_dir() {
            continue;
        }
        let mut rs = Vec::new();
        collect_rs(&src, &mut rs);
        for path in rs {
            files += 1;
            let lines = fs::read_to_string(&path).map_or(0, |t| t.lines().count());
            if lines > MAX_SOURCE_LINES {
                long.push(format!("{}: {lines} lines", path.display()));
            }
        }
    }
    assert!(files >= 50, "found only {files} source files to check");
    assert!(
        long.is_empty(),
        "source files over {MAX_SOURCE_LINES} lines:\n{}",
        long.join("\n")
    );
}
