//! `lease run` on a local SQLite file: `--key a --key b` (every key or none,
//! for the command's whole run) and `--shared` / `--writer` (a key's
//! read/write lease).

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use lease_testkit::TempDir;

const NOT_ACQUIRED: i32 = 75;
const USAGE: i32 = 64;
const FREE: i32 = 3;

fn lease(store: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_lease"));
    c.env_remove("LEASE_STORE")
        .env_remove("LEASE_CONFIG")
        .env_remove("LEASE_NAMESPACE")
        .args(["--store", store]);
    c
}

fn output(mut c: Command) -> Output {
    c.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("run lease")
}

fn run(store: &str, keys: &[&str], extra: &[&str], script: &str) -> Command {
    let mut c = lease(store);
    c.arg("run");
    for k in keys {
        c.args(["--key", k]);
    }
    c.args(["--ttl", "30s"])
        .args(extra)
        .args(["--", "sh", "-c", script]);
    c
}

/// A run of the key `partitions` in `mode` (`--shared`, `--writer` or none).
fn run_rw(store: &str, mode: &[&str], script: &str) -> Command {
    let mut c = lease(store);
    c.args(["run", "--key", "partitions", "--ttl", "30s"])
        .args(mode)
        .args(["--", "sh", "-c", script]);
    c
}

fn status(store: &str, key: &str) -> Option<i32> {
    let mut c = lease(store);
    c.args(["status", "--key", key]);
    output(c).status.code()
}

fn wait_for_file(path: &Path, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(s) = std::fs::read_to_string(path)
            && s.ends_with('\n')
        {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{} never written",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_run_holds_every_key_or_none_and_gets_each_token() {
    let dir = TempDir::new("lease-cli-sets");
    let store = format!("sqlite://{}", dir.path().join("l.db").display());
    let env_file = dir.path().join("env");
    let done = dir.path().join("done");
    // The first run holds "a b" and waits until the test lets it finish.
    let hold = format!(
        "echo \"$LEASE_KEY_COUNT $LEASE_KEY_1 $LEASE_TOKEN_1 $LEASE_KEY_2 $LEASE_TOKEN_2 $LEASE_KEY $LEASE_TOKEN\" > {env}.tmp; mv {env}.tmp {env}; while [ ! -e {done} ]; do sleep 0.05; done",
        env = env_file.display(),
        done = done.display()
    );
    let mut first = run(&store, &["a b", "c/d"], &[], &hold).spawn().unwrap();
    let seen = wait_for_file(&env_file, Duration::from_secs(20));
    let fields: Vec<&str> = seen.split_whitespace().collect();
    // Count, then key/token pairs (the first key has a space in it).
    assert_eq!(fields[0], "2", "{seen}");
    assert_eq!(&fields[1..3], ["a", "b"], "{seen}");
    assert_eq!(fields[4], "c/d", "{seen}");
    let (t1, t2): (u64, u64) = (fields[3].parse().unwrap(), fields[5].parse().unwrap());
    assert_eq!(
        fields[6..9],
        ["a", "b", &t1.to_string()[..]],
        "LEASE_KEY/LEASE_TOKEN: the first key's"
    );
    assert!(t1 > 0 && t2 > 0);

    // A set overlapping on "c/d" is refused, says who holds it, and leaves
    // its free key free.
    let second = output(run(&store, &["free", "c/d"], &[], "echo SHOULD-NOT-RUN"));
    assert_eq!(second.status.code(), Some(NOT_ACQUIRED), "{second:?}");
    assert!(!String::from_utf8_lossy(&second.stdout).contains("SHOULD-NOT-RUN"));
    let refused = String::from_utf8_lossy(&second.stderr);
    assert!(refused.contains("c/d is held by"), "{refused}");
    assert!(!refused.contains("free is held"), "{refused}");
    assert_eq!(
        status(&store, "free"),
        Some(FREE),
        "a refused set left a key held"
    );
    assert_eq!(status(&store, "a b"), Some(0));

    // A minimum hold or once-per-slot takes one key: a usage error, nothing taken.
    let usage = output(run(&store, &["x", "y"], &["--min-hold", "1s"], "true"));
    assert_eq!(usage.status.code(), Some(USAGE), "{usage:?}");
    assert_eq!(status(&store, "x"), Some(FREE));

    std::fs::write(&done, "").unwrap();
    assert_eq!(first.wait().unwrap().code(), Some(0));
    // Both released at once, and taken again with larger tokens.
    let again = output(run(
        &store,
        &["a b", "c/d"],
        &[],
        "echo $LEASE_TOKEN_1 $LEASE_TOKEN_2",
    ));
    assert_eq!(again.status.code(), Some(0), "{again:?}");
    let tokens: Vec<u64> = String::from_utf8_lossy(&again.stdout)
        .split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect();
    assert!(
        tokens[0] > t1 && tokens[1] > t2,
        "{tokens:?} after {t1} {t2}"
    );
}

#[test]
fn shared_runs_hold_a_key_together_and_a_writer_runs_alone() {
    let dir = TempDir::new("lease-cli-rw");
    let store = format!("sqlite://{}", dir.path().join("l.db").display());
    let done = dir.path().join("done");
    let hold = |out: &Path| {
        format!(
            "echo $LEASE_TOKEN > {o}.tmp; mv {o}.tmp {o}; while [ ! -e {d} ]; do sleep 0.05; done",
            o = out.display(),
            d = done.display()
        )
    };
    // Two readers at once.
    let (a_out, b_out) = (dir.path().join("a"), dir.path().join("b"));
    let mut a = run_rw(&store, &["--shared"], &hold(&a_out))
        .spawn()
        .unwrap();
    let mut b = run_rw(&store, &["--shared"], &hold(&b_out))
        .spawn()
        .unwrap();
    let (ta, tb): (u64, u64) = (
        wait_for_file(&a_out, Duration::from_secs(20))
            .trim()
            .parse()
            .unwrap(),
        wait_for_file(&b_out, Duration::from_secs(20))
            .trim()
            .parse()
            .unwrap(),
    );
    assert_ne!(ta, tb);
    // A writer is refused while they hold, and says so.
    let refused = output(run_rw(&store, &["--writer"], "echo SHOULD-NOT-RUN"));
    assert_eq!(refused.status.code(), Some(NOT_ACQUIRED), "{refused:?}");
    assert!(!String::from_utf8_lossy(&refused.stdout).contains("SHOULD-NOT-RUN"));
    let says = String::from_utf8_lossy(&refused.stderr);
    assert!(says.contains("held by 2 reader(s)"), "{says}");
    // The plain lease of the same key is another lease.
    let plain = output(run_rw(&store, &[], "true"));
    assert_eq!(plain.status.code(), Some(0), "{plain:?}");
    // A read/write lease is one key's; the flags exclude each other.
    let mut two = lease(&store);
    two.args(["run", "--key", "x", "--key", "y", "--shared", "--", "true"]);
    assert_eq!(output(two).status.code(), Some(USAGE));
    let both = output(run_rw(&store, &["--shared", "--writer"], "true"));
    assert_eq!(both.status.code(), Some(USAGE), "{both:?}");
    // --fair goes with --shared (arrival order): past the command line, the
    // store refuses it (SQLite has no queue of waiters).
    let fair = output(run_rw(
        &store,
        &["--shared", "--fair"],
        "echo SHOULD-NOT-RUN",
    ));
    assert_eq!(fair.status.code(), Some(USAGE), "{fair:?}");
    assert!(
        String::from_utf8_lossy(&fair.stderr).contains("does not offer fair waiting"),
        "{fair:?}"
    );
    std::fs::write(&done, "").unwrap();
    assert_eq!(a.wait().unwrap().code(), Some(0));
    assert_eq!(b.wait().unwrap().code(), Some(0));
    // The writer runs now, with a token above both readers'.
    let w = output(run_rw(
        &store,
        &["--writer", "--wait", "10s"],
        "echo $LEASE_TOKEN",
    ));
    assert_eq!(w.status.code(), Some(0), "{w:?}");
    let tw: u64 = String::from_utf8_lossy(&w.stdout).trim().parse().unwrap();
    assert!(tw > ta && tw > tb, "writer {tw} after readers {ta} {tb}");
    // A reader after it carries its token as the writer epoch.
    let r = output(run_rw(&store, &["--shared"], "echo $LEASE_WRITER_EPOCH"));
    assert_eq!(r.status.code(), Some(0), "{r:?}");
    assert_eq!(String::from_utf8_lossy(&r.stdout).trim(), tw.to_string());
}
