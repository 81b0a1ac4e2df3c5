//! The history checker: counts, from the workers' logs, the sink's records and
//! the nemesis's faults, what went wrong in a run.
//!
//! Definitions (all in real time, `CLOCK_MONOTONIC`):
//! - a grant's **validity** runs from the acquire's return to the earliest of
//!   the lease's local validity end (the latest one the worker saw, renewals
//!   included), its release and its lost signal;
//! - a grant's **acting time** runs from the acquire's return to the later of its
//!   validity end and its last write: a worker that was paused mid-job acts
//!   after its validity ended;
//! - grant `a` **happened before** grant `b` when `a`'s acquire returned before
//!   `b`'s acquire was called;
//! - two grants **conflict** unless both are readers of a read/write lease
//!   (C19): every overlap, stale-admission and token count below is over
//!   conflicting grants only, so readers may share the key while a writer
//!   shares it with no one. With plain leases every pair conflicts.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::history::{Event, Fault, GrantId, Role, SinkRecord, WriteOutcome};
pub use crate::incident::{Incident, IncidentKind};

/// What the checker counted in one run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Counts {
    /// Leases granted.
    pub grants: u64,
    /// Writes the workers sent.
    pub writes: u64,
    /// Writes the sink accepted.
    pub accepted: u64,
    /// Writes sent by a worker whose lease was no longer locally valid (a
    /// paused or cut-off worker finishing its job): what fencing is for.
    pub stale_sent: u64,
    /// Unsafe windows: grants that still acted (wrote) after the next grant
    /// to another worker, so two workers acted as holder at once. Expected
    /// under pauses.
    pub unsafe_windows: u64,
    /// Their total length (from the successor's grant to the last act), in
    /// milliseconds.
    pub unsafe_ms: f64,
    /// Grants whose *validity* outlasted the next grant to another worker: two
    /// workers each held a lease they were entitled to trust. Must be 0.
    pub validity_overlaps: u64,
    /// Their total length, in milliseconds.
    pub validity_overlap_ms: f64,
    /// Of those, the overlaps the host's wall clock explains: between the
    /// earlier grant and the later one it stepped forward by at least the
    /// overlap (see [`crate::clock`]), so a store judging expiry on that
    /// clock ended the earlier lease before its holder's local validity.
    #[serde(default)]
    pub validity_overlaps_in_wall_steps: u64,
    /// Writes the sink accepted from a grant that happened before the grant of
    /// a write it had already accepted. Must be 0 with fencing and monotonic
    /// tokens.
    pub stale_admitted: u64,
    /// Writes the sink accepted after a later grant existed whose holder had
    /// not written yet: the one case a fence cannot stop (it has not seen the
    /// newer token). Reported, not a violation.
    pub late_admitted: u64,
    /// Grants whose token was not greater than that of a grant that happened
    /// before them (for a reader: whose token or writer epoch was below the
    /// token of a writer that happened before it). Must be 0.
    pub token_regressions: u64,
    /// Writes refused although the writer's lease was valid when it sent them
    /// (the fence took a job round from its rightful holder). Must be 0.
    pub lost_rounds: u64,
    /// Tokens whose writes the sink accepted from more than one grant. Must be 0.
    pub duplicated_rounds: u64,
    /// Writes the worker logged as accepted that the sink has no accepted
    /// record of, or the other way round for a live worker. Must be 0.
    pub ack_mismatches: u64,
    /// The share of the run some worker held a valid lease, 0..1.
    pub availability: f64,
    /// Time from each fault to the next grant to another worker, in ms
    /// (store faults: from the heal), sorted.
    pub recovery_ms: Vec<f64>,
    /// Faults after which no other worker got the lease before the run ended.
    pub unrecovered: u64,
    /// Of the grants, readers of a read/write lease.
    #[serde(default)]
    pub reader_grants: u64,
    /// Of the writes, reads by readers (checked by their writer epoch).
    #[serde(default)]
    pub reads: u64,
    /// Every overlap (outside wall clock steps), regression, stale
    /// admission, duplicated and lost round, with its time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub incidents: Vec<Incident>,
}

impl Counts {
    fn incident(&mut self, kind: IncidentKind, at: u64) {
        self.incidents.push(Incident { kind, at });
    }
}

struct GrantView {
    id: GrantId,
    role: Role,
    invoke: u64,
    ok: u64,
    token: u64,
    valid_end: u64,
    acting_end: u64,
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// Checks one run whose workers logged `events`, whose sink recorded `sink`
/// (in receive order or not: it is sorted here) and whose nemesis injected
/// `faults`, between `start` and `end`.
pub fn check(
    events: &[Event],
    sink: &[SinkRecord],
    faults: &[Fault],
    start: u64,
    end: u64,
) -> Counts {
    let mut c = Counts::default();
    let mut grants: HashMap<GrantId, GrantView> = HashMap::new();
    let mut seen_until: HashMap<GrantId, u64> = HashMap::new();
    let mut stop_at: HashMap<GrantId, u64> = HashMap::new();
    let mut last_write: HashMap<GrantId, u64> = HashMap::new();
    let mut worker_accepted: Vec<(GrantId, u64)> = Vec::new();
    for e in events {
        match e {
            Event::Grant {
                id,
                invoke,
                ok,
                token,
                valid_until,
                role,
                ..
            } => {
                c.grants += 1;
                if role.is_reader() {
                    c.reader_grants += 1;
                }
                grants.insert(
                    *id,
                    GrantView {
                        id: *id,
                        role: *role,
                        invoke: *invoke,
                        ok: *ok,
                        token: *token,
                        valid_end: 0,
                        acting_end: 0,
                    },
                );
                let v = seen_until.entry(*id).or_default();
                *v = (*v).max(*valid_until);
            }
            Event::Write {
                id,
                seq,
                valid_at_send,
                valid_until,
                invoke,
                outcome,
                read,
                ..
            } => {
                c.writes += 1;
                if *read {
                    c.reads += 1;
                }
                if !valid_at_send {
                    c.stale_sent += 1;
                }
                let v = seen_until.entry(*id).or_default();
                *v = (*v).max(*valid_until);
                let w = last_write.entry(*id).or_default();
                *w = (*w).max(*invoke);
                if *outcome == WriteOutcome::Accepted {
                    worker_accepted.push((*id, *seq));
                }
            }
            Event::Lost { id, at, .. } => {
                let s = stop_at.entry(*id).or_insert(u64::MAX);
                *s = (*s).min(*at);
            }
            Event::Release {
                id,
                invoke,
                valid_until,
                ..
            } => {
                let v = seen_until.entry(*id).or_default();
                *v = (*v).max(*valid_until);
                let s = stop_at.entry(*id).or_insert(u64::MAX);
                *s = (*s).min(*invoke);
            }
            Event::AcquireFailed { .. } => {}
        }
    }
    // A worker killed by a crash fault acts no more: its grants made before
    // the kill end there (a store may free a dead holder's key before its TTL,
    // as ZooKeeper does when the session ends).
    let mut killed: HashMap<u32, Vec<u64>> = HashMap::new();
    for f in faults.iter().filter(|f| f.kind == "crash") {
        if let Some(w) = f.victim {
            killed.entry(w).or_default().push(f.start);
        }
    }
    for g in grants.values_mut() {
        let until = seen_until.get(&g.id).copied().unwrap_or(g.ok);
        let mut stop = stop_at.get(&g.id).copied().unwrap_or(u64::MAX);
        if let Some(k) = killed
            .get(&g.id.worker)
            .and_then(|kills| kills.iter().filter(|k| **k >= g.ok).min())
        {
            stop = stop.min(*k);
        }
        g.valid_end = until.min(stop).max(g.ok);
        g.acting_end = g.valid_end.max(last_write.get(&g.id).copied().unwrap_or(0));
    }
    let mut by_ok: Vec<&GrantView> = grants.values().collect();
    by_ok.sort_by_key(|g| (g.ok, g.id));

    // Overlaps: each grant against its successor (the next grant to another
    // worker): did it still act, or still hold a valid lease, after that? A
    // grant logged only after its validity ended (its worker was paused
    // between the acquire's return and the log line) never held a valid
    // lease in the log's eyes: it is no successor for validity.
    // The successor of a grant is the next one to another worker that
    // conflicts with it (for a reader, the next writer).
    let other = |a: &GrantView, b: &GrantView| {
        (b.id.worker, b.id.inc) != (a.id.worker, a.id.inc) && a.role.conflicts(b.role)
    };
    for (i, a) in by_ok.iter().enumerate() {
        if let Some(b) = by_ok[i + 1..].iter().find(|b| other(a, b))
            && b.ok < a.acting_end
        {
            c.unsafe_windows += 1;
            c.unsafe_ms += ms(a.acting_end - b.ok);
        }
        if let Some(b) = by_ok[i + 1..]
            .iter()
            .find(|b| other(a, b) && b.valid_end > b.ok)
            && b.ok < a.valid_end
        {
            c.validity_overlaps += 1;
            c.validity_overlap_ms += ms(a.valid_end - b.ok);
            if crate::clock::forward_steps_ns(faults, a.ok, b.ok) >= a.valid_end - b.ok {
                c.validity_overlaps_in_wall_steps += 1;
            } else {
                c.incident(IncidentKind::Overlap, b.ok);
            }
        }
    }

    // Token regressions: sweep grants by invoke against grants by ok. A
    // writer's (or plain holder's) token must be above every earlier grant's;
    // a reader's token and writer epoch at least every earlier writer's.
    let mut by_invoke: Vec<&GrantView> = grants.values().collect();
    by_invoke.sort_by_key(|g| (g.invoke, g.id));
    let (mut p, mut max_any, mut max_writer) = (0usize, None::<u64>, None::<u64>);
    for b in &by_invoke {
        while p < by_ok.len() && by_ok[p].ok < b.invoke {
            max_any = max_any.max(Some(by_ok[p].token));
            if !by_ok[p].role.is_reader() {
                max_writer = max_writer.max(Some(by_ok[p].token));
            }
            p += 1;
        }
        let regressed = match b.role {
            Role::Reader { epoch } => max_writer.is_some_and(|m| m >= b.token || m > epoch),
            _ => max_any.is_some_and(|m| m >= b.token),
        };
        if regressed {
            c.token_regressions += 1;
            // Dated by the grant's return: the call may have waited since
            // before the fault that made the store hand the token out again.
            c.incident(IncidentKind::Regression, b.ok);
        }
    }

    // The sink's view: stale and late admissions, duplicates, lost rounds.
    let mut records: Vec<&SinkRecord> = sink.iter().collect();
    records.sort_by_key(|r| r.recv);
    // The newest invoke of any grant, and of any writer (or plain holder),
    // that wrote or read through the sink; and of those granted by now. A
    // reader conflicts with writers only, a writer with everyone.
    let (mut written_any, mut written_writer) = (0u64, 0u64);
    let (mut p, mut granted_any, mut granted_writer) = (0usize, 0u64, 0u64);
    let mut token_owner: HashMap<u64, GrantId> = HashMap::new();
    let mut dup_tokens: HashMap<u64, ()> = HashMap::new();
    for r in &records {
        while p < by_ok.len() && by_ok[p].ok < r.recv {
            granted_any = granted_any.max(by_ok[p].invoke);
            if !by_ok[p].role.is_reader() {
                granted_writer = granted_writer.max(by_ok[p].invoke);
            }
            p += 1;
        }
        if !r.accepted {
            // Still valid when the sink got it (a write built valid and then
            // delayed past its validity by a pause is no lost round).
            if r.valid_at_send && r.recv < r.valid_until {
                c.lost_rounds += 1;
                c.incident(IncidentKind::LostRound, r.recv);
            }
            continue;
        }
        c.accepted += 1;
        let Some(g) = grants.get(&r.id) else {
            continue;
        };
        let reader = g.role.is_reader();
        let (written, granted) = if reader {
            (written_writer, granted_writer)
        } else {
            (written_any, granted_any)
        };
        if g.ok < written {
            c.stale_admitted += 1;
            c.incident(IncidentKind::StaleAdmitted, r.recv);
        }
        if g.ok < granted {
            c.late_admitted += 1;
        }
        written_any = written_any.max(g.invoke);
        if !reader {
            written_writer = written_writer.max(g.invoke);
        }
        match token_owner.get(&r.token) {
            Some(owner) if *owner != r.id => {
                if dup_tokens.insert(r.token, ()).is_none() {
                    c.duplicated_rounds += 1;
                    c.incident(IncidentKind::DuplicatedRound, r.recv);
                }
            }
            Some(_) => {}
            None => {
                token_owner.insert(r.token, r.id);
            }
        }
    }
    let sink_accepted: HashMap<(GrantId, u64), ()> = sink
        .iter()
        .filter(|r| r.accepted)
        .map(|r| ((r.id, r.seq), ()))
        .collect();
    c.ack_mismatches = worker_accepted
        .iter()
        .filter(|k| !sink_accepted.contains_key(k))
        .count() as u64;

    // Availability: the union of validity intervals within [start, end].
    let span = end.saturating_sub(start).max(1);
    let (mut covered, mut cursor) = (0u64, start);
    for g in &by_ok {
        let (s, e) = (g.ok.max(cursor), g.valid_end.min(end));
        if e > s {
            covered += e - s;
            cursor = e;
        }
    }
    c.availability = covered as f64 / span as f64;

    // Recovery: from each fault to the next grant to another worker.
    for f in faults {
        let from = if f.victim.is_some() { f.start } else { f.end };
        let next = by_ok
            .iter()
            .find(|g| g.ok > from && Some(g.id.worker) != f.victim);
        match next {
            Some(g) => c.recovery_ms.push(ms(g.ok - from)),
            None => c.unrecovered += 1,
        }
    }
    c.recovery_ms.sort_by(f64::total_cmp);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn id(worker: u32, grant: u64) -> GrantId {
        GrantId {
            worker,
            inc: 0,
            grant,
        }
    }

    fn grant(g: GrantId, invoke_ms: u64, ok_ms: u64, token: u64, valid_ms: u64) -> Event {
        Event::Grant {
            id: g,
            invoke: invoke_ms * MS,
            ok: ok_ms * MS,
            token,
            valid_until: valid_ms * MS,
            long: false,
            role: Role::Exclusive,
        }
    }

    fn write(g: GrantId, seq: u64, token: u64, at_ms: u64, valid: bool, ok: bool) -> Event {
        Event::Write {
            id: g,
            seq,
            token,
            valid_at_send: valid,
            valid_until: 0,
            invoke: at_ms * MS,
            done: at_ms * MS + MS / 2,
            outcome: if ok {
                WriteOutcome::Accepted
            } else {
                WriteOutcome::Refused
            },
            read: false,
        }
    }

    fn release(g: GrantId, at_ms: u64) -> Event {
        Event::Release {
            id: g,
            invoke: at_ms * MS,
            done: at_ms * MS + MS,
            valid_until: 0,
            ok: true,
        }
    }

    fn rec(g: GrantId, seq: u64, token: u64, at_ms: u64, valid: bool, ok: bool) -> SinkRecord {
        SinkRecord {
            id: g,
            seq,
            token,
            valid_at_send: valid,
            valid_until: if valid { (at_ms + 100) * MS } else { 0 },
            recv: at_ms * MS,
            accepted: ok,
            read: false,
        }
    }

    /// Two clean rounds, one after the other: nothing to report.
    #[test]
    fn a_clean_history_counts_nothing() {
        let (a, b) = (id(1, 1), id(2, 1));
        let events = vec![
            grant(a, 0, 1, 10, 1000),
            write(a, 1, 10, 5, true, true),
            release(a, 6),
            grant(b, 2, 8, 11, 1008),
            write(b, 1, 11, 9, true, true),
            release(b, 10),
        ];
        let sink = vec![rec(a, 1, 10, 5, true, true), rec(b, 1, 11, 9, true, true)];
        let c = check(&events, &sink, &[], 0, 20 * MS);
        assert_eq!(c.grants, 2);
        assert_eq!(
            (
                c.unsafe_windows,
                c.validity_overlaps,
                c.stale_admitted,
                c.late_admitted,
                c.token_regressions,
                c.lost_rounds,
                c.duplicated_rounds,
                c.ack_mismatches
            ),
            (0, 0, 0, 0, 0, 0, 0, 0)
        );
        assert!((c.availability - 0.35).abs() < 1e-9, "{}", c.availability);
    }

    /// The GC-pause story: `a` is paused mid-job past its validity, `b` gets
    /// the key and writes, `a` wakes and writes. With a fence the sink refuses
    /// `a`; without one it admits a stale write, which the checker must see.
    #[test]
    fn a_paused_writer_is_an_unsafe_window_and_unfenced_a_stale_admission() {
        let (a, b) = (id(1, 1), id(2, 1));
        let events = vec![
            grant(a, 0, 1, 10, 100),
            grant(b, 50, 120, 11, 1120),
            write(b, 1, 11, 130, true, true),
            write(a, 1, 10, 300, false, false),
            release(a, 301),
            release(b, 400),
        ];
        let fenced = vec![
            rec(b, 1, 11, 130, true, true),
            rec(a, 1, 10, 300, false, false),
        ];
        let c = check(&events, &fenced, &[], 0, 500 * MS);
        assert_eq!(c.unsafe_windows, 1);
        assert!((c.unsafe_ms - 180.0).abs() < 1e-9, "{}", c.unsafe_ms);
        assert_eq!(c.validity_overlaps, 0);
        assert_eq!(c.stale_sent, 1);
        assert_eq!(c.stale_admitted, 0);
        assert_eq!(c.lost_rounds, 0, "a's write was not valid when sent");

        let unfenced = vec![
            rec(b, 1, 11, 130, true, true),
            rec(a, 1, 10, 300, false, true),
        ];
        let c = check(&events, &unfenced, &[], 0, 500 * MS);
        assert_eq!(c.stale_admitted, 1);
        assert_eq!(c.late_admitted, 1);
        // a logged its write refused while the sink accepted it.
        assert_eq!(c.ack_mismatches, 0);
    }

    /// A stale write that reaches the sink before the new holder's first
    /// write gets in: late, not stale (the fence has not seen the new token).
    #[test]
    fn a_write_before_the_successor_writes_is_late_not_stale() {
        let (a, b) = (id(1, 1), id(2, 1));
        let events = vec![
            grant(a, 0, 1, 10, 100),
            grant(b, 50, 120, 11, 1120),
            write(a, 1, 10, 125, false, true),
            write(b, 1, 11, 130, true, true),
        ];
        let sink = vec![
            rec(a, 1, 10, 125, false, true),
            rec(b, 1, 11, 130, true, true),
        ];
        let c = check(&events, &sink, &[], 0, 500 * MS);
        assert_eq!((c.late_admitted, c.stale_admitted), (1, 0));
    }

    /// A store that forgot its counter hands out a smaller token to a later
    /// grant: a regression; its rightful write is then refused (a lost round)
    /// and a write of the old holder admitted after it is stale.
    #[test]
    fn a_token_going_back_is_a_regression_and_costs_a_round() {
        let (a, b, c2) = (id(1, 1), id(2, 1), id(3, 1));
        let events = vec![
            grant(a, 0, 1, 10, 100),
            write(a, 1, 10, 5, true, true),
            release(a, 6),
            grant(b, 10, 11, 3, 1011),
            write(b, 1, 3, 12, true, false),
            release(b, 13),
            grant(c2, 20, 21, 4, 1021),
        ];
        let sink = vec![rec(a, 1, 10, 5, true, true), rec(b, 1, 3, 12, true, false)];
        let c = check(&events, &sink, &[], 0, 100 * MS);
        assert_eq!(c.token_regressions, 2, "b and c2 both got tokens below a's");
        assert_eq!(c.lost_rounds, 1);
        let at = |kind| {
            c.incidents
                .iter()
                .filter(|i| i.kind == kind)
                .map(|i| i.at)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            at(IncidentKind::Regression),
            [11 * MS, 21 * MS],
            "by the grants' returns"
        );
        assert_eq!(
            at(IncidentKind::LostRound),
            [12 * MS],
            "by the sink's receipt"
        );
    }

    /// A worker paused between the acquire's return and its log line logs
    /// the grant after its validity ended and after the next holder's grant:
    /// no overlap of validity (it never held a lease it could trust), and a
    /// write it built while valid but sent after a pause is no lost round.
    #[test]
    fn a_grant_logged_after_its_validity_is_no_overlap() {
        let (a, b) = (id(1, 1), id(2, 1));
        let events = vec![
            grant(b, 0, 1, 11, 1001),
            grant(a, 0, 300, 10, 200),
            release(a, 301),
            release(b, 400),
        ];
        let late = SinkRecord {
            id: a,
            seq: 1,
            token: 10,
            valid_at_send: true,
            valid_until: 200 * MS,
            recv: 350 * MS,
            accepted: false,
            read: false,
        };
        let c = check(&events, &[late], &[], 0, 500 * MS);
        assert_eq!(c.validity_overlaps, 0);
        assert_eq!(c.lost_rounds, 0);
    }

    /// A holder killed by a crash fault holds nothing after its death, even
    /// when the store frees its key before the TTL (ZooKeeper sessions).
    #[test]
    fn a_killed_holder_is_no_overlap() {
        let (a, b) = (id(1, 1), id(2, 1));
        let events = vec![grant(a, 0, 1, 10, 1000), grant(b, 50, 60, 11, 1060)];
        let crash = Fault {
            kind: "crash".into(),
            victim: Some(1),
            start: 20 * MS,
            end: 20 * MS,
            note: String::new(),
            wall_step_ns: None,
        };
        assert_eq!(check(&events, &[], &[], 0, 2000 * MS).validity_overlaps, 1);
        assert_eq!(
            check(&events, &[], &[crash], 0, 2000 * MS).validity_overlaps,
            0
        );
    }

    /// Two grants overlapping while both valid (a store that granted early).
    #[test]
    fn overlapping_validity_is_counted() {
        let (a, b) = (id(1, 1), id(2, 1));
        let events = vec![
            grant(a, 0, 1, 10, 100),
            grant(b, 40, 50, 11, 150),
            release(a, 90),
            release(b, 140),
        ];
        let c = check(&events, &[], &[], 0, 200 * MS);
        assert_eq!(c.validity_overlaps, 1);
        assert!((c.validity_overlap_ms - 40.0).abs() < 1e-9);
        assert_eq!(c.unsafe_windows, 1);
        // Dated by the later grant's return, for the verdict's windows.
        assert_eq!(
            c.incidents,
            [Incident {
                kind: IncidentKind::Overlap,
                at: 50 * MS
            }]
        );
    }

    /// An overlap is put down to the wall clock only when it stepped forward,
    /// between the two grants, by at least the overlap.
    #[test]
    fn an_overlap_inside_a_forward_wall_clock_step_is_told_apart() {
        let (a, b) = (id(1, 1), id(2, 1));
        let events = vec![
            grant(a, 0, 1, 10, 100),
            grant(b, 40, 50, 11, 150),
            release(a, 90),
            release(b, 140),
        ];
        let step = |at_ms: u64, step_ms: i64| Fault {
            kind: crate::clock::WALL_CLOCK_STEP.into(),
            victim: None,
            start: at_ms * MS,
            end: at_ms * MS + MS,
            note: format!("{step_ms:+} ms"),
            wall_step_ns: Some(step_ms * 1_000_000),
        };
        let explained = |faults: &[Fault]| {
            let c = check(&events, &[], faults, 0, 200 * MS);
            assert_eq!(c.validity_overlaps, 1);
            c.validity_overlaps_in_wall_steps
        };
        assert_eq!(explained(&[]), 0);
        assert_eq!(explained(&[step(20, 45)]), 1);
        assert_eq!(explained(&[step(20, 30)]), 0, "smaller than the overlap");
        assert_eq!(explained(&[step(20, -45)]), 0, "backwards");
        assert_eq!(explained(&[step(60, 45)]), 0, "after the later grant");
        assert_eq!(
            explained(&[step(10, 25), step(30, 20)]),
            1,
            "two steps add up"
        );
    }

    /// The same token accepted from two grants (a failover repeating one).
    #[test]
    fn a_token_accepted_from_two_grants_is_a_duplicate() {
        let (a, b) = (id(1, 1), id(2, 1));
        let events = vec![
            grant(a, 0, 1, 7, 100),
            write(a, 1, 7, 5, true, true),
            release(a, 6),
            grant(b, 10, 11, 7, 111),
            write(b, 1, 7, 12, true, true),
            release(b, 13),
        ];
        let sink = vec![rec(a, 1, 7, 5, true, true), rec(b, 1, 7, 12, true, true)];
        let c = check(&events, &sink, &[], 0, 100 * MS);
        assert_eq!(c.duplicated_rounds, 1);
        assert_eq!(c.token_regressions, 1);
    }

    /// A write the worker saw accepted but the sink never recorded.
    #[test]
    fn an_acknowledged_write_missing_from_the_sink_is_a_mismatch() {
        let a = id(1, 1);
        let events = vec![grant(a, 0, 1, 7, 100), write(a, 1, 7, 5, true, true)];
        let c = check(&events, &[], &[], 0, 100 * MS);
        assert_eq!(c.ack_mismatches, 1);
    }

    /// Recovery is measured to the next grant to another worker; a fault
    /// nobody recovered from is counted.
    #[test]
    fn recovery_is_measured_from_the_fault() {
        let (a, b) = (id(1, 1), id(2, 1));
        let events = vec![grant(a, 0, 1, 7, 100), grant(b, 90, 150, 8, 1150)];
        let faults = vec![
            Fault {
                kind: "crash".into(),
                victim: Some(1),
                start: 20 * MS,
                end: 20 * MS,
                note: String::new(),
                wall_step_ns: None,
            },
            Fault {
                kind: "crash".into(),
                victim: Some(2),
                start: 160 * MS,
                end: 160 * MS,
                note: String::new(),
                wall_step_ns: None,
            },
        ];
        let c = check(&events, &[], &faults, 0, 200 * MS);
        assert_eq!(c.recovery_ms, vec![130.0]);
        assert_eq!(c.unrecovered, 1);
    }

    /// `g` granted as `role` (read/write leases, C19).
    fn as_role(mut e: Event, r: Role) -> Event {
        if let Event::Grant { role, .. } = &mut e {
            *role = r;
        }
        e
    }

    /// C19: readers share the key; a writer overlapping a reader, a writer
    /// token not above an earlier reader's, a reader whose epoch misses an
    /// earlier writer, and a writer from before a reader written after it
    /// read are each counted.
    #[test]
    fn readers_share_and_the_token_rule_is_judged_over_conflicting_grants() {
        let (r1, r2, w, r3) = (id(1, 1), id(2, 1), id(3, 1), id(4, 1));
        let reader = |epoch| Role::Reader { epoch };
        let events = vec![
            as_role(grant(r1, 0, 1, 11, 500), reader(10)),
            as_role(grant(r2, 2, 3, 12, 500), reader(10)),
            // Granted while both readers are valid, with a token below r2's.
            as_role(grant(w, 4, 100, 12, 1000), Role::Writer),
            // Granted after w without w's epoch.
            as_role(grant(r3, 1100, 1101, 13, 2000), reader(10)),
        ];
        let c = check(&events, &[], &[], 0, 2000 * MS);
        assert_eq!((c.grants, c.reader_grants), (4, 3));
        // r1 and r2 overlap (readers: fine); r2 then w (counted once, as
        // r2's successor, and r1's).
        assert_eq!(c.validity_overlaps, 2);
        assert_eq!(c.token_regressions, 2, "w's token 12 and r3's epoch 10");

        // The sink: r1 reads, then w (granted before r1's read, token above)
        // writes: fine; then r2, from before w, reads after w wrote: stale.
        let (ok_w, ok_r) = (id(5, 1), id(6, 1));
        let events = vec![
            as_role(grant(ok_r, 0, 1, 11, 50), reader(10)),
            as_role(grant(ok_w, 2, 60, 12, 1060), Role::Writer),
        ];
        let mut read = rec(ok_r, 1, 11, 10, true, true);
        read.read = true;
        let mut late_read = rec(ok_r, 2, 11, 80, false, true);
        late_read.read = true;
        let sink = vec![read, rec(ok_w, 1, 12, 70, true, true), late_read];
        let c = check(&events, &sink, &[], 0, 100 * MS);
        assert_eq!((c.validity_overlaps, c.token_regressions), (0, 0));
        assert_eq!(
            c.stale_admitted, 1,
            "a reader from before the writer read after it wrote"
        );
    }
}
