//! `Restartable`: a private server that the shared outage cases crash, stop
//! and start again.

use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::OwnedProcess;

/// A private server process behind a lock, so an outage factory can crash,
/// stop and start it again through a shared reference.
#[derive(Debug)]
pub struct Restartable {
    process: Mutex<OwnedProcess>,
    port: u16,
}

impl Restartable {
    /// Wraps a started server.
    pub fn new(process: OwnedProcess) -> Self {
        let port = process.port();
        Restartable {
            process: Mutex::new(process),
            port,
        }
    }

    /// The port it listens on (the same after a restart).
    pub fn port(&self) -> u16 {
        self.port
    }

    fn process(&self) -> MutexGuard<'_, OwnedProcess> {
        self.process.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl lease_conformance::Server for Restartable {
    fn crash(&self) {
        self.process().kill();
    }

    fn stop(&self) {
        self.process().stop();
    }

    fn start_again(&self) {
        self.process().start_again();
    }
}
