//! `Proxy`: a loopback TCP proxy a test can cut, heal, blackhole and make
//! lose one reply.

/// A TCP proxy on loopback that a test can cut and heal, to partition one
/// client from a server without touching anyone else's connection.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    cut: std::sync::Arc<tokio::sync::watch::Sender<bool>>,
    hole: tokio::sync::watch::Sender<u64>,
    lose: LoseReply,
    delay: std::sync::Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

/// The request whose answer [`Proxy::lose_reply_to`] is to lose, and
/// whether the proxy is cut once it is lost, shared by the proxy's
/// connections; taken by the first that forwards it.
type LoseReply = std::sync::Arc<std::sync::Mutex<Option<(Vec<u8>, Lose)>>>;

/// What an armed [`LoseReply`] loses.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Lose {
    /// The answer.
    Reply,
    /// The answer, and the proxy is cut as it is lost.
    ReplyThenCut,
    /// The request itself: never forwarded, the connection closed.
    Request,
}

/// Copies `from` to `to` until either ends, each chunk [`Proxy::delay_requests`]
/// after it was read (chunks read meanwhile wait beside it, in order, so
/// requests sent together arrive together). A chunk that contains the armed
/// pattern of `lose` disarms it, is forwarded, and sets `swallow`.
async fn pump_requests(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    lose: &LoseReply,
    swallow: &tokio::sync::Notify,
    then_cut: &std::sync::atomic::AtomicBool,
    delay: &std::sync::atomic::AtomicU64,
) {
    use tokio::io::AsyncWriteExt;
    let (tx, mut rx) =
        tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>, bool)>();
    let read = read_requests(from, lose, then_cut, delay, tx);
    let write = async {
        while let Some((at, chunk, hit)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
            if hit {
                swallow.notify_one();
            }
        }
    };
    // The writer drains what was read before the reader ended.
    tokio::join!(read, write);
}

/// The reading half of [`pump_requests`]: each chunk goes to `tx` with the
/// time it is due and whether it is the one `lose` was armed for.
async fn read_requests(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    lose: &LoseReply,
    then_cut: &std::sync::atomic::AtomicBool,
    delay: &std::sync::atomic::AtomicU64,
    tx: tokio::sync::mpsc::UnboundedSender<(tokio::time::Instant, Vec<u8>, bool)>,
) {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let chunk = &buf[..n];
        let hit = {
            let mut armed = lose
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let hit = armed
                .as_ref()
                .is_some_and(|(p, _)| chunk.windows(p.len().max(1)).any(|w| w == p.as_slice()));
            let mut mode = None;
            if hit && let Some((_, m)) = armed.take() {
                then_cut.store(m == Lose::ReplyThenCut, std::sync::atomic::Ordering::SeqCst);
                mode = Some(m);
            }
            if mode == Some(Lose::Request) {
                // Closes the connection with the request unsent.
                return;
            }
            hit
        };
        let due = tokio::time::Instant::now()
            + std::time::Duration::from_millis(delay.load(std::sync::atomic::Ordering::SeqCst));
        if tx.send((due, chunk.to_vec(), hit)).is_err() {
            return;
        }
    }
}

/// Copies `from` to `to` until either ends, or, once `swallow` is notified,
/// reads the server's next answer, drops it and returns (which closes the
/// connection: the client never sees that answer), cutting the proxy
/// first when `then_cut` says so.
async fn pump_replies(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    swallow: &tokio::sync::Notify,
    then_cut: &std::sync::atomic::AtomicBool,
    cut: &tokio::sync::watch::Sender<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        tokio::select! {
            biased;
            () = swallow.notified() => {
                let _ = from.read(&mut buf).await;
                if then_cut.load(std::sync::atomic::Ordering::SeqCst) {
                    let _ = cut.send(true);
                }
                return;
            }
            r = from.read(&mut buf) => {
                let n = match r {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if to.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

impl Proxy {
    /// Starts forwarding a free loopback port to `127.0.0.1:target`.
    ///
    /// # Panics
    /// Outside a tokio runtime, or if no port can be bound.
    pub async fn start(target: u16) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind proxy port");
        let port = listener.local_addr().expect("proxy address").port();
        let (cut, watch) = tokio::sync::watch::channel(false);
        let cut = std::sync::Arc::new(cut);
        let cutter = std::sync::Arc::clone(&cut);
        let (hole, holes) = tokio::sync::watch::channel(0u64);
        let lose: LoseReply = std::sync::Arc::default();
        let armed = std::sync::Arc::clone(&lose);
        let delay = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let delays = std::sync::Arc::clone(&delay);
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                if *watch.borrow() {
                    drop(inbound); // refused while cut
                    continue;
                }
                let mut watch = watch.clone();
                let mut holes = holes.clone();
                let generation = *holes.borrow();
                let lose = std::sync::Arc::clone(&armed);
                let cutter = std::sync::Arc::clone(&cutter);
                let delay = std::sync::Arc::clone(&delays);
                tokio::spawn(async move {
                    let Ok(outbound) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                    else {
                        return;
                    };
                    let (mut ri, mut wi) = inbound.into_split();
                    let (mut ro, mut wo) = outbound.into_split();
                    let swallow = tokio::sync::Notify::new();
                    let then_cut = std::sync::atomic::AtomicBool::new(false);
                    let holed = tokio::select! {
                        () = pump_requests(&mut ri, &mut wo, &lose, &swallow, &then_cut, &delay) => false,
                        () = pump_replies(&mut ro, &mut wi, &swallow, &then_cut, &cutter) => false,
                        _ = watch.wait_for(|cut| *cut) => false,
                        _ = holes.wait_for(|g| *g > generation) => true,
                    };
                    if holed {
                        // Black-holed: both sockets stay open, nothing moves,
                        // until a cut or the proxy goes away.
                        let _ = watch.wait_for(|cut| *cut).await;
                        drop((ri, wi, ro, wo));
                    }
                });
            }
        });
        Proxy {
            port,
            cut,
            hole,
            lose,
            delay,
            task,
        }
    }

    /// Loses the answer to the next request that contains `pattern` (on
    /// any connection): the request reaches the server, which carries it
    /// out, and the connection is closed as its answer arrives, so the
    /// client sees the connection drop and never learns the outcome.
    pub fn lose_reply_to(&self, pattern: &[u8]) {
        *self
            .lose
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some((pattern.to_vec(), Lose::Reply));
    }

    /// As [`lose_reply_to`](Self::lose_reply_to), and the proxy is
    /// [cut](Self::cut) as the answer is lost: the client cannot retry until
    /// [`heal`](Self::heal), whatever its timing.
    pub fn lose_reply_to_then_cut(&self, pattern: &[u8]) {
        *self
            .lose
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some((pattern.to_vec(), Lose::ReplyThenCut));
    }

    /// Loses the next request that contains `pattern` (on any connection):
    /// it never reaches the server, and its connection is closed, so the
    /// client sees the connection drop and never learns that nothing
    /// happened. [`reply_lost`](Self::reply_lost) tells when it was seen.
    pub fn lose_request_to(&self, pattern: &[u8]) {
        *self
            .lose
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some((pattern.to_vec(), Lose::Request));
    }

    /// Whether the request armed by [`lose_reply_to`](Self::lose_reply_to)
    /// has been seen (and its answer lost or being lost).
    pub fn reply_lost(&self) -> bool {
        self.lose
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_none()
    }

    /// Black-holes every connection open now: both sides stay connected and
    /// nothing they send arrives (no FIN, no RST), as behind a dead network
    /// path. Connections made later pass normally.
    pub fn blackhole_open_connections(&self) {
        self.hole.send_modify(|g| *g += 1);
    }

    /// Delays every request from now on by `d` on its way to the server
    /// (answers pass at once), on every connection: a network with that
    /// one-way latency, which makes each round trip a client waits for
    /// visible in its timing.
    pub fn delay_requests(&self, d: std::time::Duration) {
        self.delay.store(
            u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
            std::sync::atomic::Ordering::SeqCst,
        );
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Drops every connection and refuses new ones until [`heal`](Self::heal).
    pub fn cut(&self) {
        let _ = self.cut.send(true);
    }

    /// Accepts connections again.
    pub fn heal(&self) {
        let _ = self.cut.send(false);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
