//! Exhaustive model checks of the lease protocols, on
//! [stateright](https://docs.rs/stateright).
//!
//! Every safety hole found in this project so far sat in an interleaving no
//! example test happened to drive. Each model here explores *every*
//! interleaving of a protocol's steps (within a bound on time and depth)
//! and checks its safety properties in every state it reaches. The models
//! decide with the code the providers call, not a copy of it:
//!
//! | model | protocol | decision code it runs |
//! |---|---|---|
//! | [`redlock`] | Redlock acquire, raise, release and cancel over N nodes | `lease_redis::protocol::{quorum, token_step}`, [`Lease`](lease_api::Lease)'s validity |
//! | [`fair_queue`] | a queue of waiters kept by TTL and mark (memory, Redis, PostgreSQL) | [`lease_api::backend::queue_rules`] |
//! | [`session`] | a session's batched renewals | [`Lease::renewed`](lease_api::Lease::renewed), [`SessionTiming`](lease_api::backend::SessionTiming) |
//! | [`zk_epoch`] | ZooKeeper's one-multi extend and its takeover of an expired holder | `lease_zk::protocol` |
//! | [`read_write`] | read/write leases with a waiting writer's record | [`lease_api::backend::rw_rules`] |
//!
//! Where a store script decides (Lua, SQL, a ZooKeeper multi), the model
//! states what the script does, and a test on the real store pins the
//! script to it (named in each model's docs).
//!
//! Each model also has broken variants, the design with its key step
//! removed; the tests require the checker to find a counterexample in each,
//! so a model that cannot fail proves nothing.
//!
//! ```
//! use lease_model::{check, fair_queue::{FairQueue, QueueDesign}};
//!
//! let report = check(FairQueue::new(2, QueueDesign::Marked), 12);
//! assert!(report.holds(), "{report}");
//! assert!(report.unique_states > 100);
//! ```

use std::fmt;
use std::hash::Hash;

use stateright::{Checker, Expectation, HasDiscoveries, Model};

pub mod fair_queue;
pub mod read_write;
pub mod redlock;
pub mod session;
pub mod zk_epoch;

/// A lease's local validity in ms after its request was sent, for a TTL of
/// `ttl_ms`: what [`Lease::new`](lease_api::Lease::new) gives it.
pub fn local_validity_ms(ttl_ms: u64) -> u32 {
    let sent = tokio::time::Instant::now();
    lease_api::LeaseKey::new("model").map_or(0, |key| {
        let ttl = std::time::Duration::from_millis(ttl_ms);
        let owner = lease_api::backend::OwnerId::random();
        let lease = lease_api::Lease::new(key, lease_api::FencingToken(0), owner, ttl, sent);
        u32::try_from((lease.valid_until() - sent).as_millis()).unwrap_or(0)
    })
}

/// What one exhaustive run found.
#[derive(Debug)]
pub struct Report {
    /// The model's name.
    pub model: String,
    /// States generated (with repeats).
    pub states: usize,
    /// Distinct states explored.
    pub unique_states: usize,
    /// The deepest path explored.
    pub depth: usize,
    /// Whether every reachable state was explored: no path reached the
    /// depth bound.
    pub exhaustive: bool,
    /// Safety properties broken, each with the shortest path that breaks it.
    pub violations: Vec<(&'static str, String)>,
    /// "Sometimes" properties never met: the model could not reach what it
    /// must be able to (a vacuous model).
    pub unreached: Vec<&'static str>,
}

impl Report {
    /// No property broken and every example reached.
    pub fn holds(&self) -> bool {
        self.violations.is_empty() && self.unreached.is_empty()
    }

    /// Whether the safety property `name` was broken.
    pub fn broke(&self, name: &str) -> bool {
        self.violations.iter().any(|(n, _)| *n == name)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}: {} distinct states ({} generated), depth {}{}",
            self.model,
            self.unique_states,
            self.states,
            self.depth,
            if self.exhaustive {
                ", exhaustive"
            } else {
                ", bounded"
            }
        )?;
        for (name, path) in &self.violations {
            writeln!(f, "BROKEN: {name}\n{path}")?;
        }
        for name in &self.unreached {
            writeln!(f, "NEVER REACHED: {name}")?;
        }
        Ok(())
    }
}

/// Explores every state of `model` up to `depth` steps (depth first, on
/// this thread) and reports.
pub fn check<M>(model: M, depth: usize) -> Report
where
    M: Model + fmt::Debug + Send + Sync + 'static,
    M::State: Hash + Send + Sync + Clone + PartialEq + fmt::Debug + 'static,
    M::Action: Clone + PartialEq + fmt::Debug,
{
    run(model, depth, false)
}

/// [`check`] breadth first, stopping at the first broken property (so its
/// counterexample is a shortest one): for the broken variants, whose whole
/// space need not be explored to be refuted.
pub fn refute<M>(model: M, depth: usize) -> Report
where
    M: Model + fmt::Debug + Send + Sync + 'static,
    M::State: Hash + Send + Sync + Clone + PartialEq + fmt::Debug + 'static,
    M::Action: Clone + PartialEq + fmt::Debug,
{
    run(model, depth, true)
}

fn run<M>(model: M, depth: usize, stop_at_failure: bool) -> Report
where
    M: Model + fmt::Debug + Send + Sync + 'static,
    M::State: Hash + Send + Sync + Clone + PartialEq + fmt::Debug + 'static,
    M::Action: Clone + PartialEq + fmt::Debug,
{
    let name = format!("{model:?}");
    let properties: Vec<(&'static str, Expectation)> = model
        .properties()
        .into_iter()
        .map(|p| (p.name, p.expectation))
        .collect();
    let builder = model.checker().target_max_depth(depth);
    // Breadth first finds the shortest counterexample; depth first keeps
    // only the path in memory, for the full explorations.
    if stop_at_failure {
        let checker = builder
            .finish_when(HasDiscoveries::AnyFailures)
            .spawn_bfs()
            .join();
        summarize(name, properties, &checker, depth)
    } else {
        summarize(name, properties, &builder.spawn_dfs().join(), depth)
    }
}

fn summarize<M, C>(
    name: String,
    properties: Vec<(&'static str, Expectation)>,
    checker: &C,
    bound: usize,
) -> Report
where
    M: Model,
    M::State: Hash + Clone + PartialEq + fmt::Debug,
    M::Action: Clone + PartialEq + fmt::Debug,
    C: Checker<M>,
{
    let mut violations = Vec::new();
    let mut unreached = Vec::new();
    for (property, expectation) in properties {
        let found = checker.discovery(property);
        match (expectation, found) {
            (Expectation::Sometimes, None) => unreached.push(property),
            (Expectation::Sometimes, Some(_)) | (_, None) => {}
            (_, Some(path)) => {
                let steps: Vec<String> = path
                    .into_actions()
                    .iter()
                    .map(|a| format!("  {a:?}"))
                    .collect();
                violations.push((property, steps.join("\n")));
            }
        }
    }
    Report {
        model: name,
        states: checker.state_count(),
        unique_states: checker.unique_state_count(),
        depth: checker.max_depth(),
        exhaustive: checker.max_depth() < bound,
        violations,
        unreached,
    }
}
