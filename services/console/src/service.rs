//! `build` (all fallible I/O: connect, open the buckets and streams the console reads, open the
//! tasks watch, bind both listeners) and `Console::run` (serve until shutdown).

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use jetsched_shared::admin::AdminServer;
use jetsched_shared::backoff::Backoff;
use jetsched_shared::service::{Base, Role};
use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::access::Access;
use crate::activity::{self, Activity};
use crate::api::Api;
use crate::config::{Config, DEFAULT_ADMIN_ADDR};
use crate::http;
use crate::index::TaskIndex;
use crate::index::feed::IndexFeed;
use crate::replicas::Replicas;
use crate::state::AppState;

/// Messages buffered per subscription: the tasks watch is flow-controlled by the server, so a
/// small buffer keeps a large initial load from piling up in memory.
const SUBSCRIPTION_CAPACITY: usize = 2048;
/// Live events buffered per page listening (a slow page skips the ones it missed).
const LIVE_BUFFER: usize = 1024;

/// A started console, ready to serve.
pub struct Console {
    state: AppState,
    feed: IndexFeed,
    listener: TcpListener,
    admin: AdminServer,
    readiness: jetsched_shared::admin::Readiness,
    presence: async_nats::service::Service,
    client: async_nats::Client,
}

/// Connects, opens what the console reads (it creates nothing), opens the tasks watch and
/// binds the page and admin listeners.
pub async fn build(config: Config) -> anyhow::Result<Console> {
    let token = config.token()?;
    let role = Role::new("console", DEFAULT_ADMIN_ADDR, &["task_index"])
        .with_subscription_capacity(SUBSCRIPTION_CAPACITY);
    let base = Base::start(role, &config.shared, prometheus::Registry::new()).await?;
    let Base { names, instance, readiness, admin, client, js } = base;
    // The console ensures no topology: it reads what the registry creates, and waits for it
    // (up to --topology-wait) when started first, saying so, as the other services wait for
    // JetStream.
    let deadline = tokio::time::Instant::now() + config.shared.topology.topology_wait;
    let tasks = open_bucket(&js, &names.tasks_bucket(), deadline).await?;
    let runs = open_bucket(&js, &names.runs_bucket(), deadline).await?;
    readiness.set("topology", true);
    let index = Arc::new(RwLock::new(TaskIndex::default()));
    let feed = IndexFeed::open(&tasks, index.clone()).await?;
    let listener = TcpListener::bind(config.http_addr)
        .await
        .with_context(|| format!("bind the console listener {}", config.http_addr))?;
    let presence = jetsched_shared::presence::announce(&client, &names, "console", &instance, []).await?;
    let (live, _) = broadcast::channel(LIVE_BUFFER);
    let state = AppState {
        index,
        activity: Arc::new(RwLock::new(Activity::new(config.recent_events))),
        replicas: Replicas::default(),
        live,
        api: Api::new(client.clone(), names.clone()),
        access: Access::new(token, config.allow_actions),
        client: client.clone(),
        js,
        names,
        runs: Arc::new(runs),
        page_size: config.page_size,
        trace: crate::trace::TraceLinks::new(config.trace_url.as_deref()),
    };
    Ok(Console { state, feed, listener, admin, readiness, presence, client })
}

impl Console {
    /// Where the pages are served (port 0 resolved).
    pub fn http_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("bound listener has an address")
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin.local_addr()
    }

    /// Serves the pages, follows the tasks bucket and the events and alerts streams until
    /// `shutdown`, then drains the connection.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let Console { state, feed, listener, admin, readiness, presence, client } = self;
        let tracker = TaskTracker::new();
        tracker.spawn(admin.serve(shutdown.clone()));
        activity::spawn(
            &tracker,
            &state.js,
            &state.names,
            (state.activity.clone(), state.index.clone(), feed.loaded()),
            state.live.clone(),
            &shutdown,
        );
        let replicas = state.replicas.clone().follow(client.clone(), state.names.clone(), shutdown.clone());
        tracker.spawn(replicas);
        let follower = tracker.spawn(feed.follow(readiness, shutdown.clone()));
        tracing::info!(addr = %listener.local_addr()?, "console serving");
        let app = http::router(state);
        let stop = shutdown.clone();
        let served = axum::serve(listener, app).with_graceful_shutdown(async move { stop.cancelled().await });
        let result = tokio::select! {
            served = served => served.context("console HTTP server"),
            followed = follower => match followed {
                Ok(Ok(())) => Ok(()),
                Ok(Err(error)) => Err(error),
                Err(error) => Err(anyhow::anyhow!("task index follower: {error}")),
            },
        };
        shutdown.cancel();
        tracker.close();
        tracker.wait().await;
        let _ = presence.stop().await;
        client.drain().await.context("drain the NATS connection")?;
        result
    }
}

/// Opens a bucket the registry creates, retrying with backoff until `deadline` while it does
/// not exist yet (or JetStream does not answer).
async fn open_bucket(
    js: &async_nats::jetstream::Context,
    bucket: &str,
    deadline: tokio::time::Instant,
) -> anyhow::Result<async_nats::jetstream::kv::Store> {
    Backoff::new(Duration::from_millis(100), Duration::from_secs(2))
        .retry_until(
            deadline,
            |_| js.get_key_value(bucket),
            |error, attempt, delay| {
                tracing::info!(bucket, attempt, ?delay, %error, "waiting for the registry to create the topology");
                true
            },
        )
        .await
        .map_err(|gave_up| {
            anyhow::anyhow!("open the bucket {bucket} (is the registry started? --topology-wait): {gave_up}")
        })
}
