//! What a run records: each worker's operations, each write the sink saw, each
//! fault the nemesis injected. Times are `CLOCK_MONOTONIC` nanoseconds, which
//! every process on one machine shares, so the worker logs, the sink and the
//! nemesis line up in real time.

use serde::{Deserialize, Serialize};

/// `CLOCK_MONOTONIC` now, in nanoseconds (machine-wide on Linux).
pub fn mono_ns() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(ts) => (ts.tv_sec() as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(ts.tv_nsec() as u64),
        Err(_) => 0,
    }
}

/// A tokio (= std, `CLOCK_MONOTONIC`) instant as [`mono_ns`] nanoseconds.
/// The two clocks are read monotonic first, so a preemption between the
/// reads makes the result earlier, never later (a validity end is never
/// overstated).
pub fn instant_ns(at: tokio::time::Instant) -> u64 {
    let now = mono_ns();
    let now_i = tokio::time::Instant::now();
    if at >= now_i {
        now.saturating_add((at - now_i).as_nanos() as u64)
    } else {
        now.saturating_sub((now_i - at).as_nanos() as u64)
    }
}

/// One lease grant: worker, incarnation (a restarted worker process counts
/// up) and the grant's number within that incarnation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GrantId {
    /// The worker slot.
    pub worker: u32,
    /// The process incarnation of that slot.
    pub inc: u32,
    /// The grant's number within the incarnation.
    pub grant: u64,
}

/// What a grant holds: a plain lease, or one side of a read/write lease (C19).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// A plain lease: one holder at a time.
    #[default]
    Exclusive,
    /// One of any number of readers.
    Reader {
        /// The token of the last writer before it (its writer epoch).
        epoch: u64,
    },
    /// The one writer: no reader or other writer meanwhile.
    Writer,
}

impl Role {
    /// Whether two grants of these roles may not hold the key at once.
    pub fn conflicts(self, other: Role) -> bool {
        !(matches!(self, Role::Reader { .. }) && matches!(other, Role::Reader { .. }))
    }

    /// True for a reader.
    pub fn is_reader(self) -> bool {
        matches!(self, Role::Reader { .. })
    }
}

/// How a write to the sink ended, as the worker saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WriteOutcome {
    /// The sink accepted the token.
    Accepted,
    /// The sink refused it: a greater token had been written.
    Refused,
    /// No answer (the sink went away).
    Error,
}

/// One line of a worker's log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Event {
    /// The worker acquired the key.
    Grant {
        /// Which grant.
        id: GrantId,
        /// When the acquire call started.
        invoke: u64,
        /// When it returned the lease.
        ok: u64,
        /// The fencing token.
        token: u64,
        /// The end of the lease's local validity.
        valid_until: u64,
        /// Held by a renewing guard for longer than the TTL.
        long: bool,
        /// What it holds (a plain lease when absent).
        #[serde(default, skip_serializing_if = "is_exclusive")]
        role: Role,
    },
    /// An acquire that ended without the lease.
    AcquireFailed {
        /// The worker slot.
        worker: u32,
        /// Its incarnation.
        inc: u32,
        /// When the call started.
        invoke: u64,
        /// When it ended.
        done: u64,
        /// Why (the error, or that the wait ran out).
        error: String,
    },
    /// A write of the job's result to the sink.
    Write {
        /// The grant the write was made under.
        id: GrantId,
        /// A number unique within the grant.
        seq: u64,
        /// The token presented.
        token: u64,
        /// Whether the worker's lease was locally valid when it sent the write.
        valid_at_send: bool,
        /// The local validity at send time.
        valid_until: u64,
        /// When it was sent.
        invoke: u64,
        /// When the answer came.
        done: u64,
        /// The answer.
        outcome: WriteOutcome,
        /// A reader's read (its token is the reader's) rather than a write.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        read: bool,
    },
    /// The guard's lost signal fired.
    Lost {
        /// The grant lost.
        id: GrantId,
        /// When the signal fired.
        at: u64,
        /// The reason given.
        reason: String,
    },
    /// The worker released the lease (or tried to).
    Release {
        /// The grant released.
        id: GrantId,
        /// When the release started.
        invoke: u64,
        /// When it returned.
        done: u64,
        /// The local validity when the release started.
        valid_until: u64,
        /// Whether the store confirmed it.
        ok: bool,
    },
}

/// One write as the sink received it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SinkRecord {
    /// The grant it came from.
    pub id: GrantId,
    /// Its number within the grant.
    pub seq: u64,
    /// The token presented.
    pub token: u64,
    /// The worker's belief that its lease was valid when it sent it.
    pub valid_at_send: bool,
    /// The end of the writer's local validity as it sent the write.
    #[serde(default)]
    pub valid_until: u64,
    /// When the sink received it.
    pub recv: u64,
    /// Whether the sink accepted it.
    pub accepted: bool,
    /// A reader's read, checked by its writer epoch (C19), rather than a write.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read: bool,
}

fn is_exclusive(r: &Role) -> bool {
    *r == Role::Exclusive
}

/// One injected fault.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fault {
    /// Its kind (`pause`, `crash`, `partition`, `store-pause`, `minority`).
    pub kind: String,
    /// The worker it hit, when it hit one.
    pub victim: Option<u32>,
    /// When it began.
    pub start: u64,
    /// When it was healed (`start` for a crash).
    pub end: u64,
    /// A note (how the partition healed, which node).
    pub note: String,
    /// For an observed step of the host's wall clock (see
    /// [`crate::clock`]): the step, in nanoseconds (positive: forward).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_step_ns: Option<i64>,
}
