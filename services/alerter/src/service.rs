//! `build` (all fallible I/O: bind and serve the admin port, connect, ensure the topology and
//! the alerter's bucket and consumers, restore open de-duplication windows, start the channels)
//! and `Alerter::run` (one loop over events, lease changes, periodic checks and deadlines).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use chrono::Utc;
use jetsched_shared::backoff::Backoff;
use jetsched_shared::service::{Base, Role};
use jetsched_shared::topology::{self, TopologyError};
use prometheus::Registry as MetricsRegistry;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::alerts::Alerts;
use crate::channels::{Channels, log::LogChannel, nats::NatsChannel, webhook::WebhookChannel};
use crate::checks::Checks;
use crate::config::{Config, DEFAULT_ADMIN_ADDR};
use crate::core::Core;
use crate::feed::{self, Feed};
use crate::leaders::Leaders;
use crate::lease::Lease;
use crate::metrics::Metrics;
use crate::rules::chrono_duration;
use crate::rules::detector::Detector;
use crate::rules::throttle::Throttle;
use crate::state::DedupStore;

/// Pause between start-up attempts while a JetStream resource has conflicting settings.
const CONFLICT_RETRY: Duration = Duration::from_millis(500);
/// How long `run` lets channels deliver what is queued after shutdown.
const CHANNEL_GRACE: Duration = Duration::from_secs(10);

/// A started alerter, ready to run.
pub struct Alerter {
    client: async_nats::Client,
    core: Core,
    tracker: TaskTracker,
    admin_addr: SocketAddr,
    admin_stop: CancellationToken,
    /// `jetsched-alerter` micro service: lets `jetsched status` count live replicas.
    presence: async_nats::service::Service,
}

/// Binds and serves the admin listener (so `/readyz` answers during start-up), connects,
/// ensures the topology (waiting up to `--startup-timeout` for a conflicting resource to be
/// replaced), the alerter's bucket and durable consumers, and restores the open de-duplication
/// windows.
pub async fn build(config: Config) -> anyhow::Result<Alerter> {
    config.validate()?;
    let registry = MetricsRegistry::new();
    let metrics = Metrics::register(&registry)?;
    let role = Role::new("alerter", DEFAULT_ADMIN_ADDR, &["consumer", "lease_watch", "leader_events"]);
    let Base { names, instance, readiness, admin, client, js } =
        Base::start(role, &config.shared, registry).await?;
    let admin_addr = admin.local_addr();
    let admin_stop = CancellationToken::new();
    let tracker = TaskTracker::new();
    let admin_task = tracker.spawn(admin.serve(admin_stop.clone()));
    // Stops the admin server if start-up fails below.
    let guard = admin_stop.clone().drop_guard();

    // `ensure` itself waits for a JetStream that cannot answer yet (`--topology-wait`). The
    // alerter also waits out a stream or bucket with conflicting settings, which other
    // services refuse at once: it may start while another deployment's resource is replaced.
    let deadline = tokio::time::Instant::now() + config.startup_timeout;
    let ensured = Backoff::new(CONFLICT_RETRY, CONFLICT_RETRY)
        .retry_until(
            deadline,
            |_| topology::ensure(&js, &names, &config.shared.topology),
            |error, _, _| {
                let conflict = matches!(error, TopologyError::Conflict { .. });
                if conflict {
                    tracing::warn!(
                        error = format!("{error:#}"),
                        "a JetStream resource has conflicting settings; retrying until it is replaced"
                    );
                }
                conflict
            },
        )
        .await;
    let topology = match ensured {
        Ok(topology) => topology,
        Err(gave_up) => match gave_up.error {
            error @ TopologyError::Conflict { .. } => {
                return Err(error).context(format!(
                    "ensure JetStream topology (the conflicting resource was not replaced within {:?})",
                    config.startup_timeout
                ));
            }
            error => return Err(error).context("ensure JetStream topology"),
        },
    };
    let mut store = DedupStore::open(&js, &names, &config.shared.topology, &instance).await?;
    readiness.set("topology", true);

    let consumers = feed::consumers(&js, &names, &config.rules).await?;
    let feed = Feed::start(&consumers, metrics.clone()).await?;
    readiness.set("consumer", true);
    let history_start = Utc::now() - chrono_duration(config.flap_window);
    let leaders =
        Leaders::open(js.clone(), names.clone(), history_start, readiness.clone(), metrics.clone()).await?;

    let mut throttle = Throttle::new(config.throttle(), instance.clone());
    let restored = store.load(&mut throttle, Utc::now()).await?;

    let mut channels = Channels::new(metrics.clone());
    if config.log_alerts {
        channels.add(LogChannel, config.channel_queue, &tracker);
    }
    if config.nats_alerts {
        channels.add(NatsChannel::new(js.clone(), names.clone()), config.channel_queue, &tracker);
    }
    for url in &config.webhook_urls {
        let webhook = WebhookChannel::new(
            url,
            config.webhook_timeout,
            config.webhook_attempts,
            config.webhook_backoff,
        )?;
        channels.add(webhook, config.webhook_queue, &tracker);
    }
    if admin_task.is_finished() {
        anyhow::bail!("admin server stopped during start-up");
    }
    let presence = jetsched_shared::presence::announce(&client, &names, "alerter", &instance, []).await?;
    let (lease, holder) = Lease::open(topology.leader, &names, readiness, metrics.clone()).await;
    anyhow::ensure!(lease.watching(), "cannot watch the leader lease (see the log)");
    let mut core = Core {
        detector: Detector::new(config.thresholds()),
        alerts: Alerts::new(throttle, store, channels, metrics.clone()),
        checks: Checks::new(config.check_interval, metrics.clone()),
        lease,
        leaders,
        feed,
        js,
        names,
        metrics,
    };
    if let Some(holder) = holder {
        core.on_holder(holder);
    }
    guard.disarm();
    tracing::info!(admin = %admin_addr, instance = %instance, restored_windows = restored, "alerter ready");
    Ok(Alerter { client, core, tracker, admin_addr, admin_stop, presence })
}

impl Alerter {
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// Consumes events, follows the lease, runs the checks and sends alerts until `shutdown`;
    /// then lets the channels deliver what is queued (bounded) and drains the connection.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let Alerter { client, mut core, tracker, admin_stop, presence, .. } = self;
        let ended = core.run(&shutdown).await;
        admin_stop.cancel();
        // Dropping the channels lets each deliver its queue, then end.
        drop(core.alerts.drain(Utc::now()));
        ended?;
        if let Err(error) = presence.stop().await {
            tracing::warn!(%error, "stopping the presence service");
        }
        tracker.close();
        if tokio::time::timeout(CHANNEL_GRACE, tracker.wait()).await.is_err() {
            tracing::warn!("alert channels still busy after {CHANNEL_GRACE:?}; leaving queued messages");
        }
        client.drain().await.context("drain NATS connection")?;
        tracing::info!("alerter stopped");
        Ok(())
    }
}
