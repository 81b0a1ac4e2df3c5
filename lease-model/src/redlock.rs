//! Redlock over N independent nodes, in two models: its tokens (every
//! round's grants, late grants, lost replies, the raise round, node wipes)
//! and its holders (acquire, cancel, release, late grants, lost requests
//! and replies, expiry, node wipes, over time).
//!
//! Both decide with the provider's code: the majority is
//! `lease_redis::protocol::quorum`, a won round's token and whether to raise
//! is `lease_redis::protocol::token_step`, and a round is won in time by the
//! local validity of [`Lease::new`](lease_api::Lease::new). A node's scripts are stated here as the
//! crate's Lua does them: ACQUIRE takes a free or expired key (unless the
//! round's cancel left a tombstone there) and increments the node's
//! counter; RAISE sets the counter to at least the token where the owner
//! still holds the key; RELEASE and the cancel delete the owner's copy. The
//! Redlock conformance run and the `redlock5_failover` tests run those
//! scripts on real nodes.
//!
//! Properties, on durable nodes (counters and keys survive restarts):
//! - [`RedlockTokens`]: every issued token is greater than every token
//!   issued before it;
//! - [`RedlockHolders`]: at most one client believes it holds the lease at
//!   any instant (from its decision until its local validity ends).
//!
//! Volatile nodes (a wipe loses the counter and the key) break both, as the
//! provider declares (`TokenDurability::Volatile`).

use lease_redis::protocol::{TokenStep, quorum, token_step};
use stateright::{Model, Property};

/// Which decisions the clients make.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RedlockDesign {
    /// The provider's: a majority by `quorum`, the token by `token_step`.
    Current,
    /// Broken: the raise round never runs.
    NeverRaise,
    /// Broken: half of the nodes is enough.
    HalfIsEnough,
}

fn majority(nodes: u8, design: RedlockDesign) -> usize {
    match design {
        RedlockDesign::HalfIsEnough => usize::from(nodes) / 2,
        _ => quorum(usize::from(nodes)),
    }
}

/// The tokens: each step is one whole acquire round on `nodes` nodes (which
/// nodes grant in time, which take the acquire late, on which granting
/// nodes the raise lands, whether the round ends within validity), or a
/// node wipe on volatile nodes.
#[derive(Clone, Debug)]
pub struct RedlockTokens {
    /// How many nodes.
    pub nodes: u8,
    /// Whether a node may lose its counter.
    pub volatile: bool,
    /// The rounds' decisions.
    pub design: RedlockDesign,
}

/// Counters relative to the last issued token (so equal situations at
/// different heights are one state), and what the run has seen.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TokensState {
    counters: Vec<i16>,
    issued: u8,
    raised: bool,
    regressed: bool,
}

/// A step of [`RedlockTokens`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Round {
    /// One acquire round (node sets as bit masks).
    Acquire {
        /// Nodes that granted in time.
        granted: u8,
        /// Other nodes that took the acquire after the round closed.
        late: u8,
        /// Granting nodes where the raise landed (when one runs).
        raised: u8,
        /// Whether the round ended within the lease's validity.
        in_time: bool,
    },
    /// A node loses its counter (volatile nodes only).
    Wipe(u8),
}

/// An offset large enough that relative counters stay positive in `u64`.
const BASE: i64 = 1 << 20;

impl Model for RedlockTokens {
    type State = TokensState;
    type Action = Round;

    fn init_states(&self) -> Vec<TokensState> {
        vec![TokensState {
            counters: vec![0; usize::from(self.nodes)],
            issued: 0,
            raised: false,
            regressed: false,
        }]
    }

    fn actions(&self, _: &TokensState, actions: &mut Vec<Round>) {
        let all = (1u8 << self.nodes) - 1;
        for granted in 0..=all {
            let rest = all & !granted;
            for late in (0..=rest).filter(|l| l & !rest == 0) {
                for raised in (0..=granted).filter(|r| r & !granted == 0) {
                    for in_time in [true, false] {
                        actions.push(Round::Acquire {
                            granted,
                            late,
                            raised,
                            in_time,
                        });
                    }
                }
            }
        }
        if self.volatile {
            actions.extend((0..self.nodes).map(Round::Wipe));
        }
    }

    fn next_state(&self, last: &TokensState, round: Round) -> Option<TokensState> {
        let mut s = last.clone();
        let mut c: Vec<i64> = s.counters.iter().map(|r| BASE + i64::from(*r)).collect();
        match round {
            // Far below any token issued within the bound.
            Round::Wipe(j) => c[usize::from(j)] = BASE - 100,
            Round::Acquire {
                granted,
                late,
                raised,
                in_time,
            } => {
                let on = |mask: u8, i: usize| mask & (1 << i) != 0;
                let mut won = Vec::new();
                for (i, x) in c.iter_mut().enumerate() {
                    if on(granted, i) || on(late, i) {
                        *x += 1;
                    }
                    if on(granted, i) {
                        won.push((i, *x as u64));
                    }
                }
                let TokenStep { token, raise } = token_step(&won);
                let raise = raise && self.design != RedlockDesign::NeverRaise;
                let q = majority(self.nodes, self.design);
                let enough = if raise {
                    for (i, x) in c.iter_mut().enumerate() {
                        if on(raised, i) {
                            *x = (*x).max(token as i64);
                        }
                    }
                    s.raised = true;
                    raised.count_ones() as usize >= q
                } else {
                    won.len() >= q
                };
                if enough && in_time {
                    let token = token as i64;
                    if s.issued > 0 && token <= BASE {
                        s.regressed = true;
                    }
                    s.issued = s.issued.saturating_add(1);
                    // Counters relative to the new last token.
                    for x in &mut c {
                        *x += BASE - token.max(BASE);
                    }
                }
            }
        }
        s.counters = c
            .iter()
            .map(|x| i16::try_from(x - BASE).unwrap_or(i16::MIN))
            .collect();
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("tokens increase", |_, s: &TokensState| !s.regressed),
            Property::sometimes(
                "a raised round is issued after another",
                |_, s: &TokensState| s.raised && s.issued >= 2,
            ),
        ]
    }
}

/// The holders: `clients` clients of `attempts` rounds each on `nodes`
/// nodes, a TTL of 3 ticks of 100 ms, time up to `horizon` ticks.
///
/// What only shortens a holder's window or frees a node early is taken as
/// one step: the raise round (it comes between a won majority and the
/// lease being handed out; the model hands a won lease out at once, the
/// worst case for exclusion; [`RedlockTokens`] checks the raise), a
/// release, and a lost round's cancel (its copies deleted and tombstones
/// left, so its late acquires are refused; a cancel that misses a node
/// leaves a copy of an owner who believes nothing, which only blocks the
/// node until it expires).
#[derive(Clone, Debug)]
pub struct RedlockHolders {
    /// How many nodes.
    pub nodes: u8,
    /// How many clients.
    pub clients: u8,
    /// Acquire rounds per client.
    pub attempts: u8,
    /// The last tick.
    pub horizon: u8,
    /// Whether a node may lose its key.
    pub volatile: bool,
    /// The rounds' decisions.
    pub design: RedlockDesign,
    /// A lease's local validity in ms after its request was sent, from
    /// [`Lease::new`](lease_api::Lease::new).
    validity_ms: u32,
}

const TTL_TICKS: u8 = 3;

impl RedlockHolders {
    /// `nodes` nodes, `clients` clients of `attempts` rounds each, 4 ticks
    /// (a lease of 3 ticks expires within them).
    pub fn new(
        nodes: u8,
        clients: u8,
        attempts: u8,
        design: RedlockDesign,
        volatile: bool,
    ) -> Self {
        let validity_ms = crate::local_validity_ms(100 * u64::from(TTL_TICKS));
        RedlockHolders {
            nodes,
            clients,
            attempts,
            horizon: 4,
            volatile,
            design,
            validity_ms,
        }
    }

    fn believes(&self, s: &HoldersState, c: usize) -> bool {
        s.clients[c] == Client::Holding
            && u32::from(s.now) * 100 < u32::from(s.sent_at[c]) * 100 + self.validity_ms
    }
}

/// An owner: client and round.
type Owner = (u8, u8);

/// One node: the key's holder and when it expires, and the owners whose
/// cancel ran here.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Node {
    holder: Option<(Owner, u8)>,
    tombstones: Vec<Owner>,
}

/// An acquire call to one node, as the client sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Call {
    /// Not sent.
    None,
    /// Sent, not answered.
    Pending,
    /// Granted.
    Yes,
    /// Refused.
    No,
}

/// One client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Client {
    /// Between rounds.
    Idle,
    /// Waiting for a majority's answers.
    Acquiring,
    /// Holds the lease until its local validity ends.
    Holding,
}

/// Nodes, clients, calls and time.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HoldersState {
    now: u8,
    nodes: Vec<Node>,
    clients: Vec<Client>,
    round: Vec<u8>,
    sent_at: Vec<u8>,
    calls: Vec<Vec<Call>>,
    /// Per client and node: the round of an acquire still on its way after
    /// its client stopped waiting (a late grant, if the node takes it).
    late: Vec<Vec<Option<u8>>>,
    issued: u8,
}

/// A step of [`RedlockHolders`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Client starts a round (sends its acquire to every node).
    Start(u8),
    /// Node takes client's acquire, and the client has the reply (and
    /// decides once a majority answered either way).
    Take(u8, u8),
    /// Client stops waiting for its unanswered calls (the node timeout;
    /// lost requests or replies) and decides; they may still reach their
    /// nodes.
    Timeout(u8),
    /// Node takes client's acquire that nobody waits for any more.
    TakeLate(u8, u8),
    /// Client releases the lease it holds.
    Release(u8),
    /// A tick.
    Tick,
    /// Node loses its key (volatile nodes only).
    Wipe(u8),
}

impl RedlockHolders {
    /// ACQUIRE at node `j`, as the script does it.
    fn acquire_at(s: &mut HoldersState, owner: Owner, j: usize) -> Call {
        let now = s.now;
        let node = &mut s.nodes[j];
        let free = node.holder.is_none_or(|(_, e)| e <= now);
        if free && !node.tombstones.contains(&owner) {
            node.holder = Some((owner, now + TTL_TICKS));
            Call::Yes
        } else {
            Call::No
        }
    }

    /// Deletes the owner's copies on every node; a cancel leaves tombstones.
    fn remove(s: &mut HoldersState, owner: Owner, tombstone: bool) {
        for node in &mut s.nodes {
            if node.holder.is_some_and(|(o, _)| o == owner) {
                node.holder = None;
            }
            if tombstone && !node.tombstones.contains(&owner) {
                node.tombstones.push(owner);
            }
        }
    }

    /// The client's decision, once its answers allow one (`timed_out`: it
    /// stopped waiting for the rest).
    fn decide(&self, s: &mut HoldersState, c: usize, timed_out: bool) {
        let n = usize::from(self.nodes);
        let q = majority(self.nodes, self.design);
        let yes = s.calls[c].iter().filter(|x| **x == Call::Yes).count();
        let no = s.calls[c].iter().filter(|x| **x == Call::No).count();
        if !(yes >= q || no > n - q || timed_out) {
            return;
        }
        let round = s.round[c];
        for (j, call) in s.calls[c].iter_mut().enumerate() {
            if *call == Call::Pending {
                s.late[c][j] = Some(round);
            }
            *call = Call::None;
        }
        let in_time = u32::from(s.now) * 100 < u32::from(s.sent_at[c]) * 100 + self.validity_ms;
        if yes >= q && in_time {
            s.clients[c] = Client::Holding;
            s.issued = s.issued.saturating_add(1);
        } else {
            s.clients[c] = Client::Idle;
            Self::remove(s, (c as u8, round), true);
        }
    }
}

impl Model for RedlockHolders {
    type State = HoldersState;
    type Action = Action;

    fn init_states(&self) -> Vec<HoldersState> {
        let n = usize::from(self.nodes);
        let k = usize::from(self.clients);
        let node = Node {
            holder: None,
            tombstones: Vec::new(),
        };
        vec![HoldersState {
            now: 0,
            nodes: vec![node; n],
            clients: vec![Client::Idle; k],
            round: vec![0; k],
            sent_at: vec![0; k],
            calls: vec![vec![Call::None; n]; k],
            late: vec![vec![None; n]; k],
            issued: 0,
        }]
    }

    fn actions(&self, s: &HoldersState, actions: &mut Vec<Action>) {
        for c in 0..self.clients {
            let ci = usize::from(c);
            match s.clients[ci] {
                Client::Idle if s.round[ci] < self.attempts => actions.push(Action::Start(c)),
                Client::Acquiring => actions.push(Action::Timeout(c)),
                Client::Holding => actions.push(Action::Release(c)),
                Client::Idle => {}
            }
            for j in 0..self.nodes {
                if s.calls[ci][usize::from(j)] == Call::Pending {
                    actions.push(Action::Take(c, j));
                }
                if s.late[ci][usize::from(j)].is_some() {
                    actions.push(Action::TakeLate(c, j));
                }
            }
        }
        if s.now < self.horizon {
            actions.push(Action::Tick);
        }
        if self.volatile {
            actions.extend((0..self.nodes).map(Action::Wipe));
        }
    }

    fn next_state(&self, last: &HoldersState, action: Action) -> Option<HoldersState> {
        let mut s = last.clone();
        match action {
            Action::Start(c) => {
                let ci = usize::from(c);
                s.round[ci] += 1;
                s.sent_at[ci] = s.now;
                s.calls[ci].fill(Call::Pending);
                s.clients[ci] = Client::Acquiring;
            }
            Action::Take(c, j) => {
                let (ci, ji) = (usize::from(c), usize::from(j));
                let owner = (c, s.round[ci]);
                s.calls[ci][ji] = Self::acquire_at(&mut s, owner, ji);
                self.decide(&mut s, ci, false);
            }
            Action::Timeout(c) => self.decide(&mut s, usize::from(c), true),
            Action::TakeLate(c, j) => {
                let (ci, ji) = (usize::from(c), usize::from(j));
                let round = s.late[ci][ji].take()?;
                Self::acquire_at(&mut s, (c, round), ji);
            }
            Action::Release(c) => {
                let ci = usize::from(c);
                s.clients[ci] = Client::Idle;
                let owner = (c, s.round[ci]);
                Self::remove(&mut s, owner, false);
            }
            Action::Tick => {
                s.now += 1;
                for c in 0..s.clients.len() {
                    if s.clients[c] == Client::Holding && !self.believes(&s, c) {
                        s.clients[c] = Client::Idle;
                    }
                }
            }
            Action::Wipe(j) => {
                s.nodes[usize::from(j)] = Node {
                    holder: None,
                    tombstones: Vec::new(),
                };
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "at most one holder at a time",
                |m: &RedlockHolders, s: &HoldersState| {
                    (0..s.clients.len()).filter(|c| m.believes(s, *c)).count() <= 1
                },
            ),
            Property::sometimes("two leases are issued", |_, s: &HoldersState| s.issued >= 2),
        ]
    }
}
