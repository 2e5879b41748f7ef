//! End-to-end no-op runs: N dispatches (the scheduler's body and headers) consumed by 1, 2, 4
//! in-process worker replicas with a no-op handler, against raw publish + pull + ack of the
//! same count in the same run.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_nats::jetstream::{self, message::PublishMessage};
use jetsched_shared::names::{self, Names};
use jetsched_shared::spec::TaskSpec;
use jetsched_shared::topology::{self, TopologyArgs};
use jetsched_shared::wire::{Dispatch, Trigger, scheduled_execution_id};
use jetsched_tests::NatsServer;
use jetsched_worker::{Config, Handlers, Outcome, RunContext, build};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::raw::pull_ack;
use crate::system::raw_publish_with_ids;

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Args {
    /// Runs per measurement.
    #[arg(long, default_value_t = 20_000)]
    pub(crate) runs: usize,
    /// Worker replica counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub(crate) workers: Vec<usize>,
    /// Concurrency of each worker replica.
    #[arg(long, default_value_t = 64)]
    pub(crate) concurrency: usize,
}

const WINDOW: usize = 256;

pub(crate) async fn run(args: Args) -> anyhow::Result<serde_json::Value> {
    let mut rows = Vec::new();
    // Raw: publish (with ids) then pull + ack, the same count, on a server of its own.
    let raw_rate = {
        let server = NatsServer::start().await;
        let js = jetstream::new(server.client().await);
        let names = Names::default();
        topology::ensure(&js, &names, &TopologyArgs::default()).await?;
        let (publish, pull) = tokio::join!(
            raw_publish_with_ids(&js, &names, args.runs, WINDOW, "r"),
            pull_ack(&js, &names, args.runs)
        );
        let elapsed = publish?.max(pull?);
        args.runs as f64 / elapsed.as_secs_f64()
    };
    eprintln!("e2e: raw publish + pull + ack: {raw_rate:.0} msg/s");
    for &n in &args.workers {
        let rate = workers(&args, n).await?;
        eprintln!("e2e: {n} worker(s): {rate:.0} runs/s = {:.1}% of raw", 100.0 * rate / raw_rate);
        rows.push(json!({"workers": n, "runs_per_second": rate, "ratio_to_raw": rate / raw_rate}));
    }
    Ok(json!({
        "scenario": "e2e",
        "runs": args.runs,
        "concurrency": args.concurrency,
        "raw_per_second": raw_rate,
        "replicas": rows,
    }))
}

async fn workers(args: &Args, n: usize) -> anyhow::Result<f64> {
    let server = NatsServer::start().await;
    let js = jetstream::new(server.client().await);
    let names = Names::default();
    topology::ensure(&js, &names, &TopologyArgs::default()).await?;
    let shutdown = CancellationToken::new();
    let mut handles = Vec::new();
    for i in 0..n {
        let mut config = Config::for_tests(&server.url(), &format!("bench-{i}"));
        config.concurrency = args.concurrency;
        let handlers = Handlers::new().register("noop", |_run: RunContext| async { Outcome::ok() });
        let worker = build(config, handlers).await?;
        handles.push(tokio::spawn(worker.run(shutdown.clone())));
    }
    let spec = TaskSpec::parse(
        br#"{"id": "noop", "namespace": "bench", "schedule": {"every": "1h"},
        "executor": {"kind": "handler", "name": "noop"}}"#,
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let subject = names.dispatch_subject(&spec.queue, &spec.namespace, &spec.id);
    let started = Instant::now();
    let mut pending = std::collections::VecDeque::new();
    for nominal in 0..args.runs as i64 {
        let dispatch = Dispatch {
            execution_id: scheduled_execution_id("bench", "noop", nominal),
            namespace: spec.namespace.clone(),
            task_id: spec.id.clone(),
            nominal_time: chrono::DateTime::from_timestamp_millis(nominal).context("time")?,
            trigger: Trigger::Schedule,
            term: 1,
            revision: 1,
            spec: spec.clone(),
        };
        let message = PublishMessage::build()
            .payload(serde_json::to_vec(&dispatch)?.into())
            .message_id(names::dispatch_msg_id("bench", "noop", nominal));
        pending.push_back(js.send_publish(subject.clone(), message).await?);
        if pending.len() >= WINDOW
            && let Some(ack) = pending.pop_front()
        {
            ack.await?;
        }
    }
    for ack in pending {
        ack.await?;
    }
    let mut stream = js.get_stream(names.dispatch_stream()).await?;
    let deadline = Instant::now() + Duration::from_secs(120 + args.runs as u64 / 500);
    while stream.info().await?.state.messages > 0 {
        if Instant::now() > deadline {
            bail!("workers did not drain {} runs in time", args.runs);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    shutdown.cancel();
    for handle in handles {
        handle.await??;
    }
    Ok(args.runs as f64 / elapsed.as_secs_f64())
}
