//! Minimal HTTP/1.0 GET against nats-server's monitor port (`/healthz`, `/jsz`, `/varz`).
//!
//! The monitor speaks plain HTTP and closes the connection after each answer, so a few lines
//! over a `TcpStream` do, without pulling an HTTP client into the test crate.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// GETs `path_and_query` from `addr` and returns the status code and body.
pub(crate) async fn get(addr: SocketAddr, path_and_query: &str) -> anyhow::Result<(u16, String)> {
    tokio::time::timeout(REQUEST_TIMEOUT, get_inner(addr, path_and_query))
        .await
        .with_context(|| format!("GET http://{addr}{path_and_query} timed out"))?
}

async fn get_inner(addr: SocketAddr, path_and_query: &str) -> anyhow::Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr).await.with_context(|| format!("connect to monitor {addr}"))?;
    let request = format!("GET {path_and_query} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.context("send monitor request")?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.context("read monitor response")?;
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response.split_once("\r\n\r\n").context("monitor response has no header end")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse::<u16>().ok())
        .with_context(|| format!("bad monitor status line: {head:?}"))?;
    Ok((status, body.to_owned()))
}

/// GETs `path_and_query` and parses a 200 answer as JSON.
pub(crate) async fn get_json(addr: SocketAddr, path_and_query: &str) -> anyhow::Result<serde_json::Value> {
    let (status, body) = get(addr, path_and_query).await?;
    if status != 200 {
        bail!("GET http://{addr}{path_and_query}: HTTP {status}: {body}");
    }
    serde_json::from_str(&body)
        .with_context(|| format!("GET http://{addr}{path_and_query}: not JSON: {body}"))
}
