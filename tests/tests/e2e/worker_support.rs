//! What the worker's end-to-end tests share: a worker configuration for tests, worker
//! processes and their presence, a responder that counts executions, the dispatch stream's
//! backlog, and a dispatch published again as a lost de-duplication memory lets through.
//!
//! Dispatch messages are published directly (the scheduler is not involved), with the same
//! body and headers the scheduler sends (`jetsched_tests::fixtures`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt;
use jetsched_shared::dispatch::{self, Origin, SpecBody, Target};
use jetsched_shared::names::Names;
use jetsched_shared::spec::TaskSpec;
use jetsched_shared::wire::{DeadLetter, RunRecord};
use jetsched_tests::fixtures::execution_id_header;
use jetsched_tests::{ChildProcess, NatsServer, eventually};
use jetsched_worker::Config;
use jetsched_worker::runs::AttemptOutcome;

/// How long a test waits for a run to reach a state.
pub(crate) const WAIT: Duration = Duration::from_secs(20);

/// An in-process worker's configuration: test defaults and a short long-poll, so a stop does
/// not wait for it.
pub(crate) fn config(server: &NatsServer, instance: &str) -> Config {
    let mut config = Config::for_tests(&server.url(), instance);
    config.pull_expires = Duration::from_millis(500);
    config
}

/// A worker process (`jetsched-worker`) on `server`, with `extra` flags.
pub(crate) fn worker_process(server: &NatsServer, instance: &str, extra: &[&str]) -> ChildProcess {
    let mut command = ChildProcess::command("jetsched-worker");
    command
        .args(["--nats-url", &server.url(), "--instance-id", instance, "--admin-addr", "127.0.0.1:0"])
        .args(["--pull-expires", "500ms"])
        .args(extra);
    ChildProcess::spawn_command(instance, command)
}

/// Waits until `n` worker replicas answer presence pings (their consumers are bound).
pub(crate) async fn wait_for_workers(client: &async_nats::Client, n: usize) {
    let name = Names::default().presence_service("worker");
    eventually(WAIT, &format!("{n} workers present"), || async {
        let found =
            jetsched_shared::presence::ping(client, &name, Duration::from_millis(200)).await.ok()?.len();
        (found >= n).then_some(())
    })
    .await;
}

/// A responder on `jobs.count` that counts requests per execution id, replying after `delay`.
pub(crate) async fn counting_responder(
    client: &async_nats::Client,
    delay: Duration,
) -> Arc<Mutex<HashMap<String, u32>>> {
    let mut sub = client.subscribe("jobs.count").await.expect("subscribe the responder");
    let client = client.clone();
    let counts: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let seen = counts.clone();
    tokio::spawn(async move {
        while let Some(request) = sub.next().await {
            let id = execution_id_header(&request);
            *seen.lock().unwrap().entry(id).or_default() += 1;
            let Some(reply) = request.reply else { continue };
            let client = client.clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = client.publish(reply, "ok".into()).await;
            });
        }
    });
    counts
}

/// Messages left in the dispatch stream (a work queue: acked and terminated ones are gone).
pub(crate) async fn dispatch_pending(js: &jetstream::Context) -> u64 {
    let mut stream = js.get_stream(Names::default().dispatch_stream()).await.expect("dispatch stream");
    stream.info().await.expect("info").state.messages
}

/// The outcome of every attempt of a run, in order.
pub(crate) fn outcomes(record: &RunRecord) -> Vec<AttemptOutcome> {
    record.attempts.iter().map(|a| a.outcome.expect("attempt closed")).collect()
}

/// The outcome of every attempt a dead letter carries, in order.
pub(crate) fn outcomes_of(entry: &DeadLetter) -> Vec<AttemptOutcome> {
    entry.attempts.iter().map(|a| a.outcome.expect("closed")).collect()
}

/// Publishes the dispatch of `nominal_ms` again under another message id: what a lost
/// de-duplication memory (server restart on a work-queue stream) lets through.
pub(crate) async fn redispatch(js: &jetstream::Context, spec: &TaskSpec, nominal_ms: i64) {
    let origin = Origin::Scheduled { nominal_ms, term: 2, catchup: false };
    let built = dispatch::build(&Names::default(), Target::of(spec, 1), origin, SpecBody::Spec(spec))
        .expect("encode dispatch");
    let message = built.message.message_id(format!("again-{}-{nominal_ms}", spec.id));
    js.send_publish(built.subject, message).await.expect("publish").await.expect("stored");
}
