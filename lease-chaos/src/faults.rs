//! The nemesis: the faults a run can inject (`FaultKind`), the members of a
//! replicated store they act on, and injecting one fault on a run's workers,
//! links or store nodes, then healing it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use rand::Rng;
use rand::rngs::StdRng;

use crate::history::{Fault, mono_ns};
use crate::sink::Sink;
use crate::workload::{Run, signal_store};

/// A fault the nemesis can inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum)]
pub enum FaultKind {
    /// No fault: the baseline (ignored next to other kinds).
    None,
    /// SIGSTOP the worker holding the key for over twice the TTL, then SIGCONT
    /// (a GC pause mid-job).
    Pause,
    /// `kill -9` the worker holding the key; a new process takes its slot.
    Crash,
    /// Black-hole every link between the holder and the store for over twice
    /// the TTL; heal by resuming (late packets) or resetting the connections.
    Partition,
    /// SIGSTOP the store's processes (`--store-pid`) for twice the TTL.
    StorePause,
    /// Black-hole a minority of the store's nodes from every worker for three
    /// TTLs (Redlock, or any store with several endpoints).
    Minority,
    /// Redis and Redlock: jump one node's clock forward by two TTLs while a
    /// holder holds, then back. On three or more nodes this is Kleppmann's
    /// Redlock scenario: another node is cut first, so the holder holds
    /// exactly a majority including the jumped node; the cut heals as the
    /// clock jumps. The jump is applied to the run's keys on that node (every
    /// expiry moves by the jump, as a real one moves them): Debian's
    /// redis-server links jemalloc, which libfaketime cannot run under
    /// (libfaketime#130).
    ClockJump,
    /// Redis and Redlock: one node loses the run's keys and counters, as a node
    /// restarted without persistence does, while a holder holds (on three or
    /// more nodes with another node cut first, as for clock-jump: the one
    /// whose counter is furthest behind; on three nodes the holder's other
    /// node is then kept out for two TTLs, so the next majority, the wiped
    /// node and the cut one, issues a token that goes back).
    NodeWipe,
    /// A replicated store ([`run_with_members`](crate::run_with_members)): `kill -9` the leader (for
    /// Redlock, a node) while a holder holds, and restart it on its own data
    /// two TTLs later.
    LeaderKill,
    /// A replicated store ([`run_with_members`](crate::run_with_members)): SIGSTOP the leader for two
    /// TTLs while a holder holds, then SIGCONT: the others elect a new
    /// leader, and the old one wakes up thinking it still leads.
    LeaderPause,
    /// A replicated store whose members reach each other through links the
    /// run controls ([`Members::can_isolate`]): cut the leader off from the
    /// other members and from their coordination store while a holder
    /// holds, its clients still reaching it, for two TTLs or as long as the
    /// store needs to elect another leader ([`Members::isolation_hold`]),
    /// then heal. The split-brain case: a leader that still serves, and a
    /// successor elected beside it.
    LeaderIsolate,
}

/// The members of a replicated store, for the nemesis's leader faults. The
/// calls block (they signal processes and ask the store who leads); the
/// run makes them off its runtime.
pub trait Members: Send {
    /// The member that leads now; for a store without a leader (Redlock),
    /// any member that runs.
    fn leader(&mut self) -> Option<usize>;
    /// `kill -9` of a member.
    fn kill(&mut self, member: usize);
    /// Starts a killed member again on its own data, and waits until the
    /// store is whole again.
    fn restart(&mut self, member: usize);
    /// SIGSTOP of a member.
    fn freeze(&mut self, member: usize);
    /// SIGCONT of a frozen member.
    fn thaw(&mut self, member: usize);
    /// True when [`isolate`](Self::isolate) can cut a member off from the
    /// others: their links run through proxies the run controls.
    fn can_isolate(&self) -> bool {
        false
    }
    /// Cuts a member off from the other members while clients still reach
    /// it (nothing when [`can_isolate`](Self::can_isolate) is false).
    fn isolate(&mut self, member: usize) {
        let _ = member;
    }
    /// Heals an isolated member's links, and waits until the store is
    /// whole again.
    fn rejoin(&mut self, member: usize) {
        let _ = member;
    }
    /// How long an isolation must last for the others to act on it.
    fn isolation_hold(&self) -> Duration {
        Duration::ZERO
    }
}

/// The members, shared between the run and the blocking calls on them.
pub(crate) type SharedMembers = Arc<std::sync::Mutex<Box<dyn Members>>>;

/// Runs `f` on the members, off the runtime.
async fn on_members<T: Send + 'static>(
    members: &SharedMembers,
    f: impl FnOnce(&mut dyn Members) -> T + Send + 'static,
) -> Result<T, String> {
    let m = Arc::clone(members);
    tokio::task::spawn_blocking(move || {
        let mut guard = m.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        f(guard.as_mut())
    })
    .await
    .map_err(|e| format!("a member fault failed: {e}"))
}

impl FaultKind {
    /// The name used in reports (`pause`, `store-pause`, ...).
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::None => "none",
            FaultKind::Pause => "pause",
            FaultKind::Crash => "crash",
            FaultKind::Partition => "partition",
            FaultKind::StorePause => "store-pause",
            FaultKind::Minority => "minority",
            FaultKind::ClockJump => "clock-jump",
            FaultKind::NodeWipe => "node-wipe",
            FaultKind::LeaderKill => "leader-kill",
            FaultKind::LeaderPause => "leader-pause",
            FaultKind::LeaderIsolate => "leader-isolate",
        }
    }
}

/// What one turn of the nemesis did.
pub(crate) enum Injection {
    /// The fault was injected.
    Injected(Fault),
    /// A clock jump or node wipe found no holder (or no key) after it cut a
    /// node: the cut alone, recorded as the minority fault it was.
    CutOnly(Fault),
    /// No holder to aim at right now: the kind stays due and is tried again
    /// after the next gap.
    Retry,
    /// Nothing was injected this turn.
    Skipped,
}

/// The nemesis: what it needs to aim faults besides the [`Run`] it acts on.
pub(crate) struct Nemesis<'a> {
    /// The sink, which knows who holds the key.
    pub(crate) sink: &'a Sink,
    /// The TTL of the run's leases.
    pub(crate) ttl: Duration,
    /// How many nodes the store has (0 when it names no host).
    pub(crate) nodes: usize,
    /// The store's nodes, as the proxies reach them.
    pub(crate) targets: Vec<SocketAddr>,
    /// The members of a replicated store, for the leader faults.
    pub(crate) members: Option<SharedMembers>,
    /// Member faults that could not be injected or healed: they end in the
    /// report, not in an aborted run.
    pub(crate) member_failures: Vec<String>,
}

impl Nemesis<'_> {
    /// Injects one fault of `kind` on `run` and heals it.
    pub(crate) async fn inject(
        &mut self,
        run: &mut Run,
        kind: FaultKind,
        jitter: Duration,
        rng: &mut StdRng,
    ) -> Result<Injection, String> {
        let sink = self.sink;
        let ttl = self.ttl;
        let nodes = self.nodes;
        let fault = match kind {
            FaultKind::None => return Ok(Injection::Skipped),
            FaultKind::Pause | FaultKind::Crash | FaultKind::Partition => {
                // No holder to aim at right now: the kind stays due and is
                // tried again after the next gap.
                let Some(victim) = pick_holder(sink, ttl * 2).await else {
                    return Ok(Injection::Retry);
                };
                let Some(pid) = run.pid(victim) else {
                    return Ok(Injection::Retry);
                };
                let begin = mono_ns();
                let note = match kind {
                    FaultKind::Pause => {
                        let _ = kill(pid, Signal::SIGSTOP);
                        tokio::time::sleep(ttl * 2 + jitter).await;
                        let _ = kill(pid, Signal::SIGCONT);
                        String::new()
                    }
                    FaultKind::Crash => {
                        let _ = kill(pid, Signal::SIGKILL);
                        sink.forget(victim);
                        run.restart(victim)?;
                        String::new()
                    }
                    _ => {
                        let reset = rng.random_bool(0.5);
                        for p in &run.slots[victim as usize].proxies {
                            p.hole();
                        }
                        tokio::time::sleep(ttl * 2 + jitter).await;
                        for p in &run.slots[victim as usize].proxies {
                            p.heal(reset);
                        }
                        if reset { "reset" } else { "resume" }.to_string()
                    }
                };
                let end = if kind == FaultKind::Crash {
                    begin
                } else {
                    mono_ns()
                };
                Fault {
                    kind: kind.name().into(),
                    victim: Some(victim),
                    start: begin,
                    end,
                    note,
                    wall_step_ns: None,
                }
            }
            FaultKind::LeaderKill | FaultKind::LeaderPause | FaultKind::LeaderIsolate => {
                let Some(members) = &self.members else {
                    return Ok(Injection::Skipped);
                };
                // While somebody holds: the fault lands mid-lease, and stays
                // due until then (a cell whose faults leave it unavailable
                // for long had none left to inject before its deadline).
                if pick_holder(sink, ttl * 2).await.is_none() {
                    return Ok(Injection::Retry);
                }
                let Some(leader) = on_members(members, |m| m.leader()).await? else {
                    return Ok(Injection::Skipped);
                };
                let begin = mono_ns();
                let hold = if kind == FaultKind::LeaderIsolate {
                    on_members(members, |m| m.isolation_hold())
                        .await
                        .unwrap_or_default()
                } else {
                    Duration::ZERO
                };
                let hit = match kind {
                    FaultKind::LeaderKill => on_members(members, move |m| m.kill(leader)).await,
                    FaultKind::LeaderPause => on_members(members, move |m| m.freeze(leader)).await,
                    _ => on_members(members, move |m| m.isolate(leader)).await,
                };
                let held = if kind == FaultKind::LeaderIsolate {
                    (ttl * 2).max(hold)
                } else {
                    ttl * 2
                };
                tokio::time::sleep(held + jitter).await;
                // Recovery from a killed leader counts from the kill, as
                // for a crashed worker; from a frozen or isolated one, from
                // the heal.
                let end = if kind == FaultKind::LeaderKill {
                    begin
                } else {
                    mono_ns()
                };
                let healed = match kind {
                    FaultKind::LeaderKill => on_members(members, move |m| m.restart(leader)).await,
                    FaultKind::LeaderPause => on_members(members, move |m| m.thaw(leader)).await,
                    _ => on_members(members, move |m| m.rejoin(leader)).await,
                };
                // A member that cannot be hit or brought back ends in the
                // report, not in an aborted run.
                for r in [hit, healed] {
                    if let Err(e) = r {
                        self.member_failures
                            .push(format!("{} of member {leader}: {e}", kind.name()));
                    }
                }
                Fault {
                    kind: kind.name().into(),
                    victim: None,
                    start: begin,
                    end,
                    note: format!("member {leader}"),
                    wall_step_ns: None,
                }
            }
            FaultKind::StorePause => {
                let begin = mono_ns();
                for &pid in &run.store_pids {
                    signal_store(pid, Signal::SIGSTOP);
                }
                tokio::time::sleep(ttl * 2 + jitter).await;
                for &pid in &run.store_pids {
                    signal_store(pid, Signal::SIGCONT);
                }
                Fault {
                    kind: kind.name().into(),
                    victim: None,
                    start: begin,
                    end: mono_ns(),
                    note: String::new(),
                    wall_step_ns: None,
                }
            }
            FaultKind::Minority => {
                let minority = (nodes - 1) / 2;
                let first = rng.random_range(0..nodes);
                let cut: Vec<usize> = (0..minority).map(|i| (first + i) % nodes).collect();
                let reset = rng.random_bool(0.5);
                let begin = mono_ns();
                for s in &run.slots {
                    for &n in &cut {
                        s.proxies[n].hole();
                    }
                }
                tokio::time::sleep(ttl * 3 + jitter).await;
                for s in &run.slots {
                    for &n in &cut {
                        s.proxies[n].heal(reset);
                    }
                }
                Fault {
                    kind: kind.name().into(),
                    victim: None,
                    start: begin,
                    end: mono_ns(),
                    note: format!("nodes {cut:?}, {}", if reset { "reset" } else { "resume" }),
                    wall_step_ns: None,
                }
            }
            FaultKind::ClockJump | FaultKind::NodeWipe => {
                let node_url = |i: usize| format!("redis://{}", self.targets[i]);
                let (k, cut) = if kind == FaultKind::NodeWipe && nodes >= 3 {
                    // The node cut is the one whose counter is furthest
                    // behind: the holder's majority then has a higher
                    // counter, and once the other node of that majority is
                    // wiped, the next majority (the wiped node and the cut
                    // one) issues a token not greater than the holder's.
                    // With a node picked at random, a cut node whose counter
                    // happened to be ahead hid the regression Volatile
                    // declares. A node that cannot be read (down after an earlier
                    // fault) leaves the choice to chance, as before.
                    let behind = match furthest_behind(&node_url, nodes, &run.key).await {
                        Ok(b) => b,
                        Err(_) => rng.random_range(0..nodes),
                    };
                    let k = (behind + 1 + rng.random_range(0..nodes - 1)) % nodes;
                    (k, Some(behind))
                } else {
                    let k = rng.random_range(0..nodes);
                    (
                        k,
                        (nodes >= 3).then(|| (k + 1 + rng.random_range(0..nodes - 1)) % nodes),
                    )
                };
                let begin = mono_ns();
                if let Some(c) = cut {
                    for s in &run.slots {
                        s.proxies[c].hole();
                    }
                }
                // A holder whose grant came after the cut holds exactly a
                // majority that includes node k.
                let holder = pick_holder_since(sink, begin, ttl * 4).await;
                let jump = ttl * 2;
                let acted = match holder {
                    Some(_) => shift_keys(&node_url(k), &run.key, kind, -(jump.as_millis() as i64))
                        .await
                        .map_err(|e| format!("{} on node {k}: {e}", kind.name())),
                    None => Ok(0),
                };
                // On three nodes the holder's majority is k and one other
                // node. Kept out until the fault ends, that node cannot join
                // the next majority, which is then the wiped node and the
                // one that missed the grant, and its token goes back. (With
                // it free to answer, a majority including it issued a token
                // above the holder's, and the chaos test now and then saw
                // no regression in four wipes.)
                let kept_out = match (kind, cut, &acted, holder) {
                    (FaultKind::NodeWipe, Some(c), Ok(n), Some(_)) if *n > 0 && nodes == 3 => {
                        (0..nodes).find(|&i| i != k && i != c)
                    }
                    _ => None,
                };
                if let Some(o) = kept_out {
                    for s in &run.slots {
                        s.proxies[o].hole();
                    }
                }
                if let Some(c) = cut {
                    for s in &run.slots {
                        s.proxies[c].heal(true);
                    }
                }
                let touched = acted?;
                if holder.is_none() || touched == 0 {
                    // The cut happened, the jump or wipe did not: recorded
                    // as what it was.
                    return Ok(match cut {
                        Some(c) => Injection::CutOnly(Fault {
                            kind: FaultKind::Minority.name().into(),
                            victim: None,
                            start: begin,
                            end: mono_ns(),
                            note: format!("node {c} (no holder for {})", kind.name()),
                            wall_step_ns: None,
                        }),
                        None => Injection::Skipped,
                    });
                }
                tokio::time::sleep(ttl * 2 + jitter).await;
                if let Some(o) = kept_out {
                    for s in &run.slots {
                        s.proxies[o].heal(true);
                    }
                }
                if kind == FaultKind::ClockJump {
                    // And back: what was set during the jump lives longer.
                    shift_keys(&node_url(k), &run.key, kind, jump.as_millis() as i64)
                        .await
                        .map_err(|e| format!("clock-jump back on node {k}: {e}"))?;
                }
                Fault {
                    kind: kind.name().into(),
                    victim: None,
                    start: begin,
                    end: mono_ns(),
                    note: format!("node {k}, cut {cut:?}, kept out {kept_out:?}, {touched} keys"),
                    wall_step_ns: None,
                }
            }
        };
        Ok(Injection::Injected(fault))
    }
}

/// The worker to aim at: one in a long hold if any says so within `within`,
/// else the newest holder.
async fn pick_holder(sink: &Sink, within: Duration) -> Option<u32> {
    let until = tokio::time::Instant::now() + within;
    loop {
        let holders = sink.holders();
        if let Some(h) = holders.iter().find(|h| h.long) {
            return Some(h.id.worker);
        }
        if tokio::time::Instant::now() >= until {
            // Whoever holds now, not whoever held when the wait began.
            return sink.holders().first().map(|h| h.id.worker);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Like [`pick_holder`], for a grant reported after `since` only: one in a
/// long hold if one comes within `within`, else the newest.
async fn pick_holder_since(sink: &Sink, since: u64, within: Duration) -> Option<u32> {
    let until = tokio::time::Instant::now() + within;
    loop {
        let holders = sink.holders();
        let fresh = || holders.iter().filter(|h| h.since > since);
        if let Some(h) = fresh().find(|h| h.long) {
            return Some(h.id.worker);
        }
        if tokio::time::Instant::now() >= until {
            return fresh().next().map(|h| h.id.worker);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The node (of `nodes`) whose fence counter for the run's key is lowest
/// (a node without one counts as 0; the first of equal ones).
async fn furthest_behind(
    node_url: &impl Fn(usize) -> String,
    nodes: usize,
    key: &str,
) -> Result<usize, String> {
    let mut lowest = (0, i64::MAX);
    for i in 0..nodes {
        let n = fence_counter(&node_url(i), key)
            .await
            .map_err(|e| format!("reading node {i}'s counter: {e}"))?;
        if n < lowest.1 {
            lowest = (i, n);
        }
    }
    Ok(lowest.0)
}

/// The highest fence counter of the run's key on one Redis node (0 if none).
async fn fence_counter(node: &str, key: &str) -> Result<i64, String> {
    const SCRIPT: &str = r"
local n = 0
for _, k in ipairs(redis.call('KEYS', ARGV[1])) do
  local v = tonumber(redis.call('GET', k)) or 0
  if v > n then n = v end
end
return n";
    run_script(node, SCRIPT, &[format!("*{key}*:fence")]).await
}

/// Moves the expiry of every key of the run on one Redis node by `delta_ms`
/// (a clock jump of `-delta_ms`: keys whose time runs out are deleted, as the
/// node would expire them), or deletes them all (`NodeWipe`). Only keys that
/// contain the run's key are touched, so a shared node's other keys are not.
/// Returns how many keys it touched.
async fn shift_keys(node: &str, key: &str, kind: FaultKind, delta_ms: i64) -> Result<i64, String> {
    const SCRIPT: &str = r"
local n = 0
for _, k in ipairs(redis.call('KEYS', ARGV[1])) do
  if ARGV[3] == 'wipe' then
    redis.call('DEL', k)
    n = n + 1
  else
    local p = redis.call('PTTL', k)
    if p > 0 then
      local np = p + tonumber(ARGV[2])
      if np <= 0 then redis.call('DEL', k) else redis.call('PEXPIRE', k, np) end
      n = n + 1
    end
  end
end
return n";
    let mode = if kind == FaultKind::NodeWipe {
        "wipe"
    } else {
        "shift"
    };
    run_script(
        node,
        SCRIPT,
        &[format!("*{key}*"), delta_ms.to_string(), mode.to_owned()],
    )
    .await
}

/// Runs `script` with `args` on one Redis node, on a connection of its own,
/// each step bounded by 5 s.
async fn run_script(node: &str, script: &str, args: &[String]) -> Result<i64, String> {
    let client = redis::Client::open(node).map_err(|e| e.to_string())?;
    let mut conn = tokio::time::timeout(
        Duration::from_secs(5),
        client.get_multiplexed_async_connection(),
    )
    .await
    .map_err(|_| "the node did not answer".to_string())?
    .map_err(|e| e.to_string())?;
    let script = redis::Script::new(script);
    let mut invocation = script.prepare_invoke();
    for a in args {
        invocation.arg(a);
    }
    tokio::time::timeout(Duration::from_secs(5), invocation.invoke_async(&mut conn))
        .await
        .map_err(|_| "the node did not answer the script".to_string())?
        .map_err(|e| e.to_string())
}
