//! The host's wall clock, watched during a run: a step of `CLOCK_REALTIME`
//! against `CLOCK_MONOTONIC` (an NTP step, a VM resumed, someone's `date
//! -s`) moves every expiry a store judges on a wall clock (PostgreSQL's
//! `clock_timestamp()`, Redis' PX, ZooKeeper's mtime) without any fault of
//! ours. The checker needs to know, or it blames the backend.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::history::{Fault, mono_ns};

/// The kind of the [`Fault`] a step is recorded as (observed, not injected).
pub const WALL_CLOCK_STEP: &str = "wall-clock-step";

/// How often the clocks are compared.
const EVERY: Duration = Duration::from_millis(10);

/// Steps smaller than this are not recorded: scheduling noise between two
/// reads is discarded below, and NTP slews at most 0.5 ms per second.
const THRESHOLD_NS: i64 = 2_000_000;

/// A reading of the two clocks whose monotonic reads, taken around the wall
/// clock's, lie this close: a preemption between them would skew the offset.
const TIGHT_NS: u64 = 200_000;

fn realtime_ns() -> Option<i64> {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_REALTIME).ok()?;
    Some(
        ts.tv_sec()
            .saturating_mul(1_000_000_000)
            .saturating_add(ts.tv_nsec()),
    )
}

/// `CLOCK_REALTIME - CLOCK_MONOTONIC` now, in nanoseconds, and the monotonic
/// time of the reading; `None` when no reading in a few tries was tight.
fn offset() -> Option<(u64, i64)> {
    for _ in 0..5 {
        let before = mono_ns();
        let wall = realtime_ns()?;
        let after = mono_ns();
        if after.saturating_sub(before) <= TIGHT_NS {
            let mid = before + (after - before) / 2;
            return Some((mid, wall.saturating_sub(i64::try_from(mid).ok()?)));
        }
    }
    None
}

/// Turns consecutive readings into steps: each change of the offset larger
/// than the threshold is one, dated from the reading before it to the one
/// that saw it.
fn steps_between(prev: (u64, i64), now: (u64, i64)) -> Option<Fault> {
    let delta = now.1.saturating_sub(prev.1);
    (delta.abs() > THRESHOLD_NS).then(|| Fault {
        kind: WALL_CLOCK_STEP.into(),
        victim: None,
        start: prev.0,
        end: now.0,
        note: format!("{:+.1} ms", delta as f64 / 1e6),
        wall_step_ns: Some(delta),
    })
}

/// Watches the wall clock from [`start`](Self::start) until dropped.
pub struct WallClockWatch {
    steps: Arc<Mutex<Vec<Fault>>>,
    task: tokio::task::JoinHandle<()>,
}

impl WallClockWatch {
    /// Starts comparing the clocks every 10 ms on the current runtime.
    pub fn start() -> Self {
        let steps = Arc::new(Mutex::new(Vec::new()));
        let out = Arc::clone(&steps);
        let task = tokio::spawn(async move {
            let mut prev = offset();
            let mut tick = tokio::time::interval(EVERY);
            loop {
                tick.tick().await;
                let Some(now) = offset() else { continue };
                if let Some(step) = prev.and_then(|p| steps_between(p, now)) {
                    out.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(step);
                }
                prev = Some(now);
            }
        });
        WallClockWatch { steps, task }
    }

    /// The steps seen so far, as faults of kind [`WALL_CLOCK_STEP`] whose
    /// note is the step (`+412.0 ms`: the wall clock went forward).
    pub fn steps(&self) -> Vec<Fault> {
        self.steps
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for WallClockWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The forward steps of the wall clock, in nanoseconds, recorded in
/// `faults` between `from` and `to` (monotonic): how much earlier than its
/// holder's local validity a wall-clock expiry set before `from` may have
/// come.
pub fn forward_steps_ns(faults: &[Fault], from: u64, to: u64) -> u64 {
    faults
        .iter()
        .filter(|f| f.kind == WALL_CLOCK_STEP && f.end > from && f.start < to)
        .filter_map(|f| f.wall_step_ns)
        .filter(|ns| *ns > 0)
        .map(|ns| ns.unsigned_abs())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_of_offset_past_the_threshold_is_a_step_both_ways() {
        assert!(steps_between((0, 1_000), (10, 1_000 + THRESHOLD_NS)).is_none());
        let fwd = steps_between((0, 0), (10_000_000, 400_000_000)).expect("a step");
        assert_eq!((fwd.start, fwd.end), (0, 10_000_000));
        assert_eq!(fwd.note, "+400.0 ms");
        let back = steps_between((0, 0), (10, -3_000_000)).expect("a step");
        assert_eq!(back.note, "-3.0 ms");
    }

    #[test]
    fn only_forward_steps_inside_the_window_count() {
        let step = |start, end, ms: i64| Fault {
            kind: WALL_CLOCK_STEP.into(),
            victim: None,
            start,
            end,
            note: format!("{ms:+} ms"),
            wall_step_ns: Some(ms * 1_000_000),
        };
        let faults = vec![
            step(100, 110, 300),
            step(200, 210, -50),
            step(500, 510, 80),
            Fault {
                kind: "pause".into(),
                victim: Some(1),
                start: 100,
                end: 400,
                note: "+999.0 ms".into(),
                wall_step_ns: None,
            },
        ];
        assert_eq!(forward_steps_ns(&faults, 0, 300), 300_000_000);
        assert_eq!(forward_steps_ns(&faults, 0, 1_000), 380_000_000);
        assert_eq!(forward_steps_ns(&faults, 120, 490), 0);
    }
}
