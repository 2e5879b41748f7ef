//! `build` (all fallible I/O: connect, ensure the topology and the consumers, bind the admin
//! port) and `Worker::run` (only the loops, then the graceful shutdown).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::kv::Watch;
use async_nats::jetstream::{self, consumer::PullConsumer};
use jetsched_shared::admin::AdminServer;
use jetsched_shared::events::EventPublisher;
use jetsched_shared::names::Names;
use jetsched_shared::presence;
use jetsched_shared::priority::{PerPriority, Priority};
use jetsched_shared::service::{Base, Role};
use jetsched_shared::wire::DispatchDecoder;
use prometheus::Registry as MetricsRegistry;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::breaker::Breakers;
use crate::cancels::Cancels;
use crate::config::PolicyKind;
use crate::config::{Config, DEFAULT_ADMIN_ADDR};
use crate::delivery::Parts;
use crate::dlq::{DeadLetters, Mover, advisory_consumer};
use crate::executor::nats::{self, NatsExecutor};
use crate::executor::{Executors, Handlers, http::HttpExecutor, shell::ShellExecutor};
use crate::lanes::policy::{Policy, Reserve};
use crate::lanes::{LanePulls, run_lanes};
use crate::limits::Limits;
use crate::message::Answers;
use crate::metrics::Metrics;
use crate::pauses::Pauses;
use crate::queues::QueueStates;
use crate::rate::Rates;
use crate::runs::{Recording, RunStore};

/// A started worker, ready to run.
pub struct Worker {
    client: async_nats::Client,
    /// Presence (`jetsched-worker` micro service): `jetsched status` counts live replicas.
    presence: async_nats::service::Service,
    parts: Arc<Parts>,
    follows: Follows,
    /// Each queue with its lanes' consumers, most urgent first.
    queues: Vec<(String, Vec<(Priority, PullConsumer)>)>,
    advisories: PullConsumer,
    mover: Mover,
    admin: AdminServer,
    pulling: Pulling,
    grace: Duration,
}

/// What the worker follows, loaded in `build` (before any pull) and followed in `run`: the
/// breakers' watch, the queue states and their watch, the tasks watch (paused tasks).
struct Follows {
    breakers: Watch,
    queue_states: Arc<QueueStates>,
    queues: Watch,
    pauses: Watch,
    cancels: Watch,
    limits: Watch,
}

/// How the lanes of every queue pull and share the permits.
struct Pulling {
    concurrency: usize,
    expires: Duration,
    policy: PolicyKind,
    weights: PerPriority,
    reserve: PerPriority,
}

/// The durable pull consumer of `queue`'s `normal` lane, shared by every worker replica
/// (created or converged).
pub async fn ensure_queue_consumer(
    js: &jetstream::Context,
    names: &Names,
    queue: &str,
    config: &Config,
) -> anyhow::Result<PullConsumer> {
    ensure_lane_consumer(js, names, queue, Priority::Normal, config).await
}

/// The durable pull consumer of one lane of `queue`, shared by every worker replica (created
/// or converged).
pub async fn ensure_lane_consumer(
    js: &jetstream::Context,
    names: &Names,
    queue: &str,
    priority: Priority,
    config: &Config,
) -> anyhow::Result<PullConsumer> {
    let name = names.lane_consumer(queue, priority);
    let stream_name = names.dispatch_stream();
    let stream =
        js.get_stream(&stream_name).await.with_context(|| format!("look up stream {stream_name}"))?;
    stream
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some(name.clone()),
            description: Some(format!("jetsched workers of queue {queue}, lane {priority}")),
            filter_subject: names.lane_filter(queue, priority),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: config.ack_wait,
            max_ack_pending: config.max_ack_pending,
            max_deliver: config.max_deliver,
            ..Default::default()
        })
        .await
        .with_context(|| format!("ensure consumer {name} on {stream_name}"))
}

/// Connects, ensures the topology and the consumers, builds the executors (with the embedded
/// `handlers`) and binds the admin listener.
pub async fn build(config: Config, handlers: Handlers) -> anyhow::Result<Worker> {
    config.validate()?;
    let registry = MetricsRegistry::new();
    let metrics = Metrics::register(&registry)?;
    let role = Role::new("worker", DEFAULT_ADMIN_ADDR, &["consumers"]);
    let base = Base::start(role, &config.shared, registry.clone()).await?;
    let topology = base.ensure_topology(&config.shared.topology).await?;
    let Base { names, instance, readiness, admin, client, js } = base;

    let mut queues = Vec::new();
    for queue in &config.queues {
        let mut lanes = Vec::new();
        for priority in Priority::ALL {
            lanes.push((priority, ensure_lane_consumer(&js, &names, queue, priority, &config).await?));
        }
        queues.push((queue.clone(), lanes));
    }
    let advisories = advisory_consumer(&js, &names).await?;
    readiness.set("consumers", true);
    let presence = presence::announce(
        &client,
        &names,
        "worker",
        &instance,
        [
            ("queues".to_string(), config.queues.join(",")),
            ("concurrency".to_string(), config.concurrency.to_string()),
        ],
    )
    .await?;

    let runs = RunStore::batched(topology.runs, client.clone(), &names.runs_bucket()).await?;
    let dlq = DeadLetters::new(js.clone(), names.clone(), metrics.clone(), config.dlq_retry_delay);
    dlq.measure().await;
    let events = EventPublisher::with_metrics(js.clone(), names.clone(), &registry)?
        .with_batches(client.clone())
        .await?;
    let namespace_clients =
        nats::connect_namespaces(&config.shared.nats, &config.executor_credentials(), &instance).await?;
    let executors = Executors {
        http: HttpExecutor::new(
            &config.http_allow(),
            config.output_limit,
            &format!("jetsched-worker/{}", env!("CARGO_PKG_VERSION")),
        )?,
        nats: NatsExecutor::new(
            names.clone(),
            client.clone(),
            namespace_clients,
            config.executor_credentials_required,
            config.output_limit,
        ),
        shell: ShellExecutor::new(config.shell_allow(), config.output_limit),
        handlers,
    };
    let mover = Mover {
        js: js.clone(),
        names: names.clone(),
        runs: runs.clone(),
        dlq: dlq.clone(),
        events: events.clone(),
        metrics: metrics.clone(),
        worker: instance.clone(),
    };
    let breakers = Arc::new(Breakers::new(
        topology.breakers,
        js.clone(),
        names.clone(),
        instance.clone(),
        events.clone(),
        metrics.clone(),
        config.shared_breakers.iter().cloned().collect(),
    ));
    let breakers_watch = breakers.load().await?;
    let rates = Arc::new(Rates::new(topology.rates, events.clone(), instance.clone(), &registry)?);
    let queue_states = Arc::new(QueueStates::new(topology.queues, &config.queues, metrics.clone()));
    let queues_watch = queue_states.load().await?;
    let pauses = Arc::new(Pauses::new(topology.tasks, metrics.errors.with_label_values(&["pause_watch"])));
    let pauses_watch = pauses.load().await?;
    let cancels =
        Arc::new(Cancels::new(topology.cancels, metrics.errors.with_label_values(&["cancel_watch"])));
    let cancels_watch = cancels.load().await?;
    let dispatch_stream = names.dispatch_stream();
    let dispatch =
        js.get_stream(&dispatch_stream).await.with_context(|| format!("look up stream {dispatch_stream}"))?;
    let limits = Arc::new(Limits::new(
        topology.limits,
        dispatch,
        js.clone(),
        instance.clone(),
        config.limit_lease,
        config.concurrency,
        metrics.clone(),
    ));
    let limits_watch = limits.load().await?;
    let answers = Answers::new(config.progress_interval(), metrics.errors.with_label_values(&["ack"]));
    let parts = Arc::new(Parts {
        worker: instance.clone(),
        names,
        js: js.clone(),
        dispatches: DispatchDecoder::default(),
        answers,
        runs,
        recording: Recording { mode: config.run_records, running_after: config.running_after },
        breakers,
        rates,
        pauses,
        cancels,
        limits,
        executors,
        dlq,
        events,
        run_events: config.run_events,
        metrics,
        hard_stop: CancellationToken::new(),
    });
    tracing::info!(
        admin = %admin.local_addr(), instance = %instance, queues = ?config.queues,
        concurrency = config.concurrency, shell = !config.shell_allow().is_empty(),
        executor_credentials = ?config.executor_credentials().keys().collect::<Vec<_>>(),
        handlers = ?parts.executors.handlers.names(), "worker ready"
    );
    let pulling = Pulling {
        concurrency: config.concurrency,
        expires: config.pull_expires,
        policy: config.priority_policy,
        weights: config.weights(),
        reserve: config.reserve(),
    };
    let grace = config.shutdown_grace;
    let follows = Follows {
        breakers: breakers_watch,
        queue_states,
        queues: queues_watch,
        pauses: pauses_watch,
        cancels: cancels_watch,
        limits: limits_watch,
    };
    Ok(Worker { client, presence, parts, follows, queues, advisories, mover, admin, pulling, grace })
}

impl Worker {
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin.local_addr()
    }

    /// Executes runs until `shutdown`; then stops pulling, lets in-flight runs finish within
    /// the grace period, hands the rest back (`Nak`) and drains the connection.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let Worker { client, presence, parts, follows, queues, advisories, mover, admin, pulling, grace } =
            self;
        let Pulling { concurrency, expires, policy, weights, reserve } = pulling;
        let background = TaskTracker::new();
        let admin_stop = CancellationToken::new();
        background.spawn(admin.serve(admin_stop.clone()));
        background.spawn(mover.run(advisories, shutdown.clone()));
        // The breakers follow their bucket and merge counts, and the paused tasks are followed,
        // until the last run has ended.
        let breakers_stop = CancellationToken::new();
        let Follows {
            breakers: breakers_watch,
            queue_states,
            queues: queues_watch,
            pauses: pauses_watch,
            cancels: cancels_watch,
            limits: limits_watch,
        } = follows;
        background.spawn(parts.breakers.clone().follow(breakers_watch, breakers_stop.clone()));
        background.spawn(parts.breakers.clone().merge_loop(breakers_stop.clone()));
        // The lanes read the queue states until they stop pulling, at shutdown.
        background.spawn(queue_states.clone().follow(queues_watch, shutdown.clone()));
        background.spawn(parts.pauses.clone().follow(pauses_watch, breakers_stop.clone()));
        background.spawn(parts.cancels.clone().follow(cancels_watch, breakers_stop.clone()));
        background.spawn(parts.limits.clone().follow(limits_watch, breakers_stop.clone()));
        background.spawn(parts.limits.clone().deadlines(breakers_stop.clone()));

        let runs = TaskTracker::new();
        let permits = Arc::new(Semaphore::new(concurrency));
        let mut loops = tokio::task::JoinSet::new();
        // An idle queue's long poll holds at most its share of the permits.
        let max_batch = (concurrency / queues.len().max(1)).max(1);
        let frees = Arc::new(tokio::sync::watch::Sender::new(0u64));
        for (queue, consumers) in queues {
            let paused = queue_states.flag(&queue);
            let pulls = LanePulls {
                queue,
                consumers,
                max_batch,
                expires,
                policy: Policy::new(policy, weights),
                reserve: Reserve(reserve),
                progress_interval: parts.answers.progress_interval(),
                paused,
            };
            let (permits, frees, runs) = (permits.clone(), frees.clone(), runs.clone());
            loops.spawn(run_lanes(parts.clone(), pulls, permits, frees, runs, shutdown.clone()));
        }
        shutdown.cancelled().await;
        tracing::info!(in_flight = parts.metrics.in_flight.get(), "shutting down: no more pulls");
        while let Some(result) = loops.join_next().await {
            if let Err(error) = result {
                tracing::error!(%error, "a pull loop panicked");
            }
        }
        runs.close();
        if tokio::time::timeout(grace, runs.wait()).await.is_err() {
            tracing::warn!(
                ?grace,
                in_flight = parts.metrics.in_flight.get(),
                "grace period over: handing runs back"
            );
            parts.hard_stop.cancel();
            runs.wait().await;
        }
        parts.limits.settle().await;
        breakers_stop.cancel();
        if let Err(error) = presence.stop().await {
            tracing::warn!(%error, "stopping the presence service");
        }
        admin_stop.cancel();
        background.close();
        background.wait().await;
        parts.executors.nats.drain().await;
        client.drain().await.context("drain NATS connection")?;
        tracing::info!("worker stopped");
        Ok(())
    }
}
