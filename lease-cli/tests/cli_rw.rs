//! `lease run --shared` and `--writer`: a key's read/write lease from the
//! command line.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use lease_testkit::TempDir;

const NOT_ACQUIRED: i32 = 75;
const USAGE: i32 = 64;

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

fn run(store: &str, mode: &[&str], script: &str) -> Command {
    let mut c = lease(store);
    c.args(["run", "--key", "partitions", "--ttl", "30s"])
        .args(mode)
        .args(["--", "sh", "-c", script]);
    c
}

fn wait_for_file(path: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
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
    let mut a = run(&store, &["--shared"], &hold(&a_out)).spawn().unwrap();
    let mut b = run(&store, &["--shared"], &hold(&b_out)).spawn().unwrap();
    let (ta, tb): (u64, u64) = (
        wait_for_file(&a_out).trim().parse().unwrap(),
        wait_for_file(&b_out).trim().parse().unwrap(),
    );
    assert_ne!(ta, tb);
    // A writer is refused while they hold, and says so.
    let refused = output(run(&store, &["--writer"], "echo SHOULD-NOT-RUN"));
    assert_eq!(refused.status.code(), Some(NOT_ACQUIRED), "{refused:?}");
    assert!(!String::from_utf8_lossy(&refused.stdout).contains("SHOULD-NOT-RUN"));
    let says = String::from_utf8_lossy(&refused.stderr);
    assert!(says.contains("held by 2 reader(s)"), "{says}");
    // The plain lease of the same key is another lease.
    let plain = output(run(&store, &[], "true"));
    assert_eq!(plain.status.code(), Some(0), "{plain:?}");
    // A read/write lease is one key's; the flags exclude each other.
    let mut two = lease(&store);
    two.args(["run", "--key", "x", "--key", "y", "--shared", "--", "true"]);
    assert_eq!(output(two).status.code(), Some(USAGE));
    let both = output(run(&store, &["--shared", "--writer"], "true"));
    assert_eq!(both.status.code(), Some(USAGE), "{both:?}");

    std::fs::write(&done, "").unwrap();
    assert_eq!(a.wait().unwrap().code(), Some(0));
    assert_eq!(b.wait().unwrap().code(), Some(0));
    // The writer runs now, with a token above both readers'.
    let w = output(run(
        &store,
        &["--writer", "--wait", "10s"],
        "echo $LEASE_TOKEN",
    ));
    assert_eq!(w.status.code(), Some(0), "{w:?}");
    let tw: u64 = String::from_utf8_lossy(&w.stdout).trim().parse().unwrap();
    assert!(tw > ta && tw > tb, "writer {tw} after readers {ta} {tb}");
    // A reader after it carries its token as the writer epoch.
    let r = output(run(&store, &["--shared"], "echo $LEASE_WRITER_EPOCH"));
    assert_eq!(r.status.code(), Some(0), "{r:?}");
    assert_eq!(String::from_utf8_lossy(&r.stdout).trim(), tw.to_string());
}
