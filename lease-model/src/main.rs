//! `lease-model`: runs every model at its short bound (what CI runs through
//! the tests) or, with `--deep`, at its deep bound, and prints a table of
//! states explored, depth and verdict, broken variants included (each must
//! be caught). Exits 1 when a design breaks a property or a broken variant
//! is not caught.

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

fn main() {
    let deep = std::env::args().any(|a| a == "--deep");
    let (waiters, rl_attempts, tokens_depth, session_ticks, zk_attempts, rw_clients) = if deep {
        (3, 2, 9, 10, 3, 3)
    } else {
        (2, 1, 7, 8, 2, 2)
    };
    println!(
        "{} bounds\n\n| model | distinct states | depth | s | verdict |\n|---|---:|---:|---:|---|",
        if deep { "Deep" } else { "Short" }
    );
    let mut ok = true;
    ok &= row(
        &format!("fair queue, {waiters} waiters"),
        Kind::Design,
        || check(FairQueue::new(waiters, QueueDesign::Marked), BOUND),
    );
    ok &= row("fair queue: tickets by number alone", Kind::Broken, || {
        refute(FairQueue::new(2, QueueDesign::NumberOnly), BOUND)
    });
    ok &= row("fair queue: no expiry before a look", Kind::Broken, || {
        refute(FairQueue::new(2, QueueDesign::NoExpiryBeforeLook), BOUND)
    });
    let tokens = |design, volatile| RedlockTokens {
        nodes: 3,
        volatile,
        design,
    };
    ok &= row(
        &format!("Redlock tokens, 3 nodes, {tokens_depth} rounds"),
        Kind::DesignToDepth,
        || check(tokens(RedlockDesign::Current, false), tokens_depth),
    );
    ok &= row("Redlock tokens: no raise round", Kind::Broken, || {
        refute(tokens(RedlockDesign::NeverRaise, false), tokens_depth)
    });
    ok &= row(
        "Redlock tokens: volatile nodes (declared)",
        Kind::Broken,
        || refute(tokens(RedlockDesign::Current, true), tokens_depth),
    );
    ok &= row(
        &format!("Redlock holders, 3 nodes, 2 clients x {rl_attempts}"),
        Kind::Design,
        || {
            check(
                RedlockHolders::new(3, 2, rl_attempts, RedlockDesign::Current, false),
                BOUND,
            )
        },
    );
    ok &= row("Redlock holders: half the nodes", Kind::Broken, || {
        refute(
            RedlockHolders::new(3, 2, 1, RedlockDesign::HalfIsEnough, false),
            BOUND,
        )
    });
    ok &= row(
        "Redlock holders: volatile nodes (declared)",
        Kind::Broken,
        || {
            refute(
                RedlockHolders::new(3, 2, 1, RedlockDesign::Current, true),
                BOUND,
            )
        },
    );
    ok &= row(
        &format!("session, {session_ticks} ticks"),
        Kind::Design,
        || check(Session::until(SessionDesign::Current, session_ticks), BOUND),
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
        &format!("ZooKeeper, 2 clients x {zk_attempts}"),
        Kind::Design,
        || check(ZkLease::new(2, zk_attempts, ZkDesign::Current), BOUND),
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
    ] {
        ok &= row(name, Kind::Broken, || {
            refute(ZkLease::new(2, 2, design), BOUND)
        });
    }
    ok &= row(
        &format!("read/write, {rw_clients} clients"),
        Kind::Design,
        || check(ReadWrite::new(rw_clients, RwDesign::Current), BOUND),
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
