//! `Links`: proxies on the paths between the members of a cluster (a
//! standby to its primary, an agent to its coordination store), so that a
//! test can cut one member off from the others while its clients, who
//! connect to it directly, still reach it: the split-brain case.

use std::time::Duration;

use crate::Proxy;

/// The proxies between a cluster's members, each one owned by the member
/// whose isolation cuts it. They run on a runtime of their own (a thread
/// the cluster owns), so a cluster can be started and dropped from blocking
/// code and from any test's runtime alike.
#[derive(Debug)]
pub(crate) struct Links {
    /// Per member: the proxies cut when it is isolated.
    proxies: Vec<Vec<Proxy>>,
    handle: tokio::runtime::Handle,
    /// Dropped to end the runtime's thread.
    stop: Option<std::sync::mpsc::Sender<()>>,
}

impl Links {
    /// Links for `members` members, none made yet.
    ///
    /// # Panics
    /// When the runtime's thread cannot start.
    pub(crate) fn new(members: usize) -> Self {
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        std::thread::Builder::new()
            .name("cluster-links".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("the links' runtime");
                let _ = handle_tx.send(rt.handle().clone());
                // Runs the proxies until the cluster drops its sender.
                rt.block_on(async move {
                    let _ = tokio::task::spawn_blocking(move || stopped.recv()).await;
                });
            })
            .expect("start the links' thread");
        let handle = handle_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the links' runtime started");
        Links {
            proxies: (0..members).map(|_| Vec::new()).collect(),
            handle,
            stop: Some(stop),
        }
    }

    /// A proxy to `127.0.0.1:target`, cut when `member` is isolated: the
    /// port the others use to reach it (or it uses to reach a shared
    /// service).
    pub(crate) fn through(&mut self, member: usize, target: u16) -> u16 {
        let (tx, rx) = std::sync::mpsc::channel();
        self.handle.spawn(async move {
            let _ = tx.send(Proxy::start(target).await);
        });
        let proxy = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("a link's proxy started");
        let port = proxy.port();
        self.proxies[member].push(proxy);
        port
    }

    /// Cuts every link of `member`: open connections drop, new ones are
    /// refused.
    pub(crate) fn isolate(&self, member: usize) {
        for p in &self.proxies[member] {
            p.cut();
        }
    }

    /// Heals every link of `member`.
    pub(crate) fn rejoin(&self, member: usize) {
        for p in &self.proxies[member] {
            p.heal();
        }
    }
}

impl Drop for Links {
    fn drop(&mut self) {
        // The proxies' tasks end with the runtime; the runtime ends when its
        // thread reads the closed channel.
        self.proxies.clear();
        self.stop.take();
    }
}
