//! The verdict: judging what the checker counted against what the backend's
//! capabilities declare, and the `Report` of a run with its summary.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::checker::Counts;
use crate::faults::FaultKind;

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

/// Sorts what the checker counted into violations and declared behaviour.
pub(crate) fn judge(
    counts: &Counts,
    caps: &leases::Capabilities,
    injected: &BTreeMap<String, u64>,
    fenced: bool,
) -> (Vec<String>, Vec<String>) {
    let jumped = injected.contains_key(FaultKind::ClockJump.name())
        && caps.expiry_clock.follows_wall_clock();
    let wiped =
        injected.contains_key(FaultKind::NodeWipe.name()) && !caps.durable_tokens.is_durable();
    // A leader lost where the capabilities say a failover may hand a token
    // out again (a Redis replica promoted without the last writes).
    let reissued = (injected.contains_key(FaultKind::LeaderKill.name())
        || injected.contains_key(FaultKind::LeaderPause.name()))
        && caps
            .failover
            .as_ref()
            .is_some_and(|f| matches!(f.tokens, leases::FailoverTokens::MayRepeat(_)));
    let wiped_or_reissued = wiped || reissued;
    let mut found = Vec::new();
    if counts.grants == 0 {
        found.push(("no lease was ever granted".to_string(), false));
    }
    // Overlaps the host's wall clock explains (it stepped forward between
    // the two grants by at least the overlap) are what a backend whose
    // expiry follows that clock declares; only the rest are the backend's.
    let stepped = if caps.expiry_clock.follows_wall_clock() {
        counts.validity_overlaps_in_wall_steps
    } else {
        0
    };
    let mut declared = Vec::new();
    if stepped > 0 {
        declared.push(format!(
            "{stepped} times two workers held a lease they were entitled to trust at once: \
             declared, expiry follows a wall clock ({:?}) and the host's stepped forward \
             between the two grants by more than the overlap",
            caps.expiry_clock
        ));
    }
    if counts.validity_overlaps > stepped {
        found.push((
            format!(
                "{} times two workers held a lease they were entitled to trust at once ({:.0} ms)",
                counts.validity_overlaps - stepped,
                counts.validity_overlap_ms
            ),
            jumped || wiped_or_reissued,
        ));
    }
    if counts.token_regressions > 0 {
        found.push((
            format!(
                "{} grants got a token not greater than an earlier grant's",
                counts.token_regressions
            ),
            wiped_or_reissued,
        ));
    }
    if fenced && counts.stale_admitted > 0 {
        found.push((
            format!(
                "the fenced sink admitted {} stale writes",
                counts.stale_admitted
            ),
            wiped_or_reissued,
        ));
    }
    if fenced && counts.duplicated_rounds > 0 {
        found.push((
            format!(
                "{} tokens were accepted from two grants",
                counts.duplicated_rounds
            ),
            wiped_or_reissued,
        ));
    }
    if fenced && counts.ack_mismatches > 0 {
        found.push((
            format!(
                "{} acknowledged writes are missing from the sink",
                counts.ack_mismatches
            ),
            false,
        ));
    }
    if counts.lost_rounds > 0 {
        // A holder whose validity was cut short writes after its successor.
        found.push((
            format!(
                "{} writes of a valid holder were refused",
                counts.lost_rounds
            ),
            jumped || wiped_or_reissued,
        ));
    }
    let why = match (jumped, wiped, reissued) {
        (true, _, _) => format!(
            "expiry follows a wall clock ({:?}) and one jumped",
            caps.expiry_clock
        ),
        (_, true, _) => format!("tokens are not durable ({:?})", caps.durable_tokens),
        (_, _, true) => format!(
            "the leader was lost and a failover may reissue tokens ({:?})",
            caps.failover.as_ref().map(|f| &f.tokens)
        ),
        _ => String::new(),
    };
    let mut violations = Vec::new();
    for (text, excused) in found {
        if excused {
            declared.push(format!("{text}: declared, {why}"));
        } else {
            violations.push(text);
        }
    }
    (violations, declared)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Token regressions after a lost leader are declared only where the
    /// failover declaration says tokens may repeat.
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
        let caps =
            |clock| leases::Capabilities::new("x", clock, leases::Notifications::TimedRetryOnly);
        let none = BTreeMap::new();
        let (violations, declared) = judge(
            &counts,
            &caps(leases::ExpiryClock::StoreServer),
            &none,
            true,
        );
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(violations[0].starts_with("1 times"), "{violations:?}");
        assert_eq!(declared.len(), 1, "{declared:?}");
        let (violations, declared) = judge(
            &counts,
            &caps(leases::ExpiryClock::ConsensusLeader),
            &none,
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
            &none,
            true,
        );
        assert!(violations.is_empty(), "{violations:?}");
    }

    #[test]
    fn regressions_after_a_leader_fault_are_declared_only_for_may_repeat() {
        let counts = Counts {
            grants: 10,
            token_regressions: 3,
            ..Counts::default()
        };
        let injected: BTreeMap<String, u64> = [("leader-pause".to_string(), 1)].into();
        let caps = |tokens| {
            leases::Capabilities::new(
                "x",
                leases::ExpiryClock::StoreServer,
                leases::Notifications::TimedRetryOnly,
            )
            .with_failover(Some(leases::Failover::new(
                tokens,
                true,
                std::time::Duration::from_secs(5),
            )))
        };
        let may = caps(leases::FailoverTokens::MayRepeat("m".into()));
        let (violations, declared) = judge(&counts, &may, &injected, true);
        assert!(violations.is_empty(), "{violations:?}");
        assert_eq!(declared.len(), 1, "{declared:?}");
        let inc = caps(leases::FailoverTokens::Increasing("i".into()));
        let (violations, _) = judge(&counts, &inc, &injected, true);
        assert_eq!(violations.len(), 1, "{violations:?}");
        let (violations, _) = judge(&counts, &may, &BTreeMap::new(), true);
        assert_eq!(violations.len(), 1, "no leader fault: {violations:?}");
    }
}
