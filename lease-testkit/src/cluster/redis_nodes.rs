//! `RedisNodes`: N independent Redis nodes, Redlock's topology.

use super::members::member_dir;
use super::topology::Topology;
use crate::OwnedProcess;

/// N independent Redis nodes (Redlock's topology), each with AOF and
/// `appendfsync always`, so a restarted node keeps its counters.
#[derive(Debug)]
pub struct RedisNodes {
    members: Vec<OwnedProcess>,
}

impl RedisNodes {
    /// Starts `n` durable nodes.
    ///
    /// # Panics
    /// When a node cannot start.
    pub fn start(n: usize) -> Self {
        RedisNodes {
            members: (0..n)
                .map(|_| crate::redis::redis_in(member_dir("redis-node"), true, &[]))
                .collect(),
        }
    }

    /// The nodes' URLs (`redis://127.0.0.1:PORT`).
    pub fn urls(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("redis://127.0.0.1:{}", m.port()))
            .collect()
    }
}

impl Topology for RedisNodes {
    fn members(&self) -> &[OwnedProcess] {
        &self.members
    }
    fn members_mut(&mut self) -> &mut [OwnedProcess] {
        &mut self.members
    }
    fn leader(&self) -> Option<usize> {
        None
    }
    fn has_leader(&self) -> bool {
        false
    }
    /// A majority of the nodes runs and answers PING.
    fn health(&self) -> Result<(), String> {
        let mut failed = Vec::new();
        let up = self
            .members
            .iter()
            .filter(|m| m.is_running())
            .filter(
                |m| match crate::Readiness::RedisPing.check(m.port(), m.dir.path()) {
                    Ok(()) => true,
                    Err(e) => {
                        failed.push(format!("{}: {e}", m.name()));
                        false
                    }
                },
            )
            .count();
        if up > self.members.len() / 2 {
            Ok(())
        } else {
            Err(format!(
                "{up} of {} nodes answer PING: {}",
                self.members.len(),
                failed.join("; ")
            ))
        }
    }
}
