//! Every model, checked exhaustively within a short bound (CI), and each
//! broken variant caught. `lease-model --deep` runs the deep bounds.

use lease_model::fair_queue::{FairQueue, QueueDesign};
use lease_model::{check, refute};

/// Deeper than any path of the short models: a run that reaches it was
/// not exhaustive, which the checks of the designs refuse.
const BOUND: usize = 1_000;

#[test]
fn the_fair_queue_keeps_every_ticket_its_own_and_serves_in_order() {
    let r = check(FairQueue::new(2, QueueDesign::Marked), BOUND);
    println!("{r}");
    assert!(r.holds() && r.exhaustive, "{r}");
}

#[test]
fn a_queue_that_knows_tickets_by_number_alone_hands_one_to_another_waiter() {
    let r = refute(FairQueue::new(2, QueueDesign::NumberOnly), BOUND);
    println!("{r}");
    assert!(r.broke("no ticket is taken by another waiter"), "{r}");
}

#[test]
fn a_look_that_keeps_expired_tickets_leaves_a_waiter_behind_a_dead_one() {
    let r = refute(FairQueue::new(2, QueueDesign::NoExpiryBeforeLook), BOUND);
    println!("{r}");
    assert!(r.broke("no waiter waits on a dead ticket"), "{r}");
}

use lease_model::redlock::{RedlockDesign, RedlockHolders, RedlockTokens};

fn tokens(design: RedlockDesign, volatile: bool) -> RedlockTokens {
    RedlockTokens {
        nodes: 3,
        volatile,
        design,
    }
}

#[test]
fn redlock_on_durable_nodes_issues_increasing_tokens() {
    // Bounded by the number of rounds (counters grow without bound): every
    // sequence of 7 rounds.
    let r = check(tokens(RedlockDesign::Current, false), 7);
    println!("{r}");
    assert!(r.holds() && r.depth == 7, "{r}");
}

#[test]
fn redlock_without_the_raise_round_issues_a_token_not_above_an_earlier_one() {
    let r = refute(tokens(RedlockDesign::NeverRaise, false), 6);
    println!("{r}");
    assert!(r.broke("tokens increase"), "{r}");
}

#[test]
fn redlock_on_durable_nodes_has_one_holder_at_a_time() {
    let r = check(
        RedlockHolders::new(3, 2, 1, RedlockDesign::Current, false),
        60,
    );
    println!("{r}");
    assert!(r.holds() && r.exhaustive, "{r}");
}

#[test]
fn redlock_granting_on_half_the_nodes_lets_two_clients_hold_at_once() {
    let r = refute(
        RedlockHolders::new(3, 2, 1, RedlockDesign::HalfIsEnough, false),
        60,
    );
    println!("{r}");
    assert!(r.broke("at most one holder at a time"), "{r}");
}

/// As declared (`TokenDurability::Volatile`): a node that loses its key
/// and counter lets a second majority form while the first holds, and a
/// later majority count from below an issued token.
#[test]
fn redlock_on_volatile_nodes_breaks_both_as_declared() {
    let r = refute(
        RedlockHolders::new(3, 2, 1, RedlockDesign::Current, true),
        60,
    );
    println!("{r}");
    assert!(r.broke("at most one holder at a time"), "{r}");
    let r = refute(tokens(RedlockDesign::Current, true), 6);
    println!("{r}");
    assert!(r.broke("tokens increase"), "{r}");
}

use lease_model::session::{Session, SessionDesign};

#[test]
fn a_session_never_trusts_a_lease_the_store_no_longer_holds() {
    let r = check(Session::new(SessionDesign::Current), BOUND);
    println!("{r}");
    assert!(r.holds() && r.exhaustive, "{r}");
}

#[test]
fn a_session_counting_validity_from_the_answer_trusts_an_expired_lease() {
    let r = refute(Session::new(SessionDesign::ValidityFromAnswer), BOUND);
    println!("{r}");
    assert!(
        r.broke("a lease believed valid is held by the store"),
        "{r}"
    );
}

#[test]
fn a_session_renewing_a_whole_batch_on_one_answer_trusts_a_failed_lease() {
    let r = refute(Session::new(SessionDesign::BatchAsOne), BOUND);
    println!("{r}");
    assert!(
        r.broke("a lease believed valid is held by the store"),
        "{r}"
    );
}

#[test]
fn a_session_that_holds_fires_back_for_a_round_trusts_an_expired_lease() {
    let r = refute(Session::new(SessionDesign::FireAfterRound), BOUND);
    println!("{r}");
    assert!(
        r.broke("a lease believed valid is held by the store"),
        "{r}"
    );
}

use lease_model::zk_epoch::{ZkDesign, ZkLease};

#[test]
fn zookeeper_multis_keep_one_holder_through_takeovers_and_purges() {
    let r = check(ZkLease::new(2, 2, ZkDesign::Current), BOUND);
    println!("{r}");
    assert!(r.holds() && r.exhaustive, "{r}");
}

#[test]
fn a_zookeeper_fast_path_without_the_marker_renews_a_holder_made_after_a_purge() {
    let r = refute(ZkLease::new(2, 2, ZkDesign::NoMarkerCheck), BOUND);
    println!("{r}");
    assert!(r.broke("an extend renews only its own holder node"), "{r}");
    assert!(r.broke("at most one holder at a time"), "{r}");
}

#[test]
fn a_zookeeper_takeover_without_the_epoch_check_deletes_a_fresh_holder() {
    let r = refute(ZkLease::new(2, 2, ZkDesign::NoEpochCheckOnTakeover), BOUND);
    println!("{r}");
    assert!(r.broke("at most one holder at a time"), "{r}");
}

/// The defect this model found in the provider: a takeover judged before a
/// purge (which restarts epochs and holder versions) matched the holder
/// made after it, at the same epoch and version, and deleted it.
#[test]
fn a_zookeeper_takeover_without_the_judged_owners_marker_deletes_a_holder_made_after_a_purge() {
    let r = refute(ZkLease::new(2, 2, ZkDesign::NoJudgedMarkerCheck), BOUND);
    println!("{r}");
    assert!(r.broke("at most one holder at a time"), "{r}");
    assert!(r.violations[0].1.contains("Purge"), "{r}");
}

use lease_model::read_write::{ReadWrite, RwDesign};

#[test]
fn read_write_leases_keep_writers_alone_and_waiting_writers_ahead_of_new_readers() {
    let r = check(ReadWrite::new(3, RwDesign::Current), BOUND);
    println!("{r}");
    assert!(r.holds() && r.exhaustive, "{r}");
}

#[test]
fn readers_that_ignore_a_waiting_writer_get_past_it() {
    let r = refute(
        ReadWrite::new(2, RwDesign::ReadersIgnoreWaitingWriter),
        BOUND,
    );
    println!("{r}");
    assert!(r.broke("a waiting writer keeps new readers out"), "{r}");
}

#[test]
fn a_writer_that_ignores_readers_writes_beside_them() {
    let r = refute(ReadWrite::new(2, RwDesign::WriterIgnoresReaders), BOUND);
    println!("{r}");
    assert!(r.broke("no reader beside a writer, no two writers"), "{r}");
}

#[test]
fn a_zookeeper_clean_up_without_the_epoch_deletes_the_holder_that_took_over() {
    let r = refute(ZkLease::new(2, 2, ZkDesign::CleanupWithoutEpoch), BOUND);
    println!("{r}");
    assert!(r.broke("at most one holder at a time"), "{r}");
}
