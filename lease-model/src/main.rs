//! `lease-model`: runs every model at its short bound (what CI runs through
//! the tests) or, with `--deep`, at its deep bound, and prints a table of
//! states explored, depth and verdict, broken variants included (each must
//! be caught). Exits 1 when a design breaks a property or is not explored
//! exhaustively, or a broken variant is not caught.

use std::time::Instant;

use lease_model::fair_queue::{FairQueue, QueueDesign};
use lease_model::read_write::{ReadWrite, RwDesign};
use lease_model::redlock::{RedlockDesign, RedlockHolders, RedlockTokens};
use lease_model::session::{Session, SessionDesign};
use lease_model::zk_epoch::{ZkDesign, ZkLease};
use lease_model::{Report, check, refute};

/// Deeper than any model's path at these bounds.
const BOUND: usize = 10_000;

/// How a row is judged.
#[derive(PartialEq)]
enum Kind {
    /// The design: holds, every reachable state explored.
    Design,
    /// The design, explored to a depth (its space has no end).
    DesignToDepth,
    /// A broken variant: must break a property.
    Broken,
}

/// One row: the run's report, judged by `kind`.
fn row(name: &str, kind: Kind, run: impl FnOnce() -> Report) -> bool {
    let started = Instant::now();
    let r = run();
    let (ok, verdict) = match kind {
        Kind::Broken if r.violations.is_empty() => (false, "NOT CAUGHT".to_string()),
        Kind::Broken => (true, format!("caught: {}", names(&r))),
        _ if !r.holds() => (false, format!("BROKEN: {}", names(&r))),
        Kind::Design if !r.exhaustive => (false, "NOT EXHAUSTIVE".to_string()),
        Kind::Design => (true, "holds (exhaustive)".to_string()),
        Kind::DesignToDepth => (true, format!("holds (every path of {} steps)", r.depth)),
    };
    println!(
        "| {name} | {} | {} | {:.1} | {verdict} |",
        r.unique_states,
        r.depth,
        started.elapsed().as_secs_f64()
    );
    ok
}

fn names(r: &Report) -> String {
    let mut v: Vec<&str> = r.violations.iter().map(|(n, _)| *n).collect();
    v.extend(r.unreached.iter().copied());
    v.join("; ")
}

/// The bounds of one run.
struct Bounds {
    queue_ticks: u8,
    redlock_rounds: u8,
    token_rounds: usize,
    session_ticks: u8,
    zk_acquires: u8,
    rw_clients: u8,
}

fn main() {
    let deep = std::env::args().any(|a| a == "--deep");
    let b = if deep {
        Bounds {
            queue_ticks: 6,
            redlock_rounds: 2,
            token_rounds: 9,
            session_ticks: 10,
            zk_acquires: 3,
            rw_clients: 4,
        }
    } else {
        Bounds {
            queue_ticks: 4,
            redlock_rounds: 1,
            token_rounds: 7,
            session_ticks: 8,
            zk_acquires: 2,
            rw_clients: 2,
        }
    };
    println!(
        "{} bounds\n\n| model | distinct states | depth | s | verdict |\n|---|---:|---:|---:|---|",
        if deep { "Deep" } else { "Short" }
    );
    let mut ok = true;
    let queue = FairQueue {
        horizon: b.queue_ticks,
        ..FairQueue::new(2, QueueDesign::Marked)
    };
    ok &= row(
        &format!("fair queue, 2 waiters, {} ticks", b.queue_ticks),
        Kind::Design,
        || check(queue, BOUND),
    );
    for (name, design) in [
        (
            "fair queue: tickets by number alone",
            QueueDesign::NumberOnly,
        ),
        (
            "fair queue: no expiry before a look",
            QueueDesign::NoExpiryBeforeLook,
        ),
    ] {
        ok &= row(name, Kind::Broken, || {
            refute(FairQueue::new(2, design), BOUND)
        });
    }
    let tokens = |design, volatile| RedlockTokens {
        nodes: 3,
        volatile,
        design,
    };
    ok &= row(
        &format!("Redlock tokens, 3 nodes, {} rounds", b.token_rounds),
        Kind::DesignToDepth,
        || check(tokens(RedlockDesign::Current, false), b.token_rounds),
    );
    ok &= row("Redlock tokens: no raise round", Kind::Broken, || {
        refute(tokens(RedlockDesign::NeverRaise, false), b.token_rounds)
    });
    ok &= row(
        "Redlock tokens: volatile nodes (declared)",
        Kind::Broken,
        || refute(tokens(RedlockDesign::Current, true), b.token_rounds),
    );
    let holders = |rounds, design, volatile| RedlockHolders::new(3, 2, rounds, design, volatile);
    ok &= row(
        &format!("Redlock holders, 3 nodes, 2 clients x {}", b.redlock_rounds),
        Kind::Design,
        || {
            check(
                holders(b.redlock_rounds, RedlockDesign::Current, false),
                BOUND,
            )
        },
    );
    ok &= row("Redlock holders: half the nodes", Kind::Broken, || {
        refute(holders(1, RedlockDesign::HalfIsEnough, false), BOUND)
    });
    ok &= row(
        "Redlock holders: volatile nodes (declared)",
        Kind::Broken,
        || refute(holders(1, RedlockDesign::Current, true), BOUND),
    );
    ok &= row(
        &format!("session, {} ticks", b.session_ticks),
        Kind::Design,
        || {
            check(
                Session::until(SessionDesign::Current, b.session_ticks),
                BOUND,
            )
        },
    );
    for (name, design) in [
        (
            "session: validity from the answer",
            SessionDesign::ValidityFromAnswer,
        ),
        ("session: a batch renewed as one", SessionDesign::BatchAsOne),
        (
            "session: fires held back by a round",
            SessionDesign::FireAfterRound,
        ),
    ] {
        ok &= row(name, Kind::Broken, || refute(Session::new(design), BOUND));
    }
    ok &= row(
        &format!("ZooKeeper, 2 clients x {}", b.zk_acquires),
        Kind::Design,
        || check(ZkLease::new(2, b.zk_acquires, ZkDesign::Current), BOUND),
    );
    for (name, design) in [
        (
            "ZooKeeper: fast path without the marker",
            ZkDesign::NoMarkerCheck,
        ),
        (
            "ZooKeeper: takeover without the epoch",
            ZkDesign::NoEpochCheckOnTakeover,
        ),
        (
            "ZooKeeper: takeover without the judged marker",
            ZkDesign::NoJudgedMarkerCheck,
        ),
        (
            "ZooKeeper: clean-up without the epoch",
            ZkDesign::CleanupWithoutEpoch,
        ),
    ] {
        ok &= row(name, Kind::Broken, || {
            refute(ZkLease::new(2, 2, design), BOUND)
        });
    }
    ok &= row(
        &format!("read/write, {} clients", b.rw_clients),
        Kind::Design,
        || check(ReadWrite::new(b.rw_clients, RwDesign::Current), BOUND),
    );
    for (name, design) in [
        (
            "read/write: readers ignore a waiting writer",
            RwDesign::ReadersIgnoreWaitingWriter,
        ),
        (
            "read/write: a writer ignores readers",
            RwDesign::WriterIgnoresReaders,
        ),
    ] {
        ok &= row(name, Kind::Broken, || {
            refute(ReadWrite::new(2, design), BOUND)
        });
    }
    if !ok {
        std::process::exit(1);
    }
}
