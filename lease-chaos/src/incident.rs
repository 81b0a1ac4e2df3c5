//! A safety incident the checker found, with its time: what lets the
//! verdict excuse only the incidents inside a declared fault's window.

use serde::{Deserialize, Serialize};

/// What kind of safety incident an [`Incident`] is: each is counted in
/// [`Counts`](crate::checker::Counts) too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IncidentKind {
    /// Two workers held a valid lease at once (not explained by a wall
    /// clock step).
    Overlap,
    /// A grant's token was not above an earlier grant's.
    Regression,
    /// The sink admitted a write of a grant older than one it had accepted.
    StaleAdmitted,
    /// The sink accepted one token from two grants.
    DuplicatedRound,
    /// A valid holder's write was refused.
    LostRound,
}

/// One safety incident and when it happened (the later grant's return for
/// an overlap, its return for a regression, the sink's receipt for a write):
/// what lets a verdict excuse only the incidents inside a declared fault's
/// time window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Incident {
    /// What happened.
    pub kind: IncidentKind,
    /// When, in the history's nanoseconds.
    pub at: u64,
}
