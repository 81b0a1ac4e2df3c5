//! Private standalone ZooKeeper servers.

use std::time::Duration;

use crate::env::zk_server;
use crate::{OwnedProcess, Readiness, TempDir, free_port};

/// A private standalone ZooKeeper on a free port (tickTime 200 ms, so session
/// timeouts from 400 ms to 20 s are allowed), data in a temporary directory.
///
/// # Panics
/// When the configuration cannot be written or the server does not start.
pub fn owned_zk() -> OwnedProcess {
    owned_zk_with_max_session(Duration::from_secs(20))
}

/// Like [`owned_zk`], but the server clamps session timeouts to `max_session`
/// (its `maxSessionTimeout`), as production ensembles often do.
///
/// # Panics
/// When the configuration cannot be written or the server does not start.
pub fn owned_zk_with_max_session(max_session: Duration) -> OwnedProcess {
    let max_ms = max_session.as_millis();
    let port = free_port();
    let dir = TempDir::new("lease-zk");
    let cfg = dir.path().join("zoo.cfg");
    std::fs::write(
        &cfg,
        format!(
            "tickTime=200\ninitLimit=10\nsyncLimit=5\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\n\
             minSessionTimeout=400\nmaxSessionTimeout={max_ms}\nadmin.enableServer=false\n4lw.commands.whitelist=srvr,ruok\n",
            dir.path().join("data").display()
        ),
    )
    .expect("write zoo.cfg");
    OwnedProcess::start(
        "zookeeper",
        zk_server(),
        vec!["start-foreground".into(), cfg.display().to_string()],
        port,
        dir,
        Readiness::Zookeeper,
    )
}
