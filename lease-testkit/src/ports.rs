//! Free loopback ports for test servers, claimed across test processes.

use std::net::TcpListener;
use std::path::Path;

/// A free TCP port on 127.0.0.1 for a server, claimed for this process.
///
/// Ports come from below the kernel's ephemeral range
/// (`ip_local_port_range`), never from it: a port picked from the ephemeral
/// range is free only until some process's outgoing connection takes it as
/// its local port, and a store member restarted on its port (or a quorum
/// port bound only once its peers are up) then cannot bind it. A claim file
/// per port (in the temporary directory, naming this process) keeps test
/// processes running side by side from picking the same port; claims of
/// processes that are gone are taken over.
///
/// # Panics
/// If no port can be claimed and bound.
pub fn free_port() -> u16 {
    free_port_and(0)
}

/// Like [`free_port`], for a server that also binds `port + gap` (a Redis
/// Cluster node's bus port is its port + 10000): both are claimed, and both
/// lie below the ephemeral range.
///
/// # Panics
/// If no such pair can be claimed and bound.
pub fn free_port_and(gap: u16) -> u16 {
    let (low, high) = server_port_range();
    let high = high.saturating_sub(gap);
    assert!(
        high > low,
        "no room for ports {gap} apart below the ephemeral range"
    );
    let dir = std::env::temp_dir().join("lease-testkit-ports");
    let _ = std::fs::create_dir_all(&dir);
    let span = u32::from(high - low);
    let usable = |port: u16| {
        claim_port(&dir.join(port.to_string())) && TcpListener::bind(("127.0.0.1", port)).is_ok()
    };
    for _ in 0..10_000 {
        let offset = uuid::Uuid::new_v4().as_u128() % u128::from(span);
        let port = low + u16::try_from(offset).unwrap_or(0);
        if usable(port) && (gap == 0 || usable(port + gap)) {
            return port;
        }
    }
    panic!("no free port could be claimed in {low}..{high}");
}

/// The ports servers of the tests use: below the ephemeral range, above the
/// well-known ports (and above the fixed ports of `scripts/stores`).
fn server_port_range() -> (u16, u16) {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    (20000.min(ephemeral_low.saturating_sub(2000)), ephemeral_low)
}

/// Claims a port for this process: creates `file` holding its pid, or takes
/// over the file of a process that is gone.
fn claim_port(file: &Path) -> bool {
    use std::io::Write as _;
    let me = std::process::id();
    for _ in 0..2 {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(file)
        {
            Ok(mut f) => return write!(f, "{me}").is_ok(),
            Err(_) => {
                let owner = std::fs::read_to_string(file)
                    .ok()
                    .and_then(|s| s.trim().parse::<i32>().ok());
                let gone = owner.is_some_and(|pid| {
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
                        == Err(nix::errno::Errno::ESRCH)
                });
                if !gone {
                    return false;
                }
                let _ = std::fs::remove_file(file);
            }
        }
    }
    false
}
