//! A lease session's batched renewals: two leases renewed in one call,
//! each answered on its own (renewed, gone, or an error), or the whole
//! answer lost; a store that takes the call late, or fails one lease of the
//! batch; a key deleted behind the session's back; time passing on the
//! store's clock while the client fires what it can no longer trust.
//!
//! The client decides with the session's code: a renewed lease's local
//! validity is [`Lease::renewed`] at the batch's send time, and its lost
//! signal fires at [`SessionTiming::fire_at_of`] that validity (the
//! session's round never holds a fire back: it runs under the earliest
//! fire time). The store's renewal is stated as every backend's statement
//! does it: a lease the store still holds unexpired gets a new expiry of
//! now + TTL on the store's clock; otherwise the answer is "not held". The
//! conformance suite's session cases run each backend's real renewal
//! (`session_key_lost_alone`: a key deleted behind the session's back fires
//! alone; `session_outage_fires_every_lease_by_validity`: a store that stops
//! answering fires every lease by its validity).
//!
//! Properties:
//! - a lease the client believes valid (its lost signal not fired) is held
//!   by the store, unexpired, unless the store lost it otherwise
//!   (a key deleted behind its back, which the next answer reports);
//! - a lease the store answered "not held" is never believed valid again.

use std::time::Duration;

use lease_api::backend::{OwnerId, SessionTiming};
use lease_api::{FencingToken, Lease, LeaseKey, SessionConfig};
use stateright::{Model, Property};
use tokio::time::Instant;

/// How the client applies a batch's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SessionDesign {
    /// The session's: validity from the batch's send time, each lease by
    /// its own answer, fires never held back by a round in flight.
    Current,
    /// Broken: validity counted from when the answer arrived.
    ValidityFromAnswer,
    /// Broken: a batch that answered at all renews every lease in it.
    BatchAsOne,
    /// Broken: no lease fires while a round is in flight.
    FireAfterRound,
}

/// The model: two leases of 600 ms, ticks of 100 ms up to `horizon`.
pub struct Session {
    /// How the client applies answers.
    pub design: SessionDesign,
    /// The last tick.
    pub horizon: u8,
    ttl: Duration,
    timing: SessionTiming,
    template: Option<Lease>,
    base: Instant,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Session {{ design: {:?}, horizon: {} ticks of {TICK_MS} ms, ttl: {:?}, {:?} }}",
            self.design, self.horizon, self.ttl, self.timing
        )
    }
}

const LEASES: usize = 2;
const TICK_MS: u32 = 100;

impl Session {
    /// Leases of 600 ms (the session's default timing), 8 ticks.
    pub fn new(design: SessionDesign) -> Self {
        Session::until(design, 8)
    }

    /// Leases of 600 ms, `horizon` ticks.
    pub fn until(design: SessionDesign, horizon: u8) -> Self {
        let ttl = Duration::from_millis(600);
        let base = Instant::now();
        let template = LeaseKey::new("model")
            .ok()
            .map(|key| Lease::new(key, FencingToken(1), OwnerId::random(), ttl, base));
        let window = template
            .as_ref()
            .map_or(ttl, |l| l.valid_until().saturating_duration_since(base));
        Session {
            design,
            horizon,
            ttl,
            timing: SessionTiming::new(window, &SessionConfig::ttl(ttl)),
            template,
            base,
        }
    }

    fn ms(&self, at: Instant) -> u32 {
        u32::try_from(at.saturating_duration_since(self.base).as_millis()).unwrap_or(u32::MAX)
    }

    /// Local validity (ms) of a renewal sent at `sent_ms`: the lease's own code.
    fn validity_after(&self, sent_ms: u32) -> u32 {
        self.template.as_ref().map_or(0, |l| {
            let sent = self.base + Duration::from_millis(u64::from(sent_ms));
            self.ms(l.renewed(self.ttl, sent).valid_until())
        })
    }

    /// When a lease valid until `valid_ms` fires: the session's own code.
    fn fire_ms(&self, valid_ms: u32) -> u32 {
        let valid = self.base + Duration::from_millis(u64::from(valid_ms));
        self.ms(self.timing.fire_at_of(valid))
    }

    /// The job trusts a lease until its lost signal fires.
    fn believes(&self, s: &State, i: usize) -> bool {
        !s.leases[i].fired
    }
}

/// One lease, on both sides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LeaseState {
    /// The store holds it (not deleted).
    stored: bool,
    /// Its expiry on the store's clock (ms).
    expires_ms: u32,
    /// The client's local validity (ms).
    valid_ms: u32,
    /// The client fired its lost signal.
    fired: bool,
    /// The store lost it behind the client's back.
    deleted: bool,
    /// The store answered "not held".
    revoked: bool,
}

/// What the store answered for one lease of the batch in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Answer {
    /// Not taken by the store yet.
    Pending,
    /// Renewed.
    Renewed,
    /// Not held.
    NotHeld,
    /// An error for this lease.
    Failed,
}

/// The store, the client and the batch in flight.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    tick: u8,
    leases: [LeaseState; LEASES],
    /// The batch in flight: when it was sent, and each lease's answer.
    round: Option<(u32, [Answer; LEASES])>,
    revoked_believed: bool,
    renewed: bool,
}

impl State {
    fn now_ms(&self) -> u32 {
        u32::from(self.tick) * TICK_MS
    }
}

/// A step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The client sends a renewal of both leases.
    Send,
    /// The store takes the batch's renewal of one lease.
    Renew(u8),
    /// The store fails the batch's renewal of one lease.
    Fail(u8),
    /// The batch's answer arrives.
    Answer,
    /// The batch's answer is lost (the client sees an error).
    Lose,
    /// The store loses one lease behind the client's back.
    Delete(u8),
    /// 100 ms pass.
    Tick,
}

impl Model for Session {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let valid_ms = self.validity_after(0);
        let lease = LeaseState {
            stored: true,
            expires_ms: u32::try_from(self.ttl.as_millis()).unwrap_or(u32::MAX),
            valid_ms,
            fired: false,
            deleted: false,
            revoked: false,
        };
        vec![State {
            tick: 0,
            leases: [lease; LEASES],
            round: None,
            revoked_believed: false,
            renewed: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        match &s.round {
            None if s.leases.iter().any(|l| !l.fired) => actions.push(Action::Send),
            None => {}
            Some((_, answers)) => {
                for (i, a) in answers.iter().enumerate() {
                    if *a == Answer::Pending {
                        actions.extend([Action::Renew(i as u8), Action::Fail(i as u8)]);
                    }
                }
                if !answers.contains(&Answer::Pending) {
                    actions.push(Action::Answer);
                }
                actions.push(Action::Lose);
            }
        }
        for (i, l) in s.leases.iter().enumerate() {
            if l.stored {
                actions.push(Action::Delete(i as u8));
            }
        }
        if s.tick < self.horizon {
            actions.push(Action::Tick);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        let now = s.now_ms();
        match action {
            Action::Send => s.round = Some((now, [Answer::Pending; LEASES])),
            Action::Renew(i) | Action::Fail(i) => {
                let (_, answers) = s.round.as_mut()?;
                let l = &mut s.leases[usize::from(i)];
                answers[usize::from(i)] = if matches!(action, Action::Fail(_)) {
                    Answer::Failed
                } else if l.stored && now < l.expires_ms {
                    l.expires_ms = now + u32::try_from(self.ttl.as_millis()).unwrap_or(0);
                    Answer::Renewed
                } else {
                    Answer::NotHeld
                };
            }
            Action::Answer => {
                let (sent, answers) = s.round.take()?;
                let any_renewed = answers.contains(&Answer::Renewed);
                for (l, a) in s.leases.iter_mut().zip(answers) {
                    let renewed = match self.design {
                        SessionDesign::BatchAsOne => any_renewed && a != Answer::NotHeld,
                        _ => a == Answer::Renewed,
                    };
                    if l.fired {
                        continue;
                    }
                    if renewed {
                        let from = match self.design {
                            SessionDesign::ValidityFromAnswer => now,
                            _ => sent,
                        };
                        l.valid_ms = self.validity_after(from);
                        s.renewed = true;
                    } else if a == Answer::NotHeld {
                        l.fired = true;
                        l.revoked = true;
                    }
                }
            }
            Action::Lose => s.round = None,
            Action::Delete(i) => {
                let l = &mut s.leases[usize::from(i)];
                l.stored = false;
                l.deleted = true;
            }
            Action::Tick => {
                s.tick += 1;
                let now = s.now_ms();
                let hold_back = self.design == SessionDesign::FireAfterRound && s.round.is_some();
                for i in 0..LEASES {
                    let fire_ms = self.fire_ms(s.leases[i].valid_ms);
                    if !hold_back && now >= fire_ms {
                        s.leases[i].fired = true;
                    }
                }
            }
        }
        s.revoked_believed |= (0..LEASES).any(|i| s.leases[i].revoked && self.believes(&s, i));
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "a lease believed valid is held by the store",
                |m: &Session, s: &State| {
                    (0..LEASES).all(|i| {
                        let l = &s.leases[i];
                        !m.believes(s, i) || l.deleted || (l.stored && s.now_ms() < l.expires_ms)
                    })
                },
            ),
            Property::always(
                "a lease the store said is gone stays lost",
                |_, s: &State| !s.revoked_believed,
            ),
            Property::sometimes(
                "leases are renewed past their first TTL",
                |m: &Session, s: &State| s.now_ms() >= 600 && (0..LEASES).all(|i| m.believes(s, i)),
            ),
            Property::sometimes("a deleted lease is reported gone", |_, s: &State| {
                s.leases.iter().any(|l| l.deleted && l.revoked)
            }),
        ]
    }
}
