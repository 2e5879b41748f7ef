//! `build` (all fallible I/O: connect, ensure topology, start the micro service and the intake
//! consumer, bind the admin port) and `Registry::run` (only the loops).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use async_nats::jetstream::consumer::PullConsumer;
use async_nats::service::{Request, ServiceExt};
use futures::{StreamExt, stream::SelectAll};
use jetsched_shared::admin::AdminServer;
use jetsched_shared::config::DEFAULT_SUBSCRIPTION_CAPACITY;
use jetsched_shared::events::{EventPublisher, EventPump};
use jetsched_shared::names::Names;
use jetsched_shared::service::{Base, Role};
use prometheus::Registry as MetricsRegistry;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api::{self, Endpoint, Limits};
use crate::config::{Config, DEFAULT_ADMIN_ADDR};
use crate::dlq::{DlqApi, DlqEndpoint};
use crate::intake;
use crate::metrics::Metrics;
use crate::tasks::TaskStore;

/// How long a stopping registry waits for its queued events to be stored.
const EVENTS_GRACE: Duration = Duration::from_secs(10);

type Requests = SelectAll<futures::stream::BoxStream<'static, (Endpoint, Request)>>;

/// A started registry, ready to serve.
pub struct Registry {
    client: async_nats::Client,
    service: async_nats::service::Service,
    requests: Requests,
    intake: PullConsumer,
    store: TaskStore,
    dlq: DlqApi,
    event_pump: EventPump,
    names: Names,
    limits: Limits,
    metrics: Metrics,
    admin: AdminServer,
    concurrency: usize,
}

/// Connects, ensures the topology, registers the API endpoints and the intake consumer and
/// binds the admin listener.
pub async fn build(config: Config) -> anyhow::Result<Registry> {
    let registry = MetricsRegistry::new();
    let metrics = Metrics::register(&registry)?;
    let role = Role {
        name: "registry",
        default_admin: DEFAULT_ADMIN_ADDR,
        checks: &["api", "intake"],
        subscription_capacity: DEFAULT_SUBSCRIPTION_CAPACITY,
    };
    let base = Base::start(role, &config.common, &config.nats, registry.clone()).await?;
    let topology = base.ensure_topology(&config.topology).await?;
    let Base { names, instance, readiness, admin, client, js } = base;

    let max_payload = client.server_info().max_payload;
    let limits = Limits { max_spec_bytes: config.max_spec_bytes.min(max_payload) };
    let (events, event_pump) =
        EventPublisher::with_metrics(js.clone(), names.clone(), &registry)?.queue(4096, 256);
    // Task-change events carry no de-duplication id: a rare duplicate after a retried publish
    // misleads nobody, and the id costs the server a de-duplication entry per put.
    let event_pump = event_pump.without_dedup_ids();
    let store = TaskStore::new(
        js.clone(),
        topology.tasks,
        topology.state,
        names.clone(),
        events,
        metrics.changes.clone(),
    )
    .await?;

    let service = client
        .service_builder()
        .description("jetsched task registry: put/get/list/delete/pause/resume/trigger/next")
        .metadata([("instance".to_string(), instance.clone())].into())
        .start(names.service_name(), env!("CARGO_PKG_VERSION"))
        .await
        .map_err(|e| anyhow::anyhow!("start micro service {}: {e}", names.service_name()))?;
    let group = service.group(names.task_api_group());
    let mut requests: Requests = SelectAll::new();
    for endpoint in Endpoint::TASK {
        let stream =
            group.endpoint_builder().name(endpoint.name()).add(endpoint.name()).await.map_err(|e| {
                anyhow::anyhow!("add endpoint {}: {e}", names.task_api_subject(endpoint.name()))
            })?;
        requests.push(stream.map(move |r| (endpoint, r)).boxed());
    }
    let dlq_group = service.group(names.dlq_api_group());
    for endpoint in DlqEndpoint::ALL {
        let stream =
            dlq_group.endpoint_builder().name(endpoint.label()).add(endpoint.name()).await.map_err(|e| {
                anyhow::anyhow!("add endpoint {}: {e}", names.dlq_api_subject(endpoint.name()))
            })?;
        requests.push(stream.map(move |r| (Endpoint::Dlq(endpoint), r)).boxed());
    }
    let unknown = service
        .endpoint_builder()
        .name("unknown")
        // A queue group of its own: within one group NATS delivers a message to only one of
        // the matching subscriptions, and the catch-all must not steal requests from endpoints.
        .queue_group("unknown-endpoint")
        .add(names.api_wildcard())
        .await
        .map_err(|e| anyhow::anyhow!("add catch-all endpoint {}: {e}", names.api_wildcard()))?;
    // The catch-all sees every API request too: it answers only those no endpoint owns.
    let known: Arc<Vec<String>> = Arc::new(
        Endpoint::TASK
            .iter()
            .map(|e| names.task_api_subject(e.name()))
            .chain(DlqEndpoint::ALL.iter().map(|e| names.dlq_api_subject(e.name())))
            .collect(),
    );
    requests.push(
        unknown
            .filter(move |r| std::future::ready(!known.contains(&r.message.subject.to_string())))
            .map(|r| (Endpoint::Unknown, r))
            .boxed(),
    );
    readiness.set("api", true);

    let intake = intake::consumer(&js, &names).await?;
    readiness.set("intake", true);
    tracing::info!(admin = %admin.local_addr(), service = %names.service_name(), instance = %instance, "registry ready");
    Ok(Registry {
        client,
        service,
        requests,
        intake,
        store,
        dlq: DlqApi::new(js.clone(), names.clone()),
        event_pump,
        names,
        limits,
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
            store,
            dlq,
            event_pump,
            names,
            limits,
            metrics,
            admin,
            concurrency,
        } = self;
        let pump = tokio::spawn(event_pump.run());
        let tracker = TaskTracker::new();
        tracker.spawn(admin.serve(shutdown.clone()));
        let intake_task = tokio::spawn(intake::run(
            intake,
            store.clone(),
            names,
            limits,
            metrics.clone(),
            shutdown.clone(),
        ));
        let permits = Arc::new(Semaphore::new(concurrency));
        loop {
            let permit = tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                permit = permits.clone().acquire_owned() => permit.expect("semaphore never closed"),
            };
            let next = tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                next = requests.next() => next,
            };
            let Some((endpoint, request)) = next else { anyhow::bail!("API subscriptions ended") };
            let store = store.clone();
            let dlq = dlq.clone();
            let metrics = metrics.clone();
            tracker.spawn(async move {
                let _permit = permit;
                serve(&store, &dlq, limits, &metrics, endpoint, request).await;
            });
        }
        tracker.close();
        tracker.wait().await;
        if let Err(error) = service.stop().await {
            tracing::warn!(%error, "stopping the micro service");
        }
        match intake_task.await {
            Ok(Err(error)) => tracing::warn!(error = format!("{error:#}"), "intake consumer stopped"),
            Err(error) => tracing::warn!(%error, "intake consumer panicked"),
            Ok(Ok(())) => {}
        }
        // The last sink goes with the store: the pump then stores what is queued and ends.
        // Bounded: the pump retries an event for up to a minute while JetStream cannot store it.
        drop(store);
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

async fn serve(
    store: &TaskStore,
    dlq: &DlqApi,
    limits: Limits,
    metrics: &Metrics,
    endpoint: Endpoint,
    request: Request,
) {
    let started = Instant::now();
    let result = match endpoint {
        Endpoint::Dlq(endpoint) => dlq.handle(endpoint, &request.message.payload).await.map_err(Into::into),
        _ => api::handle(store, limits, endpoint, &request).await,
    };
    let outcome = match &result {
        Ok(_) => "ok",
        Err(errors) => errors.first().code.as_str(),
    };
    metrics.requests.with_label_values(&[endpoint.name(), outcome]).inc();
    metrics.request_seconds.with_label_values(&[endpoint.name()]).observe(started.elapsed().as_secs_f64());
    let sent = match result {
        Ok(body) => request.respond(Ok(body.into())).await,
        Err(error) => {
            if error.first().code == jetsched_shared::error::ErrorCode::Internal {
                tracing::error!(endpoint = endpoint.name(), error = %error, "request failed");
            }
            let (body, headers) = api::error_reply(&error);
            request.respond_with_headers(Ok(body.into()), headers).await
        }
    };
    if let Err(error) = sent {
        tracing::debug!(%error, endpoint = endpoint.name(), "reply not sent (requester gone?)");
    }
}
