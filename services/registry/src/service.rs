//! `build` (all fallible I/O: connect, ensure topology, start the micro service and the intake
//! consumer, bind the admin port) and `Registry::run` (only the loops).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::consumer::PullConsumer;
use async_nats::service::ServiceExt;
use futures::StreamExt;
use jetsched_shared::admin::AdminServer;
use jetsched_shared::events::{EventPublisher, EventPump};
use jetsched_shared::names::Names;
use jetsched_shared::service::{Base, Role};
use prometheus::Registry as MetricsRegistry;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::after::{After, Buckets, Graph};
use crate::backfills::BackfillApi;
use crate::breaker_users::BreakerUsers;
use crate::breakers::BreakerApi;
use crate::calendars::CalendarApi;
use crate::cancel::CancelApi;
use crate::codec::Limits;
use crate::concurrency::ConcurrencyApi;
use crate::config::{Config, DEFAULT_ADMIN_ADDR};
use crate::dlq::DlqApi;
use crate::endpoints::{self, Handlers, Requests, Routed};
use crate::history::EventHistory;
use crate::metrics::Metrics;
use crate::queues::QueueApi;
use crate::tasks::TaskStore;
use crate::tasks_feed::{Feed, Index};
use crate::{intake, pause};

/// How long a stopping registry waits for its queued events to be stored.
const EVENTS_GRACE: Duration = Duration::from_secs(10);

/// A started registry, ready to serve.
pub struct Registry {
    client: async_nats::Client,
    service: async_nats::service::Service,
    requests: Requests,
    intake: PullConsumer,
    pauses: PullConsumer,
    after: After,
    tasks: async_nats::jetstream::kv::Store,
    /// The one watch of the tasks bucket and the indexes it feeds.
    feed: (Feed, Vec<Arc<dyn Index>>),
    handlers: Handlers,
    event_pump: EventPump,
    names: Names,
    metrics: Metrics,
    admin: AdminServer,
    concurrency: usize,
}

/// Connects, ensures the topology, registers the API endpoints and the intake consumer and
/// binds the admin listener.
pub async fn build(config: Config) -> anyhow::Result<Registry> {
    let registry = MetricsRegistry::new();
    let metrics = Metrics::register(&registry)?;
    let role = Role::new("registry", DEFAULT_ADMIN_ADDR, &["api", "intake", "pause"]);
    let base = Base::start(role, &config.shared, registry.clone()).await?;
    let topology = base.ensure_topology(&config.shared.topology).await?;
    let Base { names, instance, readiness, admin, client, js } = base;

    let max_payload = client.server_info().max_payload;
    let limits = Limits { max_spec_bytes: config.max_spec_bytes.min(max_payload) };
    let publisher = EventPublisher::with_metrics(js.clone(), names.clone(), &registry)?;
    let (events, event_pump) = publisher.queue(4096, 256);
    // Task-change events carry no de-duplication id: a rare duplicate after a retried publish
    // misleads nobody, and the id costs the server a de-duplication entry per put.
    let event_pump = event_pump.without_dedup_ids();
    // One watch of the tasks bucket feeds the breakers' users and the dependency graph.
    let feed = Feed::default();
    let (users, graph) = (BreakerUsers::new(feed.clone()), Graph::new(feed.clone()));
    let indexes: Vec<Arc<dyn Index>> = vec![Arc::new(users.clone()), Arc::new(graph.clone())];
    let breakers = BreakerApi::new(
        js.clone(),
        topology.breakers.clone(),
        topology.tasks.clone(),
        events.clone(),
        instance.clone(),
        users,
    );
    let queues = QueueApi::new(js.clone(), topology.queues.clone(), names.clone(), events.clone());
    let cancels = CancelApi::new(
        js.clone(),
        names.clone(),
        topology.runs.clone(),
        topology.cancels.clone(),
        events.clone(),
    );
    let backfills = BackfillApi::new(topology.tasks.clone(), topology.backfills.clone(), events.clone());
    let calendars = CalendarApi::new(&js, topology.calendars.clone(), topology.tasks.clone()).await?;
    let tasks_bucket = topology.tasks.clone();
    let after = After::new(
        js.clone(),
        names.clone(),
        Buckets {
            waits: topology.waits.clone(),
            runs: topology.runs.clone(),
            backfills: topology.backfills.clone(),
        },
        events.clone(),
        publisher,
        graph,
    );
    let store = TaskStore::new(
        js.clone(),
        topology.tasks,
        topology.state,
        topology.breakers.clone(),
        topology.calendars.clone(),
        names.clone(),
        events,
        metrics.changes.clone(),
    )
    .await?
    .with_quotas(config.quotas())
    .with_after(after.clone(), config.after_across_namespaces);

    let service = client
        .service_builder()
        .description("jetsched task registry: tasks, dead letters, breakers, queues and limits")
        .metadata([("instance".to_string(), instance.clone())].into())
        .start(names.service_name(), env!("CARGO_PKG_VERSION"))
        .await
        .map_err(|e| {
            anyhow::Error::from_boxed(e).context(format!("start micro service {}", names.service_name()))
        })?;
    let requests = endpoints::add(&service, &names).await?;
    readiness.set("api", true);

    let intake = intake::consumer(&js, &names).await?;
    readiness.set("intake", true);
    let pauses = pause::consumer(&js, &names).await?;
    readiness.set("pause", true);
    tracing::info!(admin = %admin.local_addr(), service = %names.service_name(), instance = %instance, "registry ready");
    Ok(Registry {
        client,
        service,
        requests,
        intake,
        pauses,
        after,
        tasks: tasks_bucket,
        feed: (feed, indexes),
        handlers: Handlers {
            store,
            dlq: DlqApi::new(js.clone(), names.clone()),
            breakers,
            calendars,
            queues,
            concurrency: ConcurrencyApi::new(js.clone(), topology.limits.clone(), topology.rates.clone()),
            runs: topology.runs,
            cancels,
            history: EventHistory::new(js.clone(), names.clone()),
            backfills,
            limits,
        },
        event_pump,
        names,
        metrics,
        admin,
        concurrency: config.concurrency.max(1),
    })
}

impl Registry {
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin.local_addr()
    }

    /// Serves requests and applies submissions until `shutdown`, then finishes in-flight
    /// requests and drains the connection.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let Registry {
            client,
            service,
            mut requests,
            intake,
            pauses,
            after,
            tasks,
            feed: (feed, indexes),
            handlers,
            event_pump,
            names,
            metrics,
            admin,
            concurrency,
        } = self;
        let pump = tokio::spawn(event_pump.run());
        let tracker = TaskTracker::new();
        tracker.spawn(admin.serve(shutdown.clone()));
        let (store, limits) = (handlers.store.clone(), handlers.limits);
        let intake_task = tokio::spawn(intake::run(
            intake,
            store.clone(),
            names.clone(),
            limits,
            metrics.clone(),
            shutdown.clone(),
        ));
        let pause_task = tokio::spawn(pause::run(pauses, store, names, metrics.clone(), shutdown.clone()));
        tracker.spawn(feed.follow(tasks.clone(), indexes, shutdown.clone()));
        tracker.spawn(after.run(tasks, shutdown.clone()));
        let permits = Arc::new(Semaphore::new(concurrency));
        // Shared by every request's task: cloning the stores themselves (each holds its
        // stream's info) cost an allocation per string and made every task kilobytes larger.
        let handlers = Arc::new(handlers);
        loop {
            let event = tokio::select! {
                biased;
                _ = shutdown.cancelled() => Event::Shutdown,
                event = next_request(&permits, &mut requests) => event,
            };
            match event {
                Event::Shutdown => break,
                Event::Ended => anyhow::bail!("API subscriptions ended"),
                Event::Request(permit, routed) => {
                    let (handlers, metrics) = (handlers.clone(), metrics.clone());
                    tracker.spawn(async move {
                        let _permit = permit;
                        endpoints::serve(handlers, &metrics, routed).await;
                    });
                }
            }
        }
        tracker.close();
        tracker.wait().await;
        if let Err(error) = service.stop().await {
            tracing::warn!(%error, "stopping the micro service");
        }
        stopped("intake", intake_task).await;
        stopped("pause", pause_task).await;
        // The last sink goes with the store: the pump then stores what is queued and ends.
        // Bounded: the pump retries an event for up to a minute while JetStream cannot store it.
        drop(handlers);
        match tokio::time::timeout(EVENTS_GRACE, pump).await {
            Err(_) => tracing::warn!("events not all published before shutdown"),
            Ok(Err(error)) => tracing::warn!(%error, "event pump panicked"),
            Ok(Ok(())) => {}
        }
        client.drain().await.context("drain NATS connection")?;
        tracing::info!("registry stopped");
        Ok(())
    }
}

/// What the request loop waits for.
#[allow(
    clippy::large_enum_variant,
    reason = "held for one turn of the loop; boxed, a request would cost an allocation"
)]
enum Event {
    Shutdown,
    /// A request, with the permit to handle it.
    Request(OwnedSemaphorePermit, Routed),
    /// Every endpoint's subscription ended.
    Ended,
}

/// The next request, taken only once a permit to handle it is: at most `--concurrency`
/// requests are in flight.
async fn next_request(permits: &Arc<Semaphore>, requests: &mut Requests) -> Event {
    let permit = permits.clone().acquire_owned().await.expect("semaphore never closed");
    match requests.next().await {
        Some(routed) => Event::Request(permit, routed),
        None => Event::Ended,
    }
}

/// Waits for a consumer's task to end and logs how it did not end well.
async fn stopped(consumer: &str, task: JoinHandle<anyhow::Result<()>>) {
    match task.await {
        Ok(Err(error)) => tracing::warn!(error = format!("{error:#}"), "{consumer} consumer stopped"),
        Err(error) => tracing::warn!(%error, "{consumer} consumer panicked"),
        Ok(Ok(())) => {}
    }
}
