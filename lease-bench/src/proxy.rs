//! Counts round trips on the wire: a TCP proxy in front of a store that counts
//! "turns", the times the client starts sending after the server last spoke
//! (or for the first time) on any of its connections. A request and its
//! answer are one turn however the client splits its writes; a client that
//! sends twice before reading pays two turns only if the server answered in
//! between, which is exactly a second round trip.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use leases::Result;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::raw::err;

/// One proxy per store address; dropping it stops accepting (open
/// connections end with the benchmark process).
pub struct Proxy {
    pub addr: SocketAddr,
    turns: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Proxy {
    pub async fn start(target: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await.map_err(err)?;
        let addr = listener.local_addr().map_err(err)?;
        let turns = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&turns);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let counted = Arc::clone(&counted);
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(target).await {
                        pump(client, server, counted).await;
                    }
                });
            }
        });
        Ok(Proxy { addr, turns, task })
    }

    pub fn turns(&self) -> u64 {
        self.turns.load(Ordering::SeqCst)
    }
}

async fn pump(client: TcpStream, server: TcpStream, turns: Arc<AtomicU64>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    // True while the client is the last side that sent.
    let client_turn = Arc::new(AtomicBool::new(false));
    let up = {
        let client_turn = Arc::clone(&client_turn);
        async move {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match cr.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                if !client_turn.swap(true, Ordering::SeqCst) {
                    turns.fetch_add(1, Ordering::SeqCst);
                }
                if sw.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            let _ = sw.shutdown().await;
        }
    };
    let down = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match sr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            client_turn.store(false, Ordering::SeqCst);
            if cw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = cw.shutdown().await;
    };
    tokio::join!(up, down);
}

/// The store URL with every `127.0.0.1:<port>` pointed at a proxy, and the
/// proxies.
pub async fn proxied(url: &str) -> Result<(String, Vec<Proxy>)> {
    let mut out = String::new();
    let mut proxies = Vec::new();
    let mut rest = url;
    while let Some(i) = rest.find("127.0.0.1:") {
        let (before, after) = rest.split_at(i + "127.0.0.1:".len());
        out.push_str(before);
        let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
        let port: u16 = digits.parse().map_err(err)?;
        let proxy = Proxy::start(SocketAddr::from(([127, 0, 0, 1], port))).await?;
        out.push_str(&proxy.addr.port().to_string());
        proxies.push(proxy);
        rest = &after[digits.len()..];
    }
    out.push_str(rest);
    Ok((out, proxies))
}

/// Turns on every proxy so far, per store node.
pub fn turns_per_node(proxies: &[Proxy]) -> f64 {
    proxies.iter().map(Proxy::turns).sum::<u64>() as f64 / proxies.len().max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server behind the proxy: each request and its answer is one
    /// turn, however the client split the request into writes.
    #[tokio::test]
    async fn a_turn_is_a_request_and_its_answer() {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = echo.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = echo.accept().await {
                // Answers each 4-byte request whole, as a store answers a
                // command only once it has all of it.
                tokio::spawn(async move {
                    let mut buf = [0u8; 4];
                    while s.read_exact(&mut buf).await.is_ok() {
                        if s.write_all(&buf).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let proxy = Proxy::start(target).await.unwrap();
        let mut c = TcpStream::connect(proxy.addr).await.unwrap();
        let mut buf = [0u8; 8];
        for _ in 0..3 {
            c.write_all(b"ab").await.unwrap();
            c.write_all(b"cd").await.unwrap();
            let mut got = 0;
            while got < 4 {
                got += c.read(&mut buf[got..]).await.unwrap();
            }
        }
        assert_eq!(proxy.turns(), 3);
        let (url, proxies) = proxied(&format!("redis://127.0.0.1:{}/0", target.port()))
            .await
            .unwrap();
        assert_eq!(
            url,
            format!("redis://127.0.0.1:{}/0", proxies[0].addr.port())
        );
    }
}
