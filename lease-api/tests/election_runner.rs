//! `Election::run`, the callback form, on the in-memory provider: terms
//! alternate between two runners, each start is followed by its stop before
//! the other starts, every runner hears each new leader, and stopping ends
//! the loop with a resignation.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_api::MemoryProvider;
use lease_api::recipes::{Callbacks, Election};
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runners_take_turns_and_hear_every_leader() {
    let provider = Arc::new(MemoryProvider::new());
    let stop = CancellationToken::new();
    let leading = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let starts = Arc::new(AtomicUsize::new(0));
    let heard: Arc<Mutex<Vec<Vec<u64>>>> = Arc::new(Mutex::new(vec![Vec::new(), Vec::new()]));
    let mut runners = Vec::new();
    for me in 0..2 {
        let election =
            Election::new(provider.clone(), "scheduler", Duration::from_secs(5)).unwrap();
        let (leading, most, starts, heard, stop) = (
            Arc::clone(&leading),
            Arc::clone(&most),
            Arc::clone(&starts),
            Arc::clone(&heard),
            stop.clone(),
        );
        let leading_stop = Arc::clone(&leading);
        let callbacks = Callbacks {
            on_started_leading: Box::new(move |_token| {
                let now = leading.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                starts.fetch_add(1, Ordering::SeqCst);
                // Lead briefly, then step down so the other runner leads.
                Box::pin(tokio::time::sleep(Duration::from_millis(50)))
            }),
            on_stopped_leading: Box::new(move || {
                leading_stop.fetch_sub(1, Ordering::SeqCst);
            }),
            on_new_leader: Box::new(move |leader| {
                if let Some(l) = leader {
                    heard.lock().unwrap()[me].push(l.token.get());
                }
            }),
        };
        runners.push(tokio::spawn(
            async move { election.run(stop, callbacks).await },
        ));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while starts.load(Ordering::SeqCst) < 6 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the runners stopped taking turns"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.cancel();
    for r in runners {
        r.await.unwrap().unwrap();
    }
    assert_eq!(most.load(Ordering::SeqCst), 1, "two runners led at once");
    assert_eq!(leading.load(Ordering::SeqCst), 0, "a term was not stopped");
    // Stopped runners resigned: nobody leads.
    let election = Election::new(provider, "scheduler", Duration::from_secs(5)).unwrap();
    assert!(election.leader().await.unwrap().is_none());
    for tokens in heard.lock().unwrap().iter() {
        assert!(tokens.len() >= 3, "a runner heard only {tokens:?}");
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    }
}
