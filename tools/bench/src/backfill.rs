//! Backfill: N nominal times of one task dispatched by the leader's backfill driver, against
//! the burst scenario's N one-shots due in one second in the same run (the rate to reach), with
//! the live schedule's fire lag (interval tasks at a steady rate) measured before the backfill
//! and while it runs. The backfill asks for no bound on its runs in flight (`max_active` 0) so
//! that the dispatch, not the absence of workers, is what is measured. Then the limit, in the
//! same run: as many raw publishes into the dispatch stream (no planning, no run records), as
//! many in flight, on a connection of their own, with the live schedule's lag meanwhile.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chrono::{DurationRound, TimeDelta, Utc};
use jetsched_scheduler::{DEFAULT_BACKFILL_BATCH, DEFAULT_BACKFILL_IN_FLIGHT, DEFAULT_PUBLISH_WINDOW, build};
use jetsched_shared::backfill::progress::{BackfillProgress, BackfillRequest, BackfillState, UNBOUNDED};
use jetsched_shared::backfill::{BackfillOverlap, Reprocess};
use jetsched_shared::names::Names;
use jetsched_shared::schedule::Schedule;
use jetsched_tests::NatsServer;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::args::Tasks;
use crate::scheduler::{self, BurstArgs, Firing};
use crate::system::{Lag, NS, raw_publish_with_ids, read_dispatch_times, spec, wait_leader, write_tasks};

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Args {
    /// Nominal times backfilled: one task firing every second, over a range ending an hour ago.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) times: usize,
    /// The live schedule meanwhile: interval tasks firing at a steady rate.
    #[command(flatten)]
    pub(crate) firing: Firing,
    /// Seconds of the live schedule's lag measured before the backfill starts.
    #[arg(long, default_value_t = 10)]
    pub(crate) seconds: u64,
    /// Nominal times per batch (the scheduler's `--backfill-batch`).
    #[arg(long, default_value_t = DEFAULT_BACKFILL_BATCH)]
    pub(crate) batch: usize,
    /// Publishes awaiting their acknowledgement at once (the scheduler's `--backfill-in-flight`).
    #[arg(long, default_value_t = DEFAULT_BACKFILL_IN_FLIGHT)]
    pub(crate) in_flight: usize,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<serde_json::Value> {
    let n = args.times;
    // The rate to reach, in the same run: N one-shots due in one second.
    let burst = scheduler::burst(BurstArgs { tasks: Tasks::new(n), window: DEFAULT_PUBLISH_WINDOW }).await?;
    let burst_ms = burst["dispatch_all_ms"].as_f64().context("the burst's time")?;
    let burst_rate = n as f64 / (burst_ms / 1000.0);

    let server = NatsServer::start().await;
    let (names, topology, js) = scheduler::start(&server.url()).await?;
    let mut config = scheduler::config(&server.url(), DEFAULT_PUBLISH_WINDOW);
    config.backfill_batch = args.batch;
    config.backfill_in_flight = args.in_flight;
    let service = build(config).await?;
    let shutdown = CancellationToken::new();
    let handle = tokio::spawn(service.run(shutdown.clone()));
    wait_leader(&topology, &names).await?;
    args.firing.write(&topology, "s").await?;
    let task = spec("bf", json!({"every": "1s", "anchor": "2020-01-01T00:00:00Z"}));
    write_tasks(&topology, vec![("bf".to_string(), task.clone())]).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;

    // The live schedule alone.
    let before_from = Utc::now().timestamp_millis();
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    let before_to = Utc::now().timestamp_millis();

    // The backfill: N seconds ending an hour ago.
    let to = (Utc::now() - TimeDelta::hours(1)).duration_trunc(TimeDelta::seconds(1))?;
    let from = to - TimeDelta::seconds(i64::try_from(n)?);
    let schedule = Schedule::parse_value(&json!({"every": "1s", "anchor": "2020-01-01T00:00:00Z"}))
        .map_err(|e| anyhow::anyhow!("bench schedule: {e:?}"))?;
    let request = BackfillRequest {
        from,
        to,
        reprocess: Reprocess::None,
        max_active: UNBOUNDED,
        backwards: false,
        overlap: BackfillOverlap::Allow,
        chain: true,
    };
    let key = Names::backfill_key(NS, "bf", &format!("bench{}", Utc::now().timestamp_millis()));
    let progress =
        BackfillProgress::start(key.clone(), NS.into(), "bf".into(), request, &schedule, Utc::now())
            .map_err(|e| anyhow::anyhow!("bench backfill: {e:?}"))?;
    let during_from = Utc::now().timestamp_millis();
    let started = Instant::now();
    topology
        .backfills
        .create(&key, serde_json::to_vec(&progress)?.into())
        .await
        .context("create the backfill")?;
    let deadline = started + Duration::from_secs(120 + n as u64 / 500);
    let record = loop {
        if let Some(value) = topology.backfills.get(&key).await? {
            let record: BackfillProgress = serde_json::from_slice(&value)?;
            if record.state == BackfillState::Finished {
                break record;
            }
        }
        if Instant::now() > deadline {
            bail!("the backfill did not finish within {:?}", deadline - started);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let elapsed = started.elapsed();
    let during_to = Utc::now().timestamp_millis();
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The limit: the same number of publishes, raw, as many in flight, beside the live schedule.
    let raw_js = async_nats::jetstream::new(server.client().await);
    let raw_from = Utc::now().timestamp_millis();
    let raw_elapsed = raw_publish_with_ids(&raw_js, &names, n, args.in_flight, "bf-raw").await?;
    let raw_to = Utc::now().timestamp_millis();
    tokio::time::sleep(Duration::from_millis(500)).await;
    shutdown.cancel();
    handle.await??;

    let times = read_dispatch_times(&js, &names).await?;
    let (from_ms, to_ms) = (from.timestamp_millis(), to.timestamp_millis());
    let backfilled = times.iter().filter(|(nominal, _)| (from_ms..to_ms).contains(nominal)).count();
    let live = |a: i64, b: i64| {
        Lag::from_micros(
            times
                .iter()
                .filter(|&&(nominal, _)| nominal >= a && nominal < b)
                .map(|&(nominal, stored)| stored - nominal * 1000)
                .collect(),
        )
    };
    let before = live(before_from, before_to);
    let during = live(during_from, during_to);
    let raw = live(raw_from, raw_to);
    let raw_rate = n as f64 / raw_elapsed.as_secs_f64();
    let rate = n as f64 / elapsed.as_secs_f64();
    let ratio = rate / burst_rate;
    eprintln!(
        "backfill: {n} times ({backfilled} dispatched, {} in the record) in {:.0} ms: {rate:.0}/s, \
         {ratio:.2}x the burst's {burst_rate:.0}/s ({burst_ms:.0} ms for {n} one-shots) in this run",
        record.dispatched,
        elapsed.as_secs_f64() * 1000.0
    );
    eprintln!(
        "backfill: live fire lag before p50 {:.2} / p99 {:.2} / max {:.2} ms ({} fires); \
         during p50 {:.2} / p99 {:.2} / max {:.2} ms ({} fires)",
        before.p50_ms,
        before.p99_ms,
        before.max_ms,
        before.samples,
        during.p50_ms,
        during.p99_ms,
        during.max_ms,
        during.samples
    );
    eprintln!(
        "backfill: the limit, {n} raw publishes with {} in flight: {raw_rate:.0}/s, {:.2}x the burst; \
         live fire lag meanwhile p50 {:.2} / p99 {:.2} / max {:.2} ms ({} fires)",
        args.in_flight,
        raw_rate / burst_rate,
        raw.p50_ms,
        raw.p99_ms,
        raw.max_ms,
        raw.samples
    );
    if backfilled != n || record.dispatched != n as u64 {
        bail!("{backfilled} of {n} times dispatched ({} counted)", record.dispatched);
    }
    Ok(json!({
        "scenario": "backfill",
        "times": n,
        "batch": args.batch,
        "in_flight": args.in_flight,
        "backfill_ms": elapsed.as_secs_f64() * 1000.0,
        "per_second": rate,
        "burst_ms": burst_ms,
        "burst_per_second": burst_rate,
        "ratio_to_burst": ratio,
        "live_before": before,
        "live_during": during,
        "raw_per_second": raw_rate,
        "raw_ratio_to_burst": raw_rate / burst_rate,
        "live_during_raw": raw,
        "burst": burst,
    }))
}
