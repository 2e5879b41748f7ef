//! Raw JetStream baselines: pipelined publish with message ids into the dispatch stream, then
//! one pull consumer acking every message (no jetsched code involved).

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, AckKind, consumer::AckPolicy, consumer::pull};
use futures::StreamExt;
use jetsched_shared::names::Names;
use jetsched_shared::topology::{self, TopologyArgs};
use jetsched_tests::NatsServer;
use serde_json::json;

use crate::system::raw_publish_with_ids;

#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Args {
    /// Messages published and then pulled and acked.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) messages: usize,
    /// Publishes in flight.
    #[arg(long, default_value_t = 512)]
    pub(crate) window: usize,
}

/// Pulls and acks `n` messages of the `raw` queue; returns the elapsed time.
pub(crate) async fn pull_ack(js: &jetstream::Context, names: &Names, n: usize) -> anyhow::Result<Duration> {
    let stream = js.get_stream(names.dispatch_stream()).await?;
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("bench-raw".to_string()),
            filter_subject: names.dispatch_queue_filter("raw"),
            ack_policy: AckPolicy::Explicit,
            max_ack_pending: 10_000,
            ..Default::default()
        })
        .await?;
    let started = Instant::now();
    let mut messages = consumer.stream().max_messages_per_batch(256).messages().await?;
    let mut acked = 0;
    while acked < n {
        let Some(message) = messages.next().await else { break };
        message
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .ack_with(AckKind::Ack)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        acked += 1;
    }
    let elapsed = started.elapsed();
    drop(messages);
    let _ = stream.delete_consumer("bench-raw").await;
    Ok(elapsed)
}

pub(crate) async fn run(args: Args) -> anyhow::Result<serde_json::Value> {
    let server = NatsServer::start().await;
    let js = jetstream::new(server.client().await);
    let names = Names::default();
    topology::ensure(&js, &names, &TopologyArgs::default()).await?;
    let publish = raw_publish_with_ids(&js, &names, args.messages, args.window, "r").await?;
    let pull = pull_ack(&js, &names, args.messages).await?;
    let publish_rate = args.messages as f64 / publish.as_secs_f64();
    let pull_rate = args.messages as f64 / pull.as_secs_f64();
    eprintln!(
        "raw: pipelined publish with msg ids (window {}): {:.0} msg/s; pull + ack: {:.0} msg/s ({} messages)",
        args.window, publish_rate, pull_rate, args.messages
    );
    Ok(json!({
        "scenario": "raw",
        "messages": args.messages,
        "window": args.window,
        "publish_with_ids_per_second": publish_rate,
        "publish_with_ids_seconds": publish.as_secs_f64(),
        "pull_ack_per_second": pull_rate,
        "pull_ack_seconds": pull.as_secs_f64(),
    }))
}
