//! The concurrency slot's hand-over: `--handovers` runs of a few milliseconds dispatched at once
//! under `{"key": "one", "limit": 1}` to the workers, so every run but the first waits parked;
//! each run's end to the next run's start, counted when the next run starts on another worker
//! (the slot went through the bucket, a parked message published back and a delivery).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::bail;
use async_nats::jetstream;
use jetsched_shared::names::Names;
use jetsched_shared::topology::{self, TopologyArgs};
use jetsched_worker::{Handlers, Outcome, RunContext};
use serde_json::json;

use super::{Args, publish, spec_with};
use crate::system::{Lag, Workers, remove_phase};

/// How long each run holds the slot.
const RUN: Duration = Duration::from_millis(5);

/// One call: the worker it ran on, its start and its end (microseconds since the epoch).
type Call = (usize, i64, i64);

fn micros(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_micros() as i64).unwrap_or_default()
}

pub(super) async fn measure(
    js: &jetstream::Context,
    url: &str,
    args: &Args,
) -> anyhow::Result<serde_json::Value> {
    let prefix = "limhand";
    let names = Names::new(prefix).map_err(|e| anyhow::anyhow!("{e}"))?;
    topology::ensure(js, &names, &TopologyArgs::default()).await?;
    let calls: Arc<Mutex<Vec<Call>>> = Arc::default();
    let index = AtomicUsize::new(0);
    let workers = Workers::start(url, prefix, args.pool.workers, args.pool.concurrency, || {
        let (calls, worker) = (calls.clone(), index.fetch_add(1, Ordering::Relaxed));
        Handlers::new().register("noop", move |_run: RunContext| {
            let calls = calls.clone();
            async move {
                let start = micros(SystemTime::now());
                tokio::time::sleep(RUN).await;
                calls.lock().expect("calls").push((worker, start, micros(SystemTime::now())));
                Outcome::ok()
            }
        })
    })
    .await?;
    let task = spec_with("concurrency", Some(json!({"key": "one", "limit": 1})))?;
    let total = args.handovers;
    publish(js, &names, &task, total).await?;
    let deadline = Instant::now() + Duration::from_secs(120 + total as u64 / 10);
    while calls.lock().expect("calls").len() < total {
        if Instant::now() > deadline {
            bail!("workers did not run {total} runs in time");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    workers.stop().await?;
    remove_phase(js, &names).await;
    let mut calls = calls.lock().expect("calls").clone();
    calls.sort_by_key(|&(_, start, _)| start);
    let overlaps = calls.windows(2).filter(|pair| pair[1].1 < pair[0].2).count();
    let across: Vec<i64> =
        calls.windows(2).filter(|pair| pair[0].0 != pair[1].0).map(|pair| pair[1].1 - pair[0].2).collect();
    let same: Vec<i64> =
        calls.windows(2).filter(|pair| pair[0].0 == pair[1].0).map(|pair| pair[1].1 - pair[0].2).collect();
    let (across, same) = (Lag::from_micros(across), Lag::from_micros(same));
    eprintln!(
        "limits: slot hand-over under limit 1, {total} runs: to another worker p50 {:.1} ms, p99 {:.1} ms, \
         max {:.1} ms ({} hand-overs); same worker p50 {:.1} ms, p99 {:.1} ms ({}); {overlaps} overlapping",
        across.p50_ms, across.p99_ms, across.max_ms, across.samples, same.p50_ms, same.p99_ms, same.samples
    );
    Ok(json!({"runs": total, "to_another_worker": across, "same_worker": same, "overlapping": overlaps}))
}
