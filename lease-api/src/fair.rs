//! Fair FIFO waiting (C17): waiters served in the order they arrived, each
//! woken by its predecessor only.
//!
//! A plain [`acquire`](crate::acquire) waiter watches the key: every release
//! wakes all of them and they race, so under contention the longest wait has
//! no bound. A fair waiter first takes a [`Ticket`] in the key's queue of
//! waiters (a store-side structure: etcd keys ordered by create revision,
//! ZooKeeper sequential nodes, a Redis sorted set, a PostgreSQL table) and
//! watches only the ticket just ahead of it. The first in line alone watches
//! the key and takes it when it is freed; it then leaves the queue, which
//! wakes its successor. A waiter that dies leaves a ticket that ends with its
//! own TTL (the lease's, bounded by [`MAX_TICKET_TTL`]) or its session, so a
//! crashed waiter holds the line up for seconds, not for a lease's TTL. A
//! waiter paused past its ticket's TTL joins again at the end of the line;
//! a store that is briefly unavailable is retried until the wait runs out,
//! keeping the ticket.
//!
//! Fairness holds among fair waiters: a plain `acquire` or `try_acquire`
//! does not look at the queue and may take a freed key first.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::lease::OwnerId;
use crate::provider::LeaseProvider;
use crate::queue::{MAX_TICKET_TTL, Place, Ticket, WaitQueue};
use crate::watch::MAX_BLIND_WAIT;
use crate::{Lease, LeaseError, LeaseKey, Result};

/// A ticket that leaves the queue when dropped, so an abandoned or timed-out
/// fair acquire never holds the line up for its TTL.
struct Held<P: LeaseProvider + ?Sized + 'static> {
    provider: Arc<P>,
    /// The key of the queue: the lease's, or its read/write queue's.
    key: LeaseKey,
    ticket: Option<Ticket>,
    /// The mark of the next join: kept after a join that failed, whose
    /// ticket the store may have made, so its retry finds that ticket.
    mark: u64,
    /// The last join failed and none succeeded since: the store may hold a
    /// ticket of `mark` that this waiter never heard of.
    join_failed: bool,
}

impl<P: LeaseProvider + ?Sized + 'static> Held<P> {
    fn ticket(&self) -> Result<&Ticket> {
        self.ticket
            .as_ref()
            .ok_or_else(|| LeaseError::protocol("the fair waiter has no ticket"))
    }
}

impl<P: LeaseProvider + ?Sized + 'static> Held<P> {
    /// Leaves the queue in the background, retrying a store that does not
    /// answer for a while (on ZooKeeper a ticket lives as long as the
    /// session, so a leave that failed would hold the line up).
    ///
    /// Without a ticket, but after a join whose answer was lost, it joins
    /// once more with that join's mark (which finds or replaces the ticket
    /// the store may have made) and leaves that: a waiter that gives up
    /// right after a lost answer leaves no ticket nobody refreshes, which
    /// on ZooKeeper would stand in line for the whole session.
    fn leave_now(&mut self) {
        let ticket = self.ticket.take();
        // Only where a retried join finds the lost join's ticket: etcd and
        // ZooKeeper remove it by themselves, and a join there would add one.
        let lost_join = std::mem::take(&mut self.join_failed)
            && self
                .provider
                .wait_queue()
                .is_some_and(|q| q.retried_join_finds_its_ticket());
        if ticket.is_none() && !lost_join {
            return;
        }
        let ticket_ttl = self.provider.capabilities().practical_ttl(MIN_TICKET_TTL);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let provider = Arc::clone(&self.provider);
        let (key, mark) = (self.key.clone(), self.mark);
        runtime.spawn(async move {
            let Some(queue) = provider.wait_queue() else {
                return;
            };
            let mut ticket = ticket;
            let mut pause = Duration::from_millis(100);
            for _ in 0..8 {
                let t = match ticket.take() {
                    Some(t) => t,
                    None => match queue.join(&key, ticket_ttl, mark).await {
                        Ok(t) => t,
                        Err(e) if e.is_transient() => {
                            tracing::debug!(key = %key, error = %e, "could not clear a lost join's ticket yet; retrying");
                            tokio::time::sleep(pause).await;
                            pause = (pause * 2).min(Duration::from_secs(5));
                            continue;
                        }
                        Err(e) => {
                            tracing::warn!(key = %key, error = %e, "could not clear a lost join's ticket; it ends with its TTL or session");
                            return;
                        }
                    },
                };
                ticket = Some(t.clone());
                match queue.leave(&t).await {
                    Ok(()) => return,
                    Err(e) if e.is_transient() => {
                        tracing::debug!(key = %key, error = %e, "could not leave the queue of waiters yet; retrying");
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_secs(5));
                    }
                    Err(e) => {
                        tracing::warn!(key = %key, error = %e, "could not leave the queue of waiters; the ticket ends with its TTL or session");
                        return;
                    }
                }
            }
        });
    }
}

impl<P: LeaseProvider + ?Sized + 'static> Drop for Held<P> {
    fn drop(&mut self) {
        self.leave_now();
    }
}

/// The shortest ticket TTL, so that a join and the next look fit well
/// within it.
const MIN_TICKET_TTL: Duration = Duration::from_millis(500);

/// Joins in a task of its own: if the caller's future is dropped while the
/// join is in flight, the task leaves the ticket it got, so an abandoned
/// join never leaves a ticket nobody refreshes or removes.
async fn join<P>(provider: &Arc<P>, key: &LeaseKey, ttl: Duration, mark: u64) -> Result<Ticket>
where
    P: LeaseProvider + ?Sized + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (p, k) = (Arc::clone(provider), key.clone());
    tokio::spawn(async move {
        let Some(queue) = p.wait_queue() else {
            return;
        };
        let joined = queue.join(&k, ttl, mark).await;
        if let Err(Ok(ticket)) = tx.send(joined) {
            let _ = queue.leave(&ticket).await;
        }
    });
    rx.await
        .map_err(|_| LeaseError::protocol("the join task ended without an answer"))?
}

/// What a fair waiter takes once first in line.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Take {
    /// The key's plain lease.
    Plain,
    /// The key's read/write lease (C19): `None` as a reader, `Some(waiting)`
    /// as the writer.
    ReadWrite(Option<Option<OwnerId>>),
}

/// The fair path of [`acquire`](crate::acquire) (and of the read/write
/// acquires): waits in the key's queue until first, then waits for the key
/// itself.
pub(crate) async fn acquire_fair<P>(
    provider: &Arc<P>,
    key: &LeaseKey,
    ttl: Duration,
    wait: Duration,
    waited: &mut Duration,
    take: Take,
) -> Result<Option<Lease>>
where
    P: LeaseProvider + ?Sized + 'static,
{
    let caps = provider.capabilities();
    caps.grant_ttl(ttl)?;
    let Some(queue) = provider.wait_queue().filter(|_| caps.fair_waiting) else {
        return Err(LeaseError::Config(format!(
            "{} does not offer fair waiting (Capabilities::fair_waiting is false); \
             acquire without AcquireOptions::fair",
            caps.backend
        )));
    };
    let deadline = crate::time::deadline_in(wait);
    // Tickets have a TTL of their own, bounded whatever the lease's: a dead
    // waiter holds the line up for seconds, not for a lease's hour.
    let ticket_ttl = caps.practical_ttl(ttl.clamp(MIN_TICKET_TTL, MAX_TICKET_TTL));
    let refresh_every = (ticket_ttl / 3).max(Duration::from_millis(1));
    // Read/write waiters stand in a queue of their own: one of a plain
    // lease's waiters at the head must not hold them up, nor the reverse.
    let line = match take {
        Take::Plain => key.clone(),
        Take::ReadWrite(_) => key.read_write_queue(),
    };
    let mut held = Held {
        provider: Arc::clone(provider),
        key: line,
        ticket: None,
        mark: Ticket::random_mark(),
        join_failed: false,
    };
    let mut backoff = Duration::from_millis(50);
    loop {
        let step = fair_round(
            provider,
            queue,
            &mut held,
            key,
            (ttl, ticket_ttl, refresh_every, take),
            deadline,
            waited,
        )
        .await;
        match step {
            Ok(Round::Done(lease)) => {
                // Leaving wakes the successor, which then watches the key:
                // the guard does it in the background, so the lease is
                // returned at once and a caller dropped now cannot lose it.
                drop(held);
                return Ok(lease);
            }
            Ok(Round::Again) => backoff = Duration::from_millis(50),
            Err(e) => {
                // A store blip: keep the ticket (it outlives a short outage)
                // and retry until the wait runs out, as a plain waiter does.
                let now = Instant::now();
                if !e.is_transient() || now + backoff >= deadline {
                    return Err(e);
                }
                tracing::debug!(key = %key, error = %e, "store unavailable while waiting in line; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

enum Round {
    /// Acquired, or not within the wait.
    Done(Option<Lease>),
    /// The ticket was lost (expired while this waiter was paused, or gone
    /// while it was first): go round with a new one.
    Again,
}

/// One pass: a ticket (joining if there is none), the wait in line, the wait
/// for the key once first.
async fn fair_round<P>(
    provider: &Arc<P>,
    queue: &dyn WaitQueue,
    held: &mut Held<P>,
    key: &LeaseKey,
    (ttl, ticket_ttl, refresh_every, take): (Duration, Duration, Duration, Take),
    deadline: Instant,
    waited: &mut Duration,
) -> Result<Round>
where
    P: LeaseProvider + ?Sized + 'static,
{
    let round_started = Instant::now();
    if held.ticket.is_none() {
        if Instant::now() >= deadline {
            return Ok(Round::Done(None));
        }
        // On an error the mark stays: the retry finds a ticket the lost
        // answer may have made, instead of queueing behind it.
        held.join_failed = true;
        let line = held.key.clone();
        let ticket = join(provider, &line, ticket_ttl, held.mark).await?;
        held.join_failed = false;
        held.mark = Ticket::random_mark();
        held.ticket = Some(ticket);
    }
    let mut next_refresh = Instant::now() + refresh_every;
    loop {
        let ticket = held.ticket()?.clone();
        let (ahead, remaining) = match queue.place(&ticket).await? {
            Place::First => break,
            Place::Gone => {
                // Our ticket ran out (this process was paused or cut off for
                // a ticket's TTL): join again at the end of the line.
                tracing::debug!(key = %key, "the fair waiter's ticket expired; joining the queue again");
                held.ticket = None;
                return Ok(Round::Again);
            }
            Place::Behind { ahead, remaining } => (ahead, remaining),
        };
        let mut watch = queue.watch_ticket(&ahead).await?;
        let now = Instant::now();
        if now >= deadline {
            *waited += now - round_started;
            // Leaves in the background through the guard.
            held.leave_now();
            return Ok(Round::Done(None));
        }
        // Wake when the ticket ahead leaves, when it would expire, when ours
        // is due a refresh, or at the deadline; never sleep longer than
        // MAX_BLIND_WAIT on one notification.
        let until_expiry = remaining
            .map(|r| r.saturating_add(Duration::from_millis(1)))
            .unwrap_or(MAX_BLIND_WAIT)
            .min(MAX_BLIND_WAIT);
        let until = (now + until_expiry)
            .min(deadline)
            .min(next_refresh.max(now));
        watch.changed(until - now).await;
        if Instant::now() >= next_refresh {
            if !queue.refresh(&ticket, ticket_ttl).await? {
                held.ticket = None;
                return Ok(Round::Again);
            }
            next_refresh = Instant::now() + refresh_every;
        }
    }
    *waited += round_started.elapsed();
    // First in line: wait for the key itself, the only waiter of this queue
    // that does, keeping the ticket alive meanwhile. A ticket that is gone
    // (this process was paused for its TTL) sends the waiter back in line:
    // the next waiter is first by now.
    let remaining_wait = deadline.saturating_duration_since(Instant::now());
    let ticket = held.ticket()?.clone();
    let keep = async {
        loop {
            tokio::time::sleep(refresh_every).await;
            match queue.refresh(&ticket, ticket_ttl).await {
                Ok(true) => {}
                Ok(false) => return,
                Err(e) => {
                    tracing::debug!(key = %key, error = %e, "could not refresh the fair waiter's ticket")
                }
            }
        }
    };
    // A reader first in line enters beside the readers that hold the key and
    // leaves the line at once, so the readers behind it follow; a writer
    // first in line keeps new readers out while it waits (C19).
    let taking = async {
        match take {
            Take::Plain => {
                crate::wait::acquire_waiting(provider, key, ttl, remaining_wait, waited).await
            }
            Take::ReadWrite(writer) => {
                let started = Instant::now();
                let got = crate::rw_wait::wait_rw(provider, key, ttl, remaining_wait, writer).await;
                *waited += started.elapsed();
                got
            }
        }
    };
    tokio::select! {
        r = taking => {
            r.map(Round::Done)
        }
        () = keep => {
            tracing::debug!(key = %key, "the first waiter's ticket expired while it waited for the key; back in line");
            held.ticket = None;
            // A writer's waiting record would keep the reader now first in
            // line out, and with it the whole line, until its TTL.
            if let Take::ReadWrite(Some(Some(id))) = take
                && let Err(e) = provider.withdraw_writer(key, id).await
            {
                tracing::debug!(key = %key, error = %e, "could not withdraw the writer's waiting record; it ends with its TTL");
            }
            Ok(Round::Again)
        }
    }
}
