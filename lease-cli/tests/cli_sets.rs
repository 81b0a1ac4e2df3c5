//! `lease run --key a --key b`: every key or none, for the command's whole run.

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
