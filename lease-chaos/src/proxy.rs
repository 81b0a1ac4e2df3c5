//! A TCP proxy per (worker, store node) link, so the nemesis can partition one
//! worker from the store, or one store node from every worker, without
//! touching the store. A partition black-holes the link: connections stay
//! open (no FIN, no RST), new ones are accepted, and nothing moves either way.
//! It heals one of two ways: *resume* delivers what queued up (late packets,
//! the adversarial case for a delayed release or extend) and *reset* drops
//! every connection of the link (the connection died in the partition).

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct LinkState {
    holed: bool,
    resets: u64,
}

/// One proxied link; dropping it stops it and drops its connections.
pub struct Proxy {
    addr: SocketAddr,
    state: watch::Sender<LinkState>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.state.send_modify(|s| s.resets += 1);
    }
}

impl Proxy {
    /// Starts forwarding a loopback port to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (state, watch) = watch::channel(LinkState::default());
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let watch = watch.clone();
                let mut watch = watch;
                tokio::spawn(async move {
                    let resets = watch.borrow().resets;
                    // Accepted but not connected through while black-holed:
                    // the store sees nothing of it until the heal.
                    if !passable(&mut watch, resets).await {
                        return;
                    }
                    let Ok(outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    let (ri, wi) = inbound.into_split();
                    let (ro, wo) = outbound.into_split();
                    tokio::select! {
                        _ = pump(ri, wo, watch.clone(), resets) => {}
                        _ = pump(ro, wi, watch, resets) => {}
                    }
                });
            }
        });
        Ok(Proxy { addr, state, task })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Black-holes the link until [`heal`](Self::heal).
    pub fn hole(&self) {
        self.state.send_modify(|s| s.holed = true);
    }

    /// Ends a black hole; with `reset`, every connection of the link is
    /// dropped instead of resuming.
    pub fn heal(&self, reset: bool) {
        self.state.send_modify(|s| {
            s.holed = false;
            if reset {
                s.resets += 1;
            }
        });
    }
}

/// Waits until the link passes traffic; false when it was reset (or the
/// proxy went away) instead: the connection must end.
async fn passable(watch: &mut watch::Receiver<LinkState>, resets: u64) -> bool {
    watch
        .wait_for(|s| !s.holed || s.resets != resets)
        .await
        .is_ok_and(|s| s.resets == resets)
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut watch: watch::Receiver<LinkState>,
    resets: u64,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if !passable(&mut watch, resets).await {
            return;
        }
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = watch.wait_for(|s| s.resets != resets) => return,
        };
        // Held while the link is black-holed; delivered on a resume.
        if !passable(&mut watch, resets).await {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut c, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut b = [0u8; 64];
                    while let Ok(n) = c.read(&mut b).await {
                        if n == 0 || c.write_all(&b[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(c: &mut TcpStream, within: Duration) -> Option<u8> {
        c.write_all(b"x").await.ok()?;
        let mut b = [0u8; 1];
        match tokio::time::timeout(within, c.read(&mut b)).await {
            Ok(Ok(1)) => Some(b[0]),
            _ => None,
        }
    }

    #[tokio::test]
    async fn a_hole_stops_traffic_and_resume_delivers_it_late() {
        let p = Proxy::start(echo_server().await).await.expect("proxy");
        let mut c = TcpStream::connect(p.addr()).await.expect("connect");
        assert_eq!(round_trip(&mut c, Duration::from_secs(5)).await, Some(b'x'));
        p.hole();
        assert_eq!(round_trip(&mut c, Duration::from_millis(300)).await, None);
        p.heal(false);
        let mut b = [0u8; 1];
        let late = tokio::time::timeout(Duration::from_secs(5), c.read(&mut b)).await;
        assert!(
            matches!(late, Ok(Ok(1))),
            "the held byte arrives after the heal"
        );
    }

    #[tokio::test]
    async fn reset_drops_the_connections_of_the_link() {
        let p = Proxy::start(echo_server().await).await.expect("proxy");
        let mut c = TcpStream::connect(p.addr()).await.expect("connect");
        assert_eq!(round_trip(&mut c, Duration::from_secs(5)).await, Some(b'x'));
        p.hole();
        p.heal(true);
        let mut b = [0u8; 1];
        let r = tokio::time::timeout(Duration::from_secs(5), c.read(&mut b)).await;
        assert!(matches!(r, Ok(Ok(0)) | Ok(Err(_))), "closed, got {r:?}");
        let mut again = TcpStream::connect(p.addr()).await.expect("reconnect");
        assert_eq!(
            round_trip(&mut again, Duration::from_secs(5)).await,
            Some(b'x')
        );
    }
}
