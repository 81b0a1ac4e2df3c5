//! Read/write leases (C19): readers share a key, a writer has it alone, and
//! a writer that finds it held records that it waits, which keeps new
//! readers out until it gets its turn or its record expires.
//!
//! Clients try to read or write, hold until their lease expires or they
//! release it, wait as writers (refreshing their record by trying again)
//! or give up; time passes on the store's clock. The store decides with
//! [`lease_api::backend::rw_rules`], which the in-memory provider runs;
//! the other backends' scripts and statements state the same rules, and the
//! conformance suite's C19 cases (`rw_concurrent_readers_and_writers_never_overlap`,
//! `rw_waiting_writer_keeps_new_readers_out`) pin each to them.
//!
//! Properties:
//! - no reader holds the key while a writer does, and no two writers do;
//! - while a waiting writer's record is live, no new reader is let in.

use lease_api::backend::rw_rules;
use stateright::{Model, Property};

/// Which rules the store follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RwDesign {
    /// The providers' rules.
    Current,
    /// Broken: a reader ignores waiting writers' records.
    ReadersIgnoreWaitingWriter,
    /// Broken: a writer ignores readers.
    WriterIgnoresReaders,
}

/// The model: `clients` clients, leases and records of 2 ticks, 4 ticks.
#[derive(Clone, Debug)]
pub struct ReadWrite {
    /// How many clients.
    pub clients: u8,
    /// The last tick.
    pub horizon: u8,
    /// The store's rules.
    pub design: RwDesign,
}

const TTL: u8 = 2;

impl ReadWrite {
    /// `clients` clients, 4 ticks.
    pub fn new(clients: u8, design: RwDesign) -> Self {
        ReadWrite {
            clients,
            horizon: 4,
            design,
        }
    }
}

/// One client, with the expiry of what it holds or waits with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Client {
    /// Holds nothing.
    Idle,
    /// Holds a read lease until the tick.
    Reading(u8),
    /// Holds the write lease until the tick.
    Writing(u8),
    /// Waits to write; its record keeps readers out until the tick.
    Waiting(u8),
}

/// The clients (what each holds is what the store holds for it) and time.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    now: u8,
    clients: Vec<Client>,
    reader_past_waiting_writer: bool,
    writer_after_waiting: bool,
}

/// A step of one client (by index), or a tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Try to read.
    Read(u8),
    /// Try to write (a waiting writer tries again, refreshing its record).
    Write(u8),
    /// Release what it holds, or withdraw its waiting record.
    Release(u8),
    /// A tick: what expired is gone.
    Tick,
}

impl ReadWrite {
    fn live(until: u8, now: u8) -> bool {
        until > now
    }

    fn writer(s: &State) -> Option<u8> {
        s.clients.iter().find_map(|c| match c {
            Client::Writing(u) if Self::live(*u, s.now) => Some(*u),
            _ => None,
        })
    }

    fn waiting(s: &State, except: usize) -> Vec<u8> {
        s.clients
            .iter()
            .enumerate()
            .filter_map(|(i, c)| match c {
                Client::Waiting(u) if i != except && Self::live(*u, s.now) => Some(*u),
                _ => None,
            })
            .collect()
    }

    fn holders(s: &State, except: usize) -> Vec<u8> {
        s.clients
            .iter()
            .enumerate()
            .filter_map(|(i, c)| match c {
                Client::Reading(u) | Client::Writing(u) if i != except && Self::live(*u, s.now) => {
                    Some(*u)
                }
                _ => None,
            })
            .collect()
    }
}

impl Model for ReadWrite {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            clients: vec![Client::Idle; usize::from(self.clients)],
            reader_past_waiting_writer: false,
            writer_after_waiting: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for (i, c) in s.clients.iter().enumerate() {
            let i = i as u8;
            match c {
                Client::Idle => actions.extend([Action::Read(i), Action::Write(i)]),
                Client::Waiting(_) => actions.extend([Action::Write(i), Action::Release(i)]),
                Client::Reading(_) | Client::Writing(_) => actions.push(Action::Release(i)),
            }
        }
        if s.now < self.horizon {
            actions.push(Action::Tick);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        let now = s.now;
        match action {
            Action::Read(i) => {
                let i = usize::from(i);
                let waiting = match self.design {
                    RwDesign::ReadersIgnoreWaitingWriter => Vec::new(),
                    _ => Self::waiting(&s, i),
                };
                if rw_rules::read_refused_until(Self::writer(&s), waiting).is_none() {
                    s.reader_past_waiting_writer |= !Self::waiting(&s, i).is_empty();
                    s.clients[i] = Client::Reading(now + TTL);
                }
            }
            Action::Write(i) => {
                let i = usize::from(i);
                let holders = match self.design {
                    RwDesign::WriterIgnoresReaders => Self::writer(&s).into_iter().collect(),
                    _ => Self::holders(&s, i),
                };
                let was_waiting = matches!(s.clients[i], Client::Waiting(_));
                s.clients[i] = match rw_rules::write_refused_until(holders) {
                    None => {
                        s.writer_after_waiting |= was_waiting;
                        Client::Writing(now + TTL)
                    }
                    Some(_) => Client::Waiting(now + TTL),
                };
            }
            Action::Release(i) => s.clients[usize::from(i)] = Client::Idle,
            Action::Tick => {
                s.now += 1;
                let now = s.now;
                for c in &mut s.clients {
                    if let Client::Reading(u) | Client::Writing(u) | Client::Waiting(u) = *c
                        && !Self::live(u, now)
                    {
                        *c = Client::Idle;
                    }
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "no reader beside a writer, no two writers",
                |_, s: &State| {
                    let writers = s
                        .clients
                        .iter()
                        .filter(|c| matches!(c, Client::Writing(_)))
                        .count();
                    let readers = s
                        .clients
                        .iter()
                        .filter(|c| matches!(c, Client::Reading(_)))
                        .count();
                    writers <= 1 && (writers == 0 || readers == 0)
                },
            ),
            Property::always("a waiting writer keeps new readers out", |_, s: &State| {
                !s.reader_past_waiting_writer
            }),
            Property::sometimes("readers share the key", |_, s: &State| {
                s.clients
                    .iter()
                    .filter(|c| matches!(c, Client::Reading(_)))
                    .count()
                    >= 2
            }),
            Property::sometimes("a waiting writer gets its turn", |_, s: &State| {
                s.writer_after_waiting
            }),
        ]
    }
}
