//! The queue of waiters kept by TTL and mark (C17): the in-memory
//! provider's, Redis's sorted set and PostgreSQL's `<table>_waiters`.
//!
//! Waiters join (an answer may be lost, and the join is then retried with
//! the same mark), look where they stand, refresh their ticket, take the key
//! when first in line and leave; a waiter may crash and leave its ticket to
//! expire; time passes; the store may lose its whole queue and its counter
//! (a Redis restart without persistence, a failover to a lagging replica),
//! so that numbers are given again. The store's steps run
//! [`lease_api::backend::queue_rules`], which the in-memory provider runs too;
//! Redis's scripts and PostgreSQL's statements state the same rules, and
//! each store's `a_ticket_number_given_again_after_the_queue_was_lost_is_not_the_old_ticket`
//! test (`redis_specific`, `postgres_specific`) and the conformance suite's
//! fair-waiting cases pin the real store to them.
//!
//! Properties, in every reachable state:
//! - no waiter's step finds, refreshes, or removes a ticket another
//!   waiter's join made;
//! - a waiter is served only when no live ticket that arrived before its own
//!   is in line (FIFO among live waiters);
//! - a waiter told it is behind a ticket is behind a live one (no waiter
//!   waits on a dead ticket).

use std::collections::BTreeMap;

use lease_api::backend::queue_rules::{self, QueuedTicket, Standing};
use stateright::{Model, Property};

/// Which rules the store follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QueueDesign {
    /// The providers' rules: a ticket is its number and its mark, and
    /// expired tickets are dropped before a waiter looks.
    Marked,
    /// Broken: the design before marks, where a ticket was its number
    /// alone (the ticket-reuse defect).
    NumberOnly,
    /// Broken: a look that does not drop expired tickets first.
    NoExpiryBeforeLook,
}

/// The model: `waiters` waiters on one key, tickets of `ttl` ticks, time
/// up to `horizon`.
#[derive(Clone, Debug)]
pub struct FairQueue {
    /// How many waiters.
    pub waiters: u8,
    /// A ticket's TTL, in ticks.
    pub ttl: u8,
    /// The last tick.
    pub horizon: u8,
    /// The store's rules.
    pub design: QueueDesign,
}

impl FairQueue {
    /// `waiters` waiters, tickets of 2 ticks, 4 ticks of time.
    pub fn new(waiters: u8, design: QueueDesign) -> Self {
        FairQueue {
            waiters,
            ttl: 2,
            horizon: 4,
            design,
        }
    }
}

/// A ticket as the store keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Kept {
    mark: u64,
    expires: u8,
    /// When the store took the join, among all joins (the model's record,
    /// for the FIFO property; the store orders by number).
    arrival: u8,
}

impl QueuedTicket<u8> for Kept {
    fn mark(&self) -> u64 {
        self.mark
    }
    fn expires_at(&self) -> u8 {
        self.expires
    }
}

/// One waiter's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Waiter {
    /// Not in line: joins next.
    Idle,
    /// Its join's answer was lost: the store may hold a ticket of `mark`.
    Unanswered {
        /// The lost join's mark.
        mark: u64,
    },
    /// Holds the ticket (`seq`, `mark`).
    Waiting {
        /// The ticket's number.
        seq: u64,
        /// The ticket's mark.
        mark: u64,
    },
    /// Was first in line and took the key; leaves the queue next.
    Served {
        /// The ticket's number.
        seq: u64,
        /// The ticket's mark.
        mark: u64,
    },
    /// Left the queue.
    Left,
    /// Crashed: its ticket, if any, ends with its TTL.
    Crashed,
}

/// The store's queue, the waiters, and what the run has seen.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    now: u8,
    /// The store's ticket counter (lost with the queue).
    counter: u64,
    arrivals: u8,
    queue: BTreeMap<u64, Kept>,
    waiters: Vec<Waiter>,
    joins: Vec<u8>,
    wiped: bool,
    served: u8,
    served_after_wipe: bool,
    retry_found: bool,
    took_anothers: bool,
    out_of_order: bool,
    behind_dead: bool,
}

/// A step of one waiter (by index) or of the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// A join (or the retry of a lost one) and its answer.
    Join(u8),
    /// A join the store took whose answer was lost.
    JoinUnanswered(u8),
    /// A look at where the ticket stands.
    Look(u8),
    /// A refresh of the ticket.
    Refresh(u8),
    /// Leaving the queue.
    Leave(u8),
    /// The waiter's process dies.
    Crash(u8),
    /// A tick of the store's clock.
    Tick,
    /// The store loses its queue and its counter.
    Wipe,
}

fn waiter_of(mark: u64) -> u64 {
    (mark - 1) / 16
}

impl FairQueue {
    fn is_own(&self, s: &State, seq: u64, mark: u64) -> bool {
        match self.design {
            QueueDesign::NumberOnly => s.queue.contains_key(&seq),
            _ => queue_rules::is_own(&s.queue, seq, mark),
        }
    }

    fn standing(&self, s: &State, seq: u64, mark: u64) -> Standing {
        match self.design {
            QueueDesign::NumberOnly if s.queue.contains_key(&seq) => {
                match s.queue.range(..seq).next_back() {
                    None => Standing::First,
                    Some((ahead, _)) => Standing::Behind(*ahead),
                }
            }
            QueueDesign::NumberOnly => Standing::Gone,
            _ => queue_rules::standing(&s.queue, seq, mark),
        }
    }

    fn refreshable(&self, s: &State, seq: u64, mark: u64) -> bool {
        match self.design {
            QueueDesign::NumberOnly => s
                .queue
                .get(&seq)
                .is_some_and(|k| queue_rules::is_live(k, s.now)),
            _ => queue_rules::refreshable(&s.queue, seq, mark, s.now),
        }
    }

    /// The store's side of a join of `mark`: the live ticket of that mark
    /// (a retried join), or a new one at the end of the line.
    fn join(&self, s: &mut State, mark: u64) -> u64 {
        let retried = match self.design {
            QueueDesign::NumberOnly => None,
            _ => queue_rules::rejoin_of(&s.queue, mark, s.now),
        };
        if let Some(seq) = retried
            && let Some(k) = s.queue.get_mut(&seq)
        {
            k.expires = s.now + self.ttl;
            s.retry_found = true;
            return seq;
        }
        s.counter += 1;
        s.queue.insert(
            s.counter,
            Kept {
                mark,
                expires: s.now + self.ttl,
                arrival: s.arrivals,
            },
        );
        s.arrivals += 1;
        s.counter
    }

    /// Records a step of waiter `i` that touched the ticket at `seq` made by
    /// another waiter's join.
    fn touched(s: &mut State, i: u8, seq: u64) {
        if s.queue
            .get(&seq)
            .is_some_and(|k| waiter_of(k.mark) != u64::from(i))
        {
            s.took_anothers = true;
        }
    }
}

impl Model for FairQueue {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            counter: 0,
            arrivals: 0,
            queue: BTreeMap::new(),
            waiters: vec![Waiter::Idle; usize::from(self.waiters)],
            joins: vec![0; usize::from(self.waiters)],
            wiped: false,
            served: 0,
            served_after_wipe: false,
            retry_found: false,
            took_anothers: false,
            out_of_order: false,
            behind_dead: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for (i, w) in s.waiters.iter().enumerate() {
            let i = i as u8;
            match w {
                Waiter::Idle if s.joins[usize::from(i)] < 3 => {
                    actions.extend([Action::Join(i), Action::JoinUnanswered(i)]);
                }
                Waiter::Unanswered { .. } => actions.extend([Action::Join(i), Action::Crash(i)]),
                Waiter::Waiting { .. } => actions.extend([
                    Action::Look(i),
                    Action::Refresh(i),
                    Action::Leave(i),
                    Action::Crash(i),
                ]),
                Waiter::Served { .. } => actions.push(Action::Leave(i)),
                _ => {}
            }
        }
        if s.now < self.horizon {
            actions.push(Action::Tick);
        }
        if !s.wiped {
            actions.push(Action::Wipe);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Join(i) | Action::JoinUnanswered(i) => {
                let mark = match s.waiters[usize::from(i)] {
                    Waiter::Unanswered { mark } => mark,
                    _ => {
                        s.joins[usize::from(i)] += 1;
                        u64::from(i) * 16 + u64::from(s.joins[usize::from(i)])
                    }
                };
                let seq = self.join(&mut s, mark);
                s.waiters[usize::from(i)] = match action {
                    Action::Join(_) => Waiter::Waiting { seq, mark },
                    _ => Waiter::Unanswered { mark },
                };
            }
            Action::Look(i) => {
                let Waiter::Waiting { seq, mark } = s.waiters[usize::from(i)] else {
                    return None;
                };
                if self.design != QueueDesign::NoExpiryBeforeLook {
                    let now = s.now;
                    s.queue.retain(|_, k| queue_rules::is_live(k, now));
                }
                match self.standing(&s, seq, mark) {
                    Standing::Gone => s.waiters[usize::from(i)] = Waiter::Idle,
                    Standing::First => {
                        Self::touched(&mut s, i, seq);
                        let mine = s.queue.get(&seq).map_or(u8::MAX, |k| k.arrival);
                        let earlier_live = s.waiters.iter().enumerate().any(|(j, w)| {
                            j != usize::from(i)
                                && matches!(w, Waiter::Waiting { seq, mark } | Waiter::Served { seq, mark }
                                    if s.queue.get(seq).is_some_and(|k| {
                                        k.mark == *mark && queue_rules::is_live(k, s.now) && k.arrival < mine
                                    }))
                        });
                        s.out_of_order |= earlier_live;
                        s.served += 1;
                        s.served_after_wipe |= s.wiped;
                        s.waiters[usize::from(i)] = Waiter::Served { seq, mark };
                    }
                    Standing::Behind(ahead) => {
                        Self::touched(&mut s, i, seq);
                        let live = s
                            .queue
                            .get(&ahead)
                            .is_some_and(|k| queue_rules::is_live(k, s.now));
                        s.behind_dead |= !live;
                    }
                }
            }
            Action::Refresh(i) => {
                let Waiter::Waiting { seq, mark } = s.waiters[usize::from(i)] else {
                    return None;
                };
                if self.refreshable(&s, seq, mark) {
                    Self::touched(&mut s, i, seq);
                    if let Some(k) = s.queue.get_mut(&seq) {
                        k.expires = s.now + self.ttl;
                    }
                } else {
                    s.waiters[usize::from(i)] = Waiter::Idle;
                }
            }
            Action::Leave(i) => {
                let (Waiter::Waiting { seq, mark } | Waiter::Served { seq, mark }) =
                    s.waiters[usize::from(i)]
                else {
                    return None;
                };
                if self.is_own(&s, seq, mark) {
                    Self::touched(&mut s, i, seq);
                    s.queue.remove(&seq);
                }
                s.waiters[usize::from(i)] = Waiter::Left;
            }
            Action::Crash(i) => s.waiters[usize::from(i)] = Waiter::Crashed,
            Action::Tick => s.now += 1,
            Action::Wipe => {
                s.queue.clear();
                s.counter = 0;
                s.wiped = true;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("no ticket is taken by another waiter", |_, s: &State| {
                !s.took_anothers
            }),
            Property::always("FIFO among live waiters", |_, s: &State| !s.out_of_order),
            Property::always("no waiter waits on a dead ticket", |_, s: &State| {
                !s.behind_dead
            }),
            Property::sometimes("a waiter is served after another", |_, s: &State| {
                s.served >= 2
            }),
            Property::sometimes("a retried join finds its ticket", |_, s: &State| {
                s.retry_found
            }),
            Property::sometimes(
                "a waiter is served after the store lost its queue",
                |_, s: &State| s.served_after_wipe,
            ),
        ]
    }
}
