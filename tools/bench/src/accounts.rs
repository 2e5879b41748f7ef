//! The cost of the wall between teams: the same requests and runs from a client in the
//! services' account and from one in a team's account, which reaches jetsched through service
//! imports (requests in, answers routed back) and a stream import (live events out), as
//! `deploy/secure/nats.conf` sets it up. Rounds alternate the two on one server, one registry
//! and one worker, so both see the same machine.
//!
//! Phases, each with `clients` concurrent request loops: `get` of a task, `put` updating a
//! task, and a run's path: `trigger`, then the run's `run.succeeded` event on the live subject
//! (the worker runs a no-op handler).

use std::time::Duration;

use async_nats::HeaderMap;
use futures::StreamExt;
use jetsched_shared::names::Names;
use jetsched_tests::{NatsServer, ServerOpts};
use jetsched_worker::{Handlers, Outcome, RunContext};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::args::{Clients, Defaults, Rounds, Runs};
use crate::registry::drive;
use crate::stats::Figures;

const NAMESPACE: &str = "bench";

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Requests per phase and path in each round.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) requests: usize,
    // A run goes from its trigger to its live event, on each path.
    #[command(flatten)]
    pub(crate) runs: Runs<Args>,
    #[command(flatten)]
    pub(crate) clients: Clients<Args>,
    // Each round runs both paths, the order alternating.
    #[command(flatten)]
    pub(crate) rounds: Rounds<Args>,
}

impl Defaults for Args {
    const RUNS: &'static str = "2000";
    const CLIENTS: &'static str = "32";
}

/// Accounts as the secured deployment has them, reduced to one team; connections without
/// credentials land in the services' account.
fn accounts_config() -> String {
    let ns = NAMESPACE;
    format!(
        r#"
no_auth_user: svc
accounts {{
  JETSCHED {{
    jetstream: enabled
    users: [{{ user: svc, password: svc }}]
    exports: [
      {{ service: "jetsched.api.task.*.{ns}", accounts: [TEAM] }}
      {{ service: "jetsched.submit.{ns}.>", accounts: [TEAM] }}
      {{ stream: "jetsched.event.*.*.{ns}.>", accounts: [TEAM] }}
    ]
  }}
  TEAM {{
    users: [{{ user: team, password: team }}]
    imports: [
      {{ service: {{ account: JETSCHED, subject: "jetsched.api.task.*.{ns}" }} }}
      {{ service: {{ account: JETSCHED, subject: "jetsched.submit.{ns}.>" }} }}
      {{ stream: {{ account: JETSCHED, subject: "jetsched.event.*.*.{ns}.>" }} }}
    ]
  }}
}}
"#
    )
}

fn spec(id: &str, generation: usize) -> Value {
    json!({
        "id": id, "namespace": NAMESPACE, "schedule": {"every": "1h"},
        "executor": {"kind": "handler", "name": "noop"},
        "labels": {"generation": generation.to_string()}
    })
}

async fn request(client: &async_nats::Client, subject: String, body: Vec<u8>) -> anyhow::Result<Value> {
    let reply = client.request_with_headers(subject, HeaderMap::new(), body.into()).await?;
    let value: Value = serde_json::from_slice(&reply.payload)?;
    anyhow::ensure!(value.get("error").is_none(), "request failed: {value}");
    Ok(value)
}

/// One phase on one path.
async fn phase(
    label: String,
    client: async_nats::Client,
    names: &Names,
    what: &'static str,
    args: &Args,
    round: usize,
) -> anyhow::Result<Figures> {
    let (samples, elapsed) = match what {
        "get" => {
            let subject = names.task_api_namespaced("get", NAMESPACE);
            drive(args.clients.clients, args.requests, move |i| {
                let (client, subject) = (client.clone(), subject.clone());
                async move {
                    let body = serde_json::to_vec(&json!({"id": format!("t{}", i % 100)}))?;
                    request(&client, subject, body).await.map(drop)
                }
            })
            .await?
        }
        "put" => {
            let subject = names.task_api_namespaced("put", NAMESPACE);
            drive(args.clients.clients, args.requests, move |i| {
                let (client, subject) = (client.clone(), subject.clone());
                async move {
                    let body = serde_json::to_vec(&spec(&format!("t{}", i % 100), round * 1_000_000 + i))?;
                    request(&client, subject, body).await.map(drop)
                }
            })
            .await?
        }
        _ => {
            // A run's path: one subscription per loop on its own task's live events.
            let trigger = names.task_api_namespaced("trigger", NAMESPACE);
            let names = names.clone();
            let loops = args.clients.clients.min(100);
            drive(loops, args.runs.runs, move |i| {
                let (client, trigger, names) = (client.clone(), trigger.clone(), names.clone());
                async move {
                    let task = format!("t{}", i % loops);
                    let mut events =
                        client.subscribe(names.event_subject("run.succeeded", NAMESPACE, &task)).await?;
                    client.flush().await?;
                    let body = serde_json::to_vec(&json!({"id": task}))?;
                    let triggered = request(&client, trigger, body).await?;
                    let execution = triggered["execution_id"].as_str().unwrap_or_default().to_string();
                    loop {
                        let message = tokio::time::timeout(Duration::from_secs(30), events.next())
                            .await?
                            .ok_or_else(|| anyhow::anyhow!("live events ended"))?;
                        let event: Value = serde_json::from_slice(&message.payload)?;
                        if event["execution_id"] == execution.as_str() {
                            return Ok(());
                        }
                    }
                }
            })
            .await?
        }
    };
    Ok(Figures::from_samples(&label, samples, elapsed))
}

pub(crate) async fn run(args: Args) -> anyhow::Result<Value> {
    let server = NatsServer::start_with(ServerOpts::default().extra_config(accounts_config())).await;
    let names = Names::default();
    let services = server.client().await;
    let team = async_nats::ConnectOptions::with_user_and_password("team".into(), "team".into())
        .connect(server.url())
        .await?;

    let shutdown = CancellationToken::new();
    let mut registry_config = jetsched_registry::Config::for_tests(&server.url());
    registry_config.concurrency = 1024;
    let registry = tokio::spawn(jetsched_registry::build(registry_config).await?.run(shutdown.clone()));
    let handlers = Handlers::new().register("noop", |_run: RunContext| async { Outcome::ok() });
    let worker_config = jetsched_worker::Config::for_tests(&server.url(), "bench-accounts");
    let worker = tokio::spawn(jetsched_worker::build(worker_config, handlers).await?.run(shutdown.clone()));
    for i in 0..100 {
        let body = serde_json::to_vec(&spec(&format!("t{i}"), 0))?;
        request(&services, names.task_api_namespaced("put", NAMESPACE), body).await?;
    }

    let mut rows = Vec::new();
    let mut ratios: Vec<(String, Vec<f64>, Vec<f64>)> = Vec::new();
    for what in ["get", "put", "run"] {
        let mut throughput = Vec::new();
        let mut p50 = Vec::new();
        for round in 0..args.rounds.rounds {
            // Alternate which path goes first, so neither always meets a warmer server.
            let order = if round % 2 == 0 { [false, true] } else { [true, false] };
            let mut pair: [Option<Figures>; 2] = [None, None];
            for through_import in order {
                let (label, client) = match through_import {
                    true => (format!("{what}, team account (imports), round {}", round + 1), team.clone()),
                    false => (format!("{what}, services' account, round {}", round + 1), services.clone()),
                };
                let figures = phase(label, client, &names, what, &args, round).await?;
                pair[usize::from(through_import)] = Some(figures.clone());
                rows.push(figures);
            }
            let [Some(same), Some(imported)] = pair else { unreachable!() };
            throughput.push(imported.per_second / same.per_second);
            p50.push(imported.p50_ms / same.p50_ms);
        }
        ratios.push((what.to_string(), throughput, p50));
    }
    shutdown.cancel();
    registry.await??;
    worker.await??;

    Figures::print_table(&rows);
    let median = |values: &[f64]| {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        sorted[sorted.len() / 2]
    };
    let mut summary = Vec::new();
    for (what, throughput, p50) in &ratios {
        eprintln!(
            "{what}: through the team's imports / in the services' account: throughput {:.3} (rounds {:?}), p50 latency {:.3} (rounds {:?})",
            median(throughput),
            throughput.iter().map(|r| format!("{r:.3}")).collect::<Vec<_>>(),
            median(p50),
            p50.iter().map(|r| format!("{r:.3}")).collect::<Vec<_>>(),
        );
        summary.push(json!({"phase": what, "throughput_ratio": median(throughput), "p50_ratio": median(p50),
                            "throughput_ratios": throughput, "p50_ratios": p50}));
    }
    Ok(json!({
        "scenario": "accounts",
        "clients": args.clients.clients,
        "rounds": args.rounds.rounds,
        "phases": rows,
        "ratios": summary,
    }))
}
