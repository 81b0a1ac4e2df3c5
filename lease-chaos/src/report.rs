//! The verdict: judging what the checker counted against what the backend's
//! capabilities declare, and the `Report` of a run with its summary.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::checker::{Counts, IncidentKind};
use crate::faults::FaultKind;
use crate::history::Fault;

/// The outcome of one run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    /// The backend's name, from its capabilities.
    pub backend: String,
    /// The store URL, passwords redacted.
    pub store: String,
    /// A label for the cell (the faults, or `none`).
    pub cell: String,
    /// The faults requested.
    pub faults: Vec<String>,
    /// The seed.
    pub seed: u64,
    /// Worker processes.
    pub workers: u32,
    /// The TTL used, in ms.
    pub ttl_ms: u64,
    /// How long the run took, in seconds.
    pub seconds: f64,
    /// Whether the sink fenced.
    pub fenced: bool,
    /// What the backend declares about its tokens.
    pub token_durability: String,
    /// What the checker counted.
    pub counts: Counts,
    /// Faults injected, by kind.
    pub injected: BTreeMap<String, u64>,
    /// Where the backend broke what it declares; empty when it held.
    pub violations: Vec<String>,
    /// What went wrong but is what the backend declares for the faults
    /// injected (a clock jump on a wall-clock store, a node that lost its
    /// counters on a store whose tokens are not durable).
    #[serde(default)]
    pub declared: Vec<String>,
    /// The run this cell came from: when `scripts/chaos` ran it, the run's
    /// start, the machine, the stores' versions and the size; else the UTC
    /// date it ended. A matrix split over several runs keeps each cell's own.
    #[serde(default)]
    pub run: String,
}

impl Report {
    /// True when nothing the capabilities declare was broken.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// A short human summary.
    pub fn text(&self) -> String {
        let c = &self.counts;
        let median = c
            .recovery_ms
            .get(c.recovery_ms.len() / 2)
            .copied()
            .unwrap_or(0.0);
        let max = c.recovery_ms.last().copied().unwrap_or(0.0);
        let mut out = format!(
            "{} [{}] seed {} · {} workers · TTL {} ms · {:.1} s · {}\n\
             grants {} · writes {} ({} accepted, {} sent stale)\n\
             unsafe windows {} ({:.0} ms) · validity overlaps {} · stale admitted {} · late admitted {}\n\
             token regressions {} · lost rounds {} · duplicated rounds {} · ack mismatches {}\n\
             availability {:.1}% · recovery median {:.0} ms, max {:.0} ms, unrecovered {} · injected {:?}\n",
            self.backend,
            self.cell,
            self.seed,
            self.workers,
            self.ttl_ms,
            self.seconds,
            if self.fenced {
                "fenced sink"
            } else {
                "UNFENCED sink"
            },
            c.grants,
            c.writes,
            c.accepted,
            c.stale_sent,
            c.unsafe_windows,
            c.unsafe_ms,
            c.validity_overlaps,
            c.stale_admitted,
            c.late_admitted,
            c.token_regressions,
            c.lost_rounds,
            c.duplicated_rounds,
            c.ack_mismatches,
            c.availability * 100.0,
            median,
            max,
            c.unrecovered,
            self.injected,
        );
        if c.reader_grants > 0 {
            out.push_str(&format!(
                "read/write leases: {} reader grants, {} writer grants · {} reads\n",
                c.reader_grants,
                c.grants - c.reader_grants,
                c.reads
            ));
        }
        for d in &self.declared {
            out.push_str(&format!("DECLARED: {d}\n"));
        }
        if self.passed() {
            out.push_str("PASS: nothing the capabilities declare was broken\n");
        } else {
            for v in &self.violations {
                out.push_str(&format!("VIOLATION: {v}\n"));
            }
        }
        out
    }
}

/// A fault whose consequences the capabilities declare, and the time window
/// in which they may show: from the fault's start to its heal plus `grace`.
struct Excuse {
    from: u64,
    until: u64,
    /// Whether it excuses overlaps and lost rounds only (a wall clock jump),
    /// not token regressions or admissions.
    clock_only: bool,
    why: String,
}

/// The faults of `faults` whose consequences `caps` declares: a wall clock
/// jump where expiry follows one, a wiped node where tokens are not
/// durable, a lost leader where a failover may repeat tokens.
fn excuses(caps: &leases::Capabilities, faults: &[Fault], grace: u64) -> Vec<Excuse> {
    let may_repeat = caps
        .failover
        .as_ref()
        .is_some_and(|f| matches!(f.tokens, leases::FailoverTokens::MayRepeat(_)));
    faults
        .iter()
        .filter_map(|f| {
            let (clock_only, why) = if f.kind == FaultKind::ClockJump.name()
                && caps.expiry_clock.follows_wall_clock()
            {
                (
                    true,
                    format!(
                        "expiry follows a wall clock ({:?}) and one jumped",
                        caps.expiry_clock
                    ),
                )
            } else if f.kind == FaultKind::NodeWipe.name() && !caps.durable_tokens.is_durable() {
                (
                    false,
                    format!("tokens are not durable ({:?})", caps.durable_tokens),
                )
            } else if (f.kind == FaultKind::LeaderKill.name()
                || f.kind == FaultKind::LeaderPause.name()
                || f.kind == FaultKind::LeaderIsolate.name())
                && may_repeat
            {
                (
                    false,
                    format!(
                        "the leader was lost and a failover may reissue tokens ({:?})",
                        caps.failover.as_ref().map(|f| &f.tokens)
                    ),
                )
            } else {
                return None;
            };
            Some(Excuse {
                from: f.start,
                until: f.end.saturating_add(grace),
                clock_only,
                why,
            })
        })
        .collect()
}

/// Sorts what the checker counted into violations and declared behaviour.
///
/// An incident is declared only when it happened inside the time window of
/// a fault whose consequences the capabilities declare (`grace` after the
/// fault's heal: leases granted before it may still be valid, their
/// successors come after the failover, and late writes after that); the
/// same incident outside every such window is a violation.
pub(crate) fn judge(
    counts: &Counts,
    caps: &leases::Capabilities,
    faults: &[Fault],
    grace: u64,
    fenced: bool,
) -> (Vec<String>, Vec<String>) {
    let excuses = excuses(caps, faults, grace);
    // How many incidents of `kind` fall in a window that excuses them, and
    // the first reason.
    let excused = |kind: IncidentKind| {
        let mut n = 0u64;
        let mut why = None;
        for i in counts.incidents.iter().filter(|i| i.kind == kind) {
            let clock_may = matches!(kind, IncidentKind::Overlap | IncidentKind::LostRound);
            if let Some(e) = excuses
                .iter()
                .find(|e| (e.from..=e.until).contains(&i.at) && (clock_may || !e.clock_only))
            {
                n += 1;
                why.get_or_insert_with(|| e.why.clone());
            }
        }
        (n, why.unwrap_or_default())
    };
    let mut violations = Vec::new();
    let mut declared = Vec::new();
    if counts.grants == 0 {
        violations.push("no lease was ever granted".to_string());
    }
    // Overlaps the host's wall clock explains (it stepped forward between
    // the two grants by at least the overlap) are what a backend whose
    // expiry follows that clock declares; only the rest are the backend's.
    let stepped = if caps.expiry_clock.follows_wall_clock() {
        counts.validity_overlaps_in_wall_steps
    } else {
        0
    };
    if stepped > 0 {
        declared.push(format!(
            "{stepped} times two workers held a lease they were entitled to trust at once: \
             declared, expiry follows a wall clock ({:?}) and the host's stepped forward \
             between the two grants by more than the overlap",
            caps.expiry_clock
        ));
    }
    let mut sort = |total: u64, kind: Option<IncidentKind>, text: &dyn Fn(u64) -> String| {
        if total == 0 {
            return;
        }
        let (n, why) = kind.map_or((0, String::new()), excused);
        let n = n.min(total);
        if n > 0 {
            declared.push(format!("{}: declared, {why}", text(n)));
        }
        if total > n {
            violations.push(text(total - n));
        }
    };
    let overlap_ms = counts.validity_overlap_ms;
    sort(
        counts.validity_overlaps.saturating_sub(stepped),
        Some(IncidentKind::Overlap),
        &|n| {
            format!(
                "{n} times two workers held a lease they were entitled to trust at once ({overlap_ms:.0} ms in all)"
            )
        },
    );
    sort(
        counts.token_regressions,
        Some(IncidentKind::Regression),
        &|n| format!("{n} grants got a token not greater than an earlier grant's"),
    );
    if fenced {
        sort(
            counts.stale_admitted,
            Some(IncidentKind::StaleAdmitted),
            &|n| format!("the fenced sink admitted {n} stale writes"),
        );
        sort(
            counts.duplicated_rounds,
            Some(IncidentKind::DuplicatedRound),
            &|n| format!("{n} tokens were accepted from two grants"),
        );
        sort(counts.ack_mismatches, None, &|n| {
            format!("{n} acknowledged writes are missing from the sink")
        });
    }
    // A holder whose validity was cut short writes after its successor.
    sort(counts.lost_rounds, Some(IncidentKind::LostRound), &|n| {
        format!("{n} writes of a valid holder were refused")
    });
    (violations, declared)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checker::Incident;

    const S: u64 = 1_000_000_000;

    fn caps(clock: leases::ExpiryClock) -> leases::Capabilities {
        leases::Capabilities::new("x", clock, leases::Notifications::TimedRetryOnly)
    }

    fn fault(kind: FaultKind, start: u64, end: u64) -> Fault {
        Fault {
            kind: kind.name().to_string(),
            victim: None,
            start,
            end,
            note: String::new(),
            wall_step_ns: None,
        }
    }

    fn incidents(kind: IncidentKind, at: &[u64]) -> Vec<Incident> {
        at.iter().map(|&at| Incident { kind, at }).collect()
    }

    /// Overlaps inside a forward step of the host's wall clock are declared
    /// only for a backend whose expiry follows a wall clock; the others stay
    /// violations.
    #[test]
    fn overlaps_in_wall_clock_steps_are_declared_only_where_expiry_follows_one() {
        let counts = Counts {
            grants: 10,
            validity_overlaps: 2,
            validity_overlap_ms: 300.0,
            validity_overlaps_in_wall_steps: 1,
            ..Counts::default()
        };
        let (violations, declared) = judge(
            &counts,
            &caps(leases::ExpiryClock::StoreServer),
            &[],
            0,
            true,
        );
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(violations[0].starts_with("1 times"), "{violations:?}");
        assert_eq!(declared.len(), 1, "{declared:?}");
        let (violations, declared) = judge(
            &counts,
            &caps(leases::ExpiryClock::ConsensusLeader),
            &[],
            0,
            true,
        );
        assert!(violations[0].starts_with("2 times"), "{violations:?}");
        assert!(declared.is_empty(), "{declared:?}");
        let all_stepped = Counts {
            validity_overlaps_in_wall_steps: 2,
            ..counts
        };
        let (violations, _) = judge(
            &all_stepped,
            &caps(leases::ExpiryClock::StoreServer),
            &[],
            0,
            true,
        );
        assert!(violations.is_empty(), "{violations:?}");
    }

    /// Token regressions after a lost leader are declared only where the
    /// failover declaration says tokens may repeat, and only inside the
    /// fault's window (its heal plus the grace): the same regression a
    /// minute later is a violation.
    #[test]
    fn regressions_after_a_leader_fault_are_declared_only_for_may_repeat_and_in_its_window() {
        let counts = Counts {
            grants: 10,
            token_regressions: 3,
            incidents: incidents(IncidentKind::Regression, &[2 * S, 3 * S, 4 * S]),
            ..Counts::default()
        };
        let paused = [fault(FaultKind::LeaderPause, S, 2 * S)];
        let with = |tokens| {
            caps(leases::ExpiryClock::StoreServer).with_failover(Some(leases::Failover::new(
                tokens,
                true,
                std::time::Duration::from_secs(5),
            )))
        };
        let may = with(leases::FailoverTokens::MayRepeat("m".into()));
        let (violations, declared) = judge(&counts, &may, &paused, 3 * S, true);
        assert!(violations.is_empty(), "{violations:?}");
        assert_eq!(declared.len(), 1, "{declared:?}");
        assert!(declared[0].starts_with("3 grants"), "{declared:?}");
        let inc = with(leases::FailoverTokens::Increasing("i".into()));
        let (violations, _) = judge(&counts, &inc, &paused, 3 * S, true);
        assert_eq!(violations.len(), 1, "{violations:?}");
        let (violations, _) = judge(&counts, &may, &[], 3 * S, true);
        assert_eq!(violations.len(), 1, "no leader fault: {violations:?}");
        // A short grace: the regression at 4 s is past the window (2 s + 1 s).
        let (violations, declared) = judge(&counts, &may, &paused, S, true);
        assert_eq!(
            violations,
            ["1 grants got a token not greater than an earlier grant's"]
        );
        assert!(declared[0].starts_with("2 grants"), "{declared:?}");
    }

    /// An overlap is declared only inside the window of a fault that excuses
    /// it: before the fault, or long after its heal, it is the backend's. A
    /// wall clock jump excuses overlaps but never a token going back.
    #[test]
    fn only_incidents_inside_a_declared_faults_window_are_excused() {
        let mut incidents_all = incidents(IncidentKind::Overlap, &[S / 2, 11 * S, 30 * S]);
        incidents_all.extend(incidents(IncidentKind::Regression, &[11 * S]));
        let counts = Counts {
            grants: 10,
            validity_overlaps: 3,
            validity_overlap_ms: 90.0,
            token_regressions: 1,
            incidents: incidents_all,
            ..Counts::default()
        };
        let jumped = [fault(FaultKind::ClockJump, 10 * S, 12 * S)];
        let (violations, declared) = judge(
            &counts,
            &caps(leases::ExpiryClock::StoreServer),
            &jumped,
            5 * S,
            true,
        );
        assert_eq!(declared.len(), 1, "{declared:?}");
        assert!(declared[0].starts_with("1 times"), "{declared:?}");
        assert_eq!(violations.len(), 2, "{violations:?}");
        assert!(violations[0].starts_with("2 times"), "{violations:?}");
        assert!(violations[1].starts_with("1 grants"), "{violations:?}");
        // A consensus clock does not follow the wall clock: nothing excused.
        let (violations, declared) = judge(
            &counts,
            &caps(leases::ExpiryClock::ConsensusLeader),
            &jumped,
            5 * S,
            true,
        );
        assert!(declared.is_empty(), "{declared:?}");
        assert!(violations[0].starts_with("3 times"), "{violations:?}");
    }
}
