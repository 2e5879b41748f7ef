//! A TCP proxy the test puts on a link: between a service and its NATS node (to delay the
//! link), or between the test and a node inside a network namespace (to reach it at all).
//! Each side may live in a network namespace of its own; every chunk is forwarded as read,
//! or after a delay of `base ± jitter` that keeps the order of each connection's bytes.

use std::fs::File;
use std::net::{SocketAddr, TcpListener as StdListener, TcpStream as StdStream};
use std::time::Duration;

use anyhow::Context as _;
use nix::sched::{CloneFlags, setns};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How long a connect to the upstream may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Chunks in flight per direction of a delayed connection.
const IN_FLIGHT: usize = 4096;

/// A per-chunk delay: uniformly `base - jitter ..= base + jitter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delay {
    pub base: Duration,
    pub jitter: Duration,
}

/// A running proxy; stops (closing every connection) on Drop.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    delay: watch::Sender<Option<Delay>>,
    stop: CancellationToken,
}

impl Proxy {
    /// Listens on `listen` (port 0 allowed) inside network namespace `listen_ns` (the test's
    /// own when `None`) and forwards each connection to `upstream`, connecting from inside
    /// `upstream_ns`.
    pub async fn start(
        listen_ns: Option<&str>,
        listen: SocketAddr,
        upstream_ns: Option<&str>,
        upstream: SocketAddr,
    ) -> anyhow::Result<Self> {
        let listener = in_netns(listen_ns, move || StdListener::bind(listen))
            .await
            .with_context(|| format!("bind {listen} in {listen_ns:?}"))?;
        listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(listener)?;
        let addr = listener.local_addr()?;
        let (delay, delays) = watch::channel(None);
        let stop = CancellationToken::new();
        let upstream_ns = upstream_ns.map(str::to_owned);
        tokio::spawn(accept(listener, upstream_ns, upstream, delays, stop.clone()));
        Ok(Self { addr, delay, stop })
    }

    /// The address clients connect to (inside the listening namespace).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Delays every chunk from now on (both directions, every connection); `None` restores.
    pub fn set_delay(&self, delay: Option<Delay>) {
        self.delay.send_replace(delay);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Runs `f` on a thread of its own that first joins network namespace `ns` (`None`: stays in
/// the test's), so the sockets `f` creates belong to that namespace for their whole life.
pub(crate) async fn in_netns<T, F>(ns: Option<&str>, f: F) -> anyhow::Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> std::io::Result<T> + Send + 'static,
{
    let ns = ns.map(str::to_owned);
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let result = (|| -> anyhow::Result<T> {
            if let Some(ns) = &ns {
                let file =
                    File::open(format!("/var/run/netns/{ns}")).with_context(|| format!("namespace {ns}"))?;
                setns(&file, CloneFlags::CLONE_NEWNET).with_context(|| format!("join namespace {ns}"))?;
            }
            Ok(f()?)
        })();
        let _ = tx.send(result);
    });
    rx.await.context("namespace thread ended without an answer")?
}

async fn accept(
    listener: TcpListener,
    upstream_ns: Option<String>,
    upstream: SocketAddr,
    delays: watch::Receiver<Option<Delay>>,
    stop: CancellationToken,
) {
    loop {
        let client = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => client,
                Err(_) => continue,
            },
        };
        let ns = upstream_ns.clone();
        let (delays, stop) = (delays.clone(), stop.clone());
        tokio::spawn(async move {
            let connected = in_netns(ns.as_deref(), move || {
                let stream = StdStream::connect_timeout(&upstream, CONNECT_TIMEOUT)?;
                stream.set_nonblocking(true)?;
                stream.set_nodelay(true)?;
                Ok(stream)
            })
            .await;
            // An unreachable upstream closes the client's connection, as a refused one would.
            let Ok(server) = connected.and_then(|s| Ok(TcpStream::from_std(s)?)) else { return };
            let _ = client.set_nodelay(true);
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            let seed = u64::from(upstream.port()) ^ u64::from(std::process::id());
            tokio::select! {
                () = stop.cancelled() => {}
                _ = async {
                    tokio::join!(
                        pipe(client_read, server_write, delays.clone(), seed),
                        pipe(server_read, client_write, delays, seed.rotate_left(17)),
                    )
                } => {}
            }
        });
    }
}

/// Copies one direction of a connection, each chunk at its due time (never before the
/// previous chunk's).
async fn pipe(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    delays: watch::Receiver<Option<Delay>>,
    seed: u64,
) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(IN_FLIGHT);
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    let reader = async move {
        let mut random = Xorshift(seed | 1);
        let mut last = Instant::now();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let now = Instant::now();
            let due = match *delays.borrow() {
                None => now,
                Some(Delay { base, jitter }) => {
                    let spread = u64::try_from(jitter.as_micros() * 2).unwrap_or(u64::MAX).max(1);
                    let offset = Duration::from_micros(random.next() % spread);
                    (now + base + offset).checked_sub(jitter).unwrap_or(now)
                }
            };
            let due = due.max(last);
            last = due;
            if tx.send((due, buf[..n].to_vec())).await.is_err() {
                break;
            }
        }
    };
    tokio::join!(reader, writer);
}

/// A small pseudo-random sequence for delays (no need for quality or secrecy).
struct Xorshift(u64);

impl Xorshift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}
