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
use crate::breakers::{BreakerApi, BreakerEndpoint};
use crate::config::{Config, DEFAULT_ADMIN_ADDR};
use crate::dlq::{DlqApi, DlqEndpoint};
use crate::history::EventHistory;
use crate::metrics::Metrics;
use crate::tasks::TaskStore;
use crate::{intake, pause};
use crate::{runs, scope, spans};

/// How long a stopping registry waits for its queued events to be stored.
const EVENTS_GRACE: Duration = Duration::from_secs(10);

/// A request, its endpoint, and whether it came on a namespaced subject
/// (`<group>.<endpoint>.<namespace>`, the namespace being the subject's last token).
type Requests = SelectAll<futures::stream::BoxStream<'static, (Endpoint, bool, Request)>>;

/// A started registry, ready to serve.
pub struct Registry {
    client: async_nats::Client,
    service: async_nats::service::Service,
    requests: Requests,
    intake: PullConsumer,
    pauses: PullConsumer,
    store: TaskStore,
    dlq: DlqApi,
    breakers: BreakerApi,
    runs: async_nats::jetstream::kv::Store,
    history: EventHistory,
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
        checks: &["api", "intake", "pause"],
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
    let breakers = BreakerApi::new(
        js.clone(),
        topology.breakers.clone(),
        topology.tasks.clone(),
        events.clone(),
        instance.clone(),
    );
    let store = TaskStore::new(
        js.clone(),
        topology.tasks,
        topology.state,
        topology.breakers.clone(),
        names.clone(),
        events,
        metrics.changes.clone(),
    )
    .await?
    .with_quotas(config.quotas());

    let service = client
        .service_builder()
        .description("jetsched task registry: put/get/list/delete/pause/resume/trigger/next")
        .metadata([("instance".to_string(), instance.clone())].into())
        .start(names.service_name(), env!("CARGO_PKG_VERSION"))
        .await
        .map_err(|e| anyhow::anyhow!("start micro service {}: {e}", names.service_name()))?;
    let group = service.group(names.task_api_group());
    let mut requests: Requests = SelectAll::new();
    // Every endpoint twice: `<endpoint>` for administrators and `<endpoint>.<namespace>`
    // (named `<name>-ns`) for teams confined to one namespace by NATS permissions.
    let namespaced = |namespaced: bool| -> std::collections::HashMap<String, String> {
        [("namespaced".to_string(), namespaced.to_string())].into()
    };
    for endpoint in Endpoint::TASK {
        for scoped in [false, true] {
            let (name, subject) = endpoint_names(endpoint.name(), endpoint.name(), scoped);
            let stream = group
                .endpoint_builder()
                .name(&name)
                .metadata(namespaced(scoped))
                .add(&subject)
                .await
                .map_err(|e| anyhow::anyhow!("add endpoint {}.{subject}: {e}", names.task_api_group()))?;
            requests.push(stream.map(move |r| (endpoint, scoped, r)).boxed());
        }
    }
    let dlq_group = service.group(names.dlq_api_group());
    for endpoint in DlqEndpoint::ALL {
        for scoped in [false, true] {
            let (name, subject) = endpoint_names(endpoint.label(), endpoint.name(), scoped);
            let stream = dlq_group
                .endpoint_builder()
                .name(&name)
                .metadata(namespaced(scoped))
                .add(&subject)
                .await
                .map_err(|e| anyhow::anyhow!("add endpoint {}.{subject}: {e}", names.dlq_api_group()))?;
            requests.push(stream.map(move |r| (Endpoint::Dlq(endpoint), scoped, r)).boxed());
        }
    }
    // Breakers span namespaces: administrators only, no namespaced form.
    let breaker_group = service.group(names.breaker_api_group());
    for endpoint in BreakerEndpoint::ALL {
        let stream = breaker_group
            .endpoint_builder()
            .name(endpoint.label())
            .metadata(namespaced(false))
            .add(endpoint.name())
            .await
            .map_err(|e| {
                anyhow::anyhow!("add endpoint {}: {e}", names.breaker_api_subject(endpoint.name()))
            })?;
        requests.push(stream.map(move |r| (Endpoint::Breaker(endpoint), false, r)).boxed());
    }
    // Run records only per namespace: administrators read the runs bucket directly.
    let runs_get = service
        .group(names.runs_api_group())
        .endpoint_builder()
        .name(Endpoint::RunsGet.name())
        .metadata(namespaced(true))
        .add("get.*")
        .await
        .map_err(|e| anyhow::anyhow!("add endpoint {}: {e}", names.runs_api_namespaced("get", "*")))?;
    requests.push(runs_get.map(|r| (Endpoint::RunsGet, true, r)).boxed());
    // Event history only per namespace too: administrators read the events stream directly.
    let events_history = service
        .group(names.events_api_group())
        .endpoint_builder()
        .name(Endpoint::EventsHistory.name())
        .metadata(namespaced(true))
        .add("history.*")
        .await
        .map_err(|e| anyhow::anyhow!("add endpoint {}: {e}", names.events_api_namespaced("history", "*")))?;
    requests.push(events_history.map(|r| (Endpoint::EventsHistory, true, r)).boxed());
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
            .chain(BreakerEndpoint::ALL.iter().map(|e| names.breaker_api_subject(e.name())))
            .collect(),
    );
    let known_namespaced = Arc::new(
        known
            .iter()
            .cloned()
            .chain([
                format!("{}.get", names.runs_api_group()),
                format!("{}.history", names.events_api_group()),
            ])
            .collect::<Vec<_>>(),
    );
    requests.push(
        unknown
            .filter(move |r| {
                let subject = r.message.subject.as_str();
                let namespaced = subject
                    .rsplit_once('.')
                    .is_some_and(|(endpoint, _)| known_namespaced.iter().any(|k| k == endpoint));
                std::future::ready(!namespaced && !known.iter().any(|k| k == subject))
            })
            .map(|r| (Endpoint::Unknown, false, r))
            .boxed(),
    );
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
        store,
        dlq: DlqApi::new(js.clone(), names.clone()),
        breakers,
        runs: topology.runs,
        history: EventHistory::new(js.clone(), names.clone()),
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
            pauses,
            store,
            dlq,
            breakers,
            runs,
            history,
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
            names.clone(),
            limits,
            metrics.clone(),
            shutdown.clone(),
        ));
        let pause_task =
            tokio::spawn(pause::run(pauses, store.clone(), names, metrics.clone(), shutdown.clone()));
        let permits = Arc::new(Semaphore::new(concurrency));
        // Shared by every request's task: cloning the stores themselves (each holds its
        // stream's info) cost an allocation per string and made every task kilobytes larger.
        let state = Arc::new(Handlers { store, dlq, breakers, runs, history });
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
            let Some((endpoint, scoped, request)) = next else { anyhow::bail!("API subscriptions ended") };
            let (state, metrics) = (state.clone(), metrics.clone());
            tracker.spawn(async move {
                let _permit = permit;
                serve(&state, limits, &metrics, endpoint, scoped, request).await;
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
        match pause_task.await {
            Ok(Err(error)) => tracing::warn!(error = format!("{error:#}"), "pause consumer stopped"),
            Err(error) => tracing::warn!(%error, "pause consumer panicked"),
            Ok(Ok(())) => {}
        }
        // The last sink goes with the store: the pump then stores what is queued and ends.
        // Bounded: the pump retries an event for up to a minute while JetStream cannot store it.
        drop(state);
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

/// What the endpoints read and write.
struct Handlers {
    store: TaskStore,
    dlq: DlqApi,
    breakers: BreakerApi,
    runs: async_nats::jetstream::kv::Store,
    history: EventHistory,
}

/// The micro-service endpoint name and subject (within its group) of an endpoint, plain or
/// namespaced.
fn endpoint_names(name: &str, subject: &str, namespaced: bool) -> (String, String) {
    if namespaced { (format!("{name}-ns"), format!("{subject}.*")) } else { (name.into(), subject.into()) }
}

async fn serve(
    handlers: &Handlers,
    limits: Limits,
    metrics: &Metrics,
    endpoint: Endpoint,
    scoped: bool,
    request: Request,
) {
    let Handlers { store, dlq, breakers, runs, history } = handlers;
    let started = Instant::now();
    let subject = request.message.subject.clone();
    let scope = scoped.then(|| subject.rsplit_once('.').map_or("", |(_, namespace)| namespace));
    let span = spans::request(endpoint, &subject, request.message.headers.as_ref());
    // Each endpoint's future is boxed at its own size: inline, the largest (kilobytes) would
    // be part of the task spawned for every request, whatever its endpoint.
    let handling = async {
        match (endpoint, scope) {
            (Endpoint::Dlq(endpoint), scope) => {
                Box::pin(dlq.handle_in(endpoint, scope, &request.message.payload)).await.map_err(Into::into)
            }
            (Endpoint::Breaker(endpoint), _) => {
                Box::pin(breakers.handle(endpoint, &request.message.payload)).await.map_err(Into::into)
            }
            (Endpoint::RunsGet, scope) => {
                Box::pin(runs::get(runs, scope.unwrap_or_default(), &request.message.payload))
                    .await
                    .map_err(Into::into)
            }
            (Endpoint::EventsHistory, scope) => {
                Box::pin(history.handle(scope.unwrap_or_default(), &request.message.payload))
                    .await
                    .map_err(Into::into)
            }
            (_, Some(namespace)) => {
                Box::pin(scope::handle(store, limits, endpoint, namespace, &request)).await
            }
            (_, None) => Box::pin(api::handle(store, limits, endpoint, &request)).await,
        }
    };
    let result = span.around(handling).await;
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
