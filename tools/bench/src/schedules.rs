//! The server's own message schedules (ADR-51) as the baseline of a burst: N messages, each
//! scheduled with `Nats-Schedule: @at <due second>` and `Nats-Schedule-Target`, published ahead
//! on a stream that allows message schedules, as a NATS user would; the server generates each
//! message's copy on its target subject at the due second. Measured: when each copy is stored.

use std::future::IntoFuture;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_nats::HeaderMap;
use async_nats::jetstream::context::PublishError;
use async_nats::jetstream::publish::PublishAck;
use async_nats::jetstream::{self, consumer, stream};
use bytes::Bytes;
use chrono::{DateTime, SecondsFormat, Utc};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use jetsched_shared::wire::{HDR_SCHEDULE, HDR_SCHEDULE_TARGET};
use jetsched_tests::NatsServer;

use crate::system::{Lag, cpu_seconds};

/// CPU seconds used by this process (the client, with an in-process scheduler) and by a
/// nats-server over one phase.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub(crate) struct Cpu {
    pub(crate) client_s: f64,
    pub(crate) server_s: f64,
}

/// Measures [`Cpu`] from its creation to [`CpuMeter::stop`].
pub(crate) struct CpuMeter {
    server: Option<String>,
    start: Cpu,
}

impl CpuMeter {
    pub(crate) fn start(server: &NatsServer) -> CpuMeter {
        let server = server.pid().map(|pid| pid.to_string());
        let start = read_cpu(server.as_deref());
        CpuMeter { server, start }
    }

    pub(crate) fn stop(&self) -> Cpu {
        let now = read_cpu(self.server.as_deref());
        Cpu { client_s: now.client_s - self.start.client_s, server_s: now.server_s - self.start.server_s }
    }
}

fn read_cpu(server: Option<&str>) -> Cpu {
    Cpu {
        client_s: cpu_seconds("self").unwrap_or(0.0),
        server_s: server.and_then(cpu_seconds).unwrap_or(0.0),
    }
}

/// Sleeps until shortly before `due` (so a phase's CPU is measured from its due second).
pub(crate) async fn sleep_until_before(due: DateTime<Utc>) {
    let ahead = (due - Utc::now()).num_milliseconds() - 50;
    if ahead > 0 {
        tokio::time::sleep(Duration::from_millis(ahead as u64)).await;
    }
}

/// The stream of the baseline: schedules on `bench.schedule.<i>` (one subject per schedule:
/// the server keeps one schedule per subject), their copies on `bench.target.<i>`.
const STREAM: &str = "BENCH_SCHEDULES";
const SCHEDULE_PREFIX: &str = "bench.schedule";
const TARGET_PREFIX: &str = "bench.target";

/// What the server's schedules did with one burst.
pub(crate) struct ServerBurst {
    /// Lag of each generated copy's stored time from the due second.
    pub(crate) lag: Lag,
    /// Time to publish the N schedules (before the due second).
    pub(crate) publish: Duration,
    /// CPU used from the due second until every copy was stored.
    pub(crate) cpu: Cpu,
}

/// The due second of a burst of `n` starting now: far enough ahead to write `n` tasks or
/// schedules first (the same for jetsched and the baseline).
pub(crate) fn due_second(n: usize) -> anyhow::Result<DateTime<Utc>> {
    let due_ms = (Utc::now().timestamp_millis() / 1000 + 3 + (n / 10_000) as i64) * 1000;
    DateTime::from_timestamp_millis(due_ms).context("due time")
}

/// On a server of its own: `n` messages of `body_len` bytes scheduled for one due second
/// (published `window` in flight), then the lag of every copy the server generates.
pub(crate) async fn server_burst(n: usize, window: usize, body_len: usize) -> anyhow::Result<ServerBurst> {
    let server = NatsServer::start().await;
    let js = jetstream::new(server.client().await);
    let stream = js
        .create_stream(stream::Config {
            name: STREAM.to_string(),
            subjects: vec![format!("{SCHEDULE_PREFIX}.>"), format!("{TARGET_PREFIX}.>")],
            storage: stream::StorageType::File,
            allow_message_schedules: true,
            allow_rollup: true,
            ..Default::default()
        })
        .await
        .context("create the schedules stream")?;
    let due = due_second(n)?;
    let at = format!("@at {}", due.to_rfc3339_opts(SecondsFormat::Secs, true));
    let body = Bytes::from(vec![b'x'; body_len]);
    let started = Instant::now();
    let mut pending: FuturesUnordered<futures::future::BoxFuture<'static, Result<PublishAck, PublishError>>> =
        FuturesUnordered::new();
    for i in 0..n {
        while pending.len() >= window {
            if let Some(result) = pending.next().await {
                let _: PublishAck = result.context("schedule stored")?;
            }
        }
        let mut headers = HeaderMap::new();
        headers.insert(HDR_SCHEDULE, at.as_str());
        headers.insert(HDR_SCHEDULE_TARGET, format!("{TARGET_PREFIX}.{i}").as_str());
        let ack = js
            .send_publish(
                format!("{SCHEDULE_PREFIX}.{i}"),
                jetstream::message::PublishMessage::build().headers(headers).payload(body.clone()),
            )
            .await
            .context("publish a schedule")?;
        pending.push(Box::pin(ack.into_future()));
    }
    while let Some(result) = pending.next().await {
        result.context("schedule stored")?;
    }
    let publish = started.elapsed();
    if Utc::now() > due - chrono::Duration::milliseconds(500) {
        bail!(
            "publishing {n} schedules took {publish:?}: past the due second; the machine is too slow for this size"
        );
    }
    sleep_until_before(due).await;
    let meter = CpuMeter::start(&server);
    // Every generated copy takes the next sequence after the n schedules: done at 2n.
    let deadline = Instant::now() + Duration::from_secs(120 + n as u64 / 1000);
    loop {
        let last = stream.get_info().await.context("schedules stream info")?.state.last_sequence;
        if last >= 2 * n as u64 {
            break;
        }
        if Instant::now() > deadline {
            bail!("the server generated only {} of {n} scheduled messages", last.saturating_sub(n as u64));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cpu = meter.stop();
    let stored = stored_times(&stream, n).await?;
    let due_us = due.timestamp_micros();
    Ok(ServerBurst { lag: Lag::from_micros(stored.iter().map(|&t| t - due_us).collect()), publish, cpu })
}

/// Stored-at times (Unix µs) of the `n` generated copies on the target subjects.
async fn stored_times(stream: &stream::Stream, n: usize) -> anyhow::Result<Vec<i64>> {
    let reader = stream
        .create_consumer(consumer::pull::OrderedConfig {
            filter_subject: format!("{TARGET_PREFIX}.>"),
            ..Default::default()
        })
        .await
        .context("reader of the generated copies")?;
    let mut messages = reader.messages().await.context("read the generated copies")?;
    let mut times = Vec::with_capacity(n);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while times.len() < n {
        let message = tokio::time::timeout_at(deadline, messages.next())
            .await
            .with_context(|| format!("read only {} of {n} generated copies", times.len()))?
            .context("the reader ended")?
            .map_err(|e| anyhow::anyhow!("read a generated copy: {e}"))?;
        let info = message.info().map_err(|e| anyhow::anyhow!("{e}"))?;
        times.push((info.published.unix_timestamp_nanos() / 1000) as i64);
    }
    Ok(times)
}
