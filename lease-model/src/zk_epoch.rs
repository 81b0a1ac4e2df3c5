//! ZooKeeper's lease: acquire, the takeover of a holder judged expired,
//! the one-request extend (fast path) and the checked one, release, and a
//! purge that deletes the key node (so epochs start again), over time.
//!
//! Every multi is the provider's own list of steps (`lease_zk::protocol`:
//! `claim`, `extend`, `release`), run here on a tree of the key node (its
//! version is the epoch), the holder node and the owners' markers, all or
//! nothing, as ZooKeeper runs a multi. The conformance suite and
//! `zk_specific` run the same steps on a real server.
//!
//! Properties:
//! - at most one client believes it holds the lease at any instant (from
//!   its acquire or extend until the local validity of [`Lease::new`](lease_api::Lease::new)),
//!   but for a holder whose lease a purge deleted, until its next extend
//!   tells it (as for a key deleted behind its back);
//! - an extend renews only its own owner's holder node.

use lease_zk::protocol::{Judged, Step, claim, extend, forget, release};
use stateright::{Model, Property};

/// Which steps the multis carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ZkDesign {
    /// The provider's steps.
    Current,
    /// Broken: the fast path checks the epoch but not the owner's marker.
    NoMarkerCheck,
    /// Broken: a takeover deletes the judged holder without checking the
    /// epoch (nor the judged owner's marker).
    NoEpochCheckOnTakeover,
    /// Broken: the design before the model found the purge case: a
    /// takeover checks the epoch but not the judged owner's marker.
    NoJudgedMarkerCheck,
    /// Broken: the clean-up of an expired holder of ours deletes it at the
    /// version it read without checking the epoch (a review found this in
    /// a draft of the purge fix).
    CleanupWithoutEpoch,
}

/// The model: `clients` clients of `attempts` acquires each, a TTL of 3
/// ticks of 100 ms, time up to `horizon`.
#[derive(Clone, Debug)]
pub struct ZkLease {
    /// How many clients.
    pub clients: u8,
    /// Acquires per client.
    pub attempts: u8,
    /// The last tick.
    pub horizon: u8,
    /// The multis' steps.
    pub design: ZkDesign,
    validity_ms: u32,
}

const TTL_TICKS: u8 = 3;

impl ZkLease {
    /// `clients` clients of `attempts` acquires each, 5 ticks.
    pub fn new(clients: u8, attempts: u8, design: ZkDesign) -> Self {
        let validity_ms = crate::local_validity_ms(100 * u64::from(TTL_TICKS));
        ZkLease {
            clients,
            attempts,
            horizon: 5,
            design,
            validity_ms,
        }
    }

    fn steps(&self, mut steps: Vec<Step>, take_over: bool) -> Vec<Step> {
        match self.design {
            ZkDesign::NoMarkerCheck => steps.retain(|s| *s != Step::CheckMarker),
            ZkDesign::NoEpochCheckOnTakeover if take_over => {
                steps.retain(|s| !matches!(s, Step::CheckEpoch(_) | Step::DeleteJudgedMarker));
            }
            ZkDesign::NoJudgedMarkerCheck => steps.retain(|s| *s != Step::DeleteJudgedMarker),
            _ => {}
        }
        steps
    }

    fn believes(&self, s: &State, c: usize) -> bool {
        matches!(s.clients[c], Client::Holding { sent, .. }
            if u32::from(s.now) * 100 < u32::from(sent) * 100 + self.validity_ms)
    }

    /// Believes it holds, and no purge took the lease from under it since
    /// its last acquire or extend.
    fn owes(&self, s: &State, c: usize) -> bool {
        self.believes(s, c) && !s.purged_under[c]
    }
}

/// An owner: client and acquire.
type Owner = (u8, u8);

/// A clean-up read: the lost lease's acquire, and its own expired holder
/// node's epoch and version (`None`: the marker goes alone).
type CleanupPlan = (u8, Option<(i32, i32)>);

/// The holder node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Holder {
    owner: Owner,
    version: i32,
    mtime: u8,
}

/// The key's nodes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Tree {
    /// The key node's version (the epoch); `None`: no key node.
    key: Option<i32>,
    holder: Option<Holder>,
    markers: Vec<Owner>,
}

/// One client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Client {
    /// Not holding.
    Idle,
    /// Its acquire found the key held: reads the holder node next (the
    /// same acquire, the same owner).
    Contending,
    /// Read the holder node expired at this epoch and holder version, owned
    /// by `owner` whose marker was there (`None`: no marker seen).
    Judging {
        /// The key node's version read.
        epoch: i32,
        /// The holder node's version read.
        holder_version: i32,
        /// The judged holder's owner, if its marker was there.
        owner: Option<Owner>,
    },
    /// Holds the lease acquired or extended at tick `sent`, at `epoch`.
    Holding {
        /// The epoch its acquire made.
        epoch: i32,
        /// When its last acquire or extend was sent.
        sent: u8,
    },
}

/// The tree, the clients and what the run has seen.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    now: u8,
    tree: Tree,
    clients: Vec<Client>,
    round: Vec<u8>,
    /// Per client: its lease was purged from under it (it learns at its
    /// next extend; until then it is excused, like a key deleted behind a
    /// holder's back).
    purged_under: Vec<bool>,
    renewed_anothers: bool,
    taken_over: bool,
    /// Per client: the clean-up's read of its lost lease's nodes, for that
    /// lease's acquire (round): `None` not read; `(round, None)` the holder
    /// is gone or another's (the marker goes alone); `(round, Some((epoch,
    /// version)))` its own holder, expired (both go, at that epoch).
    cleanup: Vec<Option<CleanupPlan>>,
    purged_then_held: bool,
    /// How far the purge got: 0 not started, 1 listed the key's children,
    /// 2 deleted the holder node, 3 the markers, 4 the key node (or found
    /// it had gained children).
    purge: u8,
    /// What the purge listed: whether a holder node, and which markers.
    purge_list: (bool, Vec<Owner>),
}

/// A step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Client creates the key node (when missing).
    EnsureKey(u8),
    /// Client's acquire multi.
    Acquire(u8),
    /// Client reads the holder node and the epoch, judging expiry.
    Read(u8),
    /// Client's takeover multi, at what it judged.
    TakeOver(u8),
    /// Client's one-request extend.
    ExtendFast(u8),
    /// Client's checked extend (reads the holder node first, one step).
    ExtendChecked(u8),
    /// Client's release.
    Release(u8),
    /// Client, no longer holding (lost, or its validity over), reads its
    /// lease's nodes for the clean-up: its own holder node, live (nothing
    /// to do), expired (both go), or gone or another's (the marker goes).
    CleanupRead(u8),
    /// The clean-up's multi (`forget`, or the marker alone).
    Cleanup(u8),
    /// An operator purges the namespace, one step at a time as the provider
    /// does: it lists the key node's children, deletes the holder node (any
    /// version), then the markers it listed, then the key node (which fails
    /// if it gained children meanwhile).
    Purge,
    /// A tick.
    Tick,
}

/// Runs a multi on the tree: every step or none. `owner` acts.
fn run(
    tree: &Tree,
    steps: &[Step],
    (owner, judged): (Owner, Option<Owner>),
    now: u8,
) -> Option<(Tree, bool)> {
    let mut t = tree.clone();
    let mut renewed_anothers = false;
    for step in steps {
        match *step {
            Step::CheckEpoch(e) => (t.key == Some(e)).then_some(())?,
            Step::CheckMarker => t.markers.contains(&owner).then_some(())?,
            Step::DeleteJudgedMarker => {
                let judged = judged?;
                let i = t.markers.iter().position(|o| *o == judged)?;
                t.markers.remove(i);
            }
            Step::DeleteHolder(v) => {
                let h = t.holder?;
                v.is_none_or(|v| v == h.version).then_some(())?;
                t.holder = None;
            }
            Step::CreateHolder => {
                (t.key.is_some() && t.holder.is_none()).then_some(())?;
                t.holder = Some(Holder {
                    owner,
                    version: 0,
                    mtime: now,
                });
            }
            Step::CreateMarker => {
                (t.key.is_some() && !t.markers.contains(&owner)).then_some(())?;
                t.markers.push(owner);
                t.markers.sort_unstable();
            }
            Step::DeleteMarker => {
                let i = t.markers.iter().position(|o| *o == owner)?;
                t.markers.remove(i);
            }
            Step::SetHolder(v) => {
                let h = t.holder.as_mut()?;
                v.is_none_or(|v| v == h.version).then_some(())?;
                renewed_anothers |= h.owner != owner;
                h.owner = owner;
                h.version += 1;
                h.mtime = now;
            }
            Step::BumpEpoch => t.key = Some(t.key? + 1),
        }
    }
    Some((t, renewed_anothers))
}

impl ZkLease {
    fn expired(h: &Holder, now: u8) -> bool {
        now >= h.mtime + TTL_TICKS
    }

    /// Runs `steps` for client `c`; on success the client holds at the new
    /// epoch (acquire) or keeps its epoch (extend).
    fn multi(&self, s: &mut State, c: usize, steps: &[Step], judged: Option<Owner>) -> bool {
        let owner = (c as u8, s.round[c]);
        match run(&s.tree, steps, (owner, judged), s.now) {
            Some((tree, renewed_anothers)) => {
                s.tree = tree;
                s.renewed_anothers |= renewed_anothers;
                s.purged_under[c] = false;
                true
            }
            None => false,
        }
    }
}

impl Model for ZkLease {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let k = usize::from(self.clients);
        vec![State {
            now: 0,
            tree: Tree {
                key: None,
                holder: None,
                markers: Vec::new(),
            },
            clients: vec![Client::Idle; k],
            round: vec![0; k],
            purged_under: vec![false; k],
            renewed_anothers: false,
            taken_over: false,
            cleanup: vec![None; k],
            purged_then_held: false,
            purge: 0,
            purge_list: (false, Vec::new()),
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for c in 0..self.clients {
            let ci = usize::from(c);
            match s.clients[ci] {
                Client::Idle if s.round[ci] < self.attempts => {
                    if s.tree.key.is_none() {
                        actions.push(Action::EnsureKey(c));
                    }
                    actions.push(Action::Acquire(c));
                }
                Client::Contending => actions.push(Action::Read(c)),
                Client::Judging { .. } => actions.push(Action::TakeOver(c)),
                // One extend per tick at most (a renewal period is longer
                // than a round trip), so holder versions stay bounded.
                Client::Holding { sent, .. } if self.believes(s, ci) && sent < s.now => actions
                    .extend([
                        Action::ExtendFast(c),
                        Action::ExtendChecked(c),
                        Action::Release(c),
                    ]),
                Client::Holding { .. } if self.believes(s, ci) => actions.push(Action::Release(c)),
                _ => {}
            }
        }
        for c in 0..self.clients {
            let ci = usize::from(c);
            let idle = matches!(s.clients[ci], Client::Idle);
            if s.cleanup[ci].is_some() {
                actions.push(Action::Cleanup(c));
            } else if idle && s.tree.markers.contains(&(c, s.round[ci])) {
                actions.push(Action::CleanupRead(c));
            }
        }
        if s.purge < 4 {
            actions.push(Action::Purge);
        }
        if s.now < self.horizon {
            actions.push(Action::Tick);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        let now = s.now;
        match action {
            Action::EnsureKey(_) => {
                s.tree.key.is_none().then_some(())?;
                s.tree.key = Some(0);
            }
            Action::Acquire(c) | Action::TakeOver(c) => {
                let ci = usize::from(c);
                let (judged, judged_owner) = match s.clients[ci] {
                    Client::Judging {
                        epoch,
                        holder_version,
                        owner,
                    } => (
                        Some(Judged {
                            epoch,
                            holder_version,
                            owner_known: owner.is_some(),
                        }),
                        owner,
                    ),
                    _ => (None, None),
                };
                s.round[ci] += u8::from(judged.is_none());
                let steps = self.steps(claim(judged), judged.is_some());
                s.clients[ci] = if self.multi(&mut s, ci, &steps, judged_owner) {
                    s.taken_over |= judged.is_some();
                    s.purged_then_held |= s.purge == 4 && s.tree.key.is_some();
                    Client::Holding {
                        epoch: s.tree.key.unwrap_or(0),
                        sent: now,
                    }
                } else if judged.is_none() && s.tree.holder.is_some() {
                    Client::Contending
                } else {
                    Client::Idle
                };
            }
            Action::Read(c) => {
                s.clients[usize::from(c)] = match (s.tree.key, s.tree.holder) {
                    (Some(epoch), Some(h)) if Self::expired(&h, now) => Client::Judging {
                        epoch,
                        holder_version: h.version,
                        owner: s.tree.markers.contains(&h.owner).then_some(h.owner),
                    },
                    _ => Client::Idle,
                };
            }
            Action::ExtendFast(c) | Action::ExtendChecked(c) => {
                let ci = usize::from(c);
                let Client::Holding { epoch, .. } = s.clients[ci] else {
                    return None;
                };
                let version = match action {
                    Action::ExtendFast(_) => None,
                    // The checked path reads the holder node: it must be
                    // this owner's and unexpired by the server's clock.
                    _ => {
                        let h = s
                            .tree
                            .holder
                            .filter(|h| h.owner == (c, s.round[ci]) && !Self::expired(h, now));
                        match h {
                            Some(h) => Some(h.version),
                            None => {
                                s.clients[ci] = Client::Idle;
                                return Some(s);
                            }
                        }
                    }
                };
                let steps = self.steps(extend(epoch, version), false);
                s.clients[ci] = if self.multi(&mut s, ci, &steps, None) {
                    Client::Holding { epoch, sent: now }
                } else {
                    Client::Idle
                };
            }
            Action::Release(c) => {
                let ci = usize::from(c);
                let Client::Holding { epoch, .. } = s.clients[ci] else {
                    return None;
                };
                let steps = self.steps(release(epoch, None), false);
                self.multi(&mut s, ci, &steps, None);
                s.clients[ci] = Client::Idle;
            }
            Action::CleanupRead(c) => {
                let ci = usize::from(c);
                let owner = (c, s.round[ci]);
                s.cleanup[ci] = match (s.tree.key, s.tree.holder) {
                    (Some(_), Some(h)) if h.owner == owner && !Self::expired(&h, now) => None,
                    (Some(epoch), Some(h)) if h.owner == owner => {
                        Some((owner.1, Some((epoch, h.version))))
                    }
                    _ => Some((owner.1, None)),
                };
            }
            Action::Cleanup(c) => {
                let ci = usize::from(c);
                let (round, read) = s.cleanup[ci].take()?;
                let mut steps = match read {
                    Some((epoch, version)) => forget(epoch, version),
                    None => vec![Step::DeleteMarker],
                };
                if self.design == ZkDesign::CleanupWithoutEpoch {
                    steps.retain(|s| !matches!(s, Step::CheckEpoch(_)));
                }
                let owner = (c, round);
                if let Some((tree, _)) = run(&s.tree, &steps, (owner, None), now) {
                    s.tree = tree;
                }
            }
            Action::Purge => {
                match s.purge {
                    0 => s.purge_list = (s.tree.holder.is_some(), s.tree.markers.clone()),
                    1 if s.purge_list.0 => {
                        if let Some(h) = s.tree.holder.take() {
                            let (c, round) = h.owner;
                            let ci = usize::from(c);
                            if s.round[ci] == round {
                                s.purged_under[ci] =
                                    matches!(s.clients[ci], Client::Holding { .. });
                            }
                        }
                    }
                    1 => {}
                    2 => {
                        let listed = std::mem::take(&mut s.purge_list.1);
                        s.tree.markers.retain(|o| !listed.contains(o));
                    }
                    _ => {
                        if s.tree.holder.is_none() && s.tree.markers.is_empty() {
                            s.tree.key = None;
                        }
                    }
                }
                s.purge += 1;
            }
            Action::Tick => {
                s.now += 1;
                for c in 0..s.clients.len() {
                    if matches!(s.clients[c], Client::Holding { .. }) && !self.believes(&s, c) {
                        s.clients[c] = Client::Idle;
                    }
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("at most one holder at a time", |m: &ZkLease, s: &State| {
                (0..s.clients.len()).filter(|c| m.owes(s, *c)).count() <= 1
            }),
            Property::always(
                "an extend renews only its own holder node",
                |_, s: &State| !s.renewed_anothers,
            ),
            Property::sometimes("an expired holder is taken over", |_, s: &State| {
                s.taken_over
            }),
            Property::sometimes("the key is held again after a purge", |_, s: &State| {
                s.purged_then_held
            }),
        ]
    }
}
