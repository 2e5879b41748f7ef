//! `build` (all fallible I/O: connect, ensure the topology, open the tasks watch, bind the
//! admin port) and `Scheduler::run` (the dispatch loop of `core.rs`, the lease task and the
//! events task, then an orderly stop).
//!
//! The scheduler's wall clock is a parameter ([`build_with_clock`]): the system clock corrected
//! by the clock guard's measured offset in production (fires follow the server's clock), a
//! clock the test moves in tests (no guard).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use jetsched_shared::admin::AdminServer;
use jetsched_shared::events::{EventPublisher, EventPump};
use jetsched_shared::service::{Base, Role};
use jetsched_shared::topology::Topology;
use prometheus::Registry as MetricsRegistry;
use tokio_util::sync::CancellationToken;

use crate::acks::Acks;
use crate::backfills::Driver;
use crate::calendars::CalendarFeed;
use crate::catchup::Limits;
use crate::clock::{SharedClock, SystemClock};
use crate::config::{Config, DEFAULT_ADMIN_ADDR};
use crate::core::{Core, Nats, Report, SHUTDOWN_GRACE, Time};
use crate::discovery;
use crate::flush::Flush;
use crate::follow::Follow;
use crate::lease::{Campaign, Timing};
use crate::metrics::Metrics;
use crate::overlap::Overlap;
use crate::partitions::Partitions;
use crate::pipeline::Pipeline;
use crate::skew::{Guard, Meter};
use crate::specs::Specs;
use crate::takeover::Takeover;
use crate::tasks::Tasks;
use crate::wake::Wake;

/// Largest pre-sized task table (from the bucket's message count).
const MAX_PRESIZE: usize = 10_000_000;
/// Messages buffered per subscription: the tasks watch of a large bucket arrives faster than
/// specs are decoded, and room for a quarter million entries keeps the ordered consumer from
/// dropping and restarting.
const WATCH_BUFFER: usize = 256 * 1024;
/// Events queued for the events task at most (beyond, an event is dropped and counted).
const EVENT_QUEUE: usize = 65_536;
/// Event publishes awaiting their ack at once.
const EVENT_WINDOW: usize = 256;

/// A started scheduler, ready to run.
pub struct Scheduler {
    client: async_nats::Client,
    core: Core,
    admin: AdminServer,
    event_pump: EventPump,
    /// `jetsched-scheduler` micro service: lets `jetsched status` count live replicas.
    presence: async_nats::service::Service,
    /// The clock guard's heartbeat (none on a test clock).
    meter: Option<Meter>,
    /// Dispatches running backfills while this replica leads.
    backfills: Driver,
    /// The backfills' own connection.
    backfill_client: async_nats::Client,
}

/// Connects, ensures the topology, opens the tasks watch and binds the admin listener; the
/// scheduler runs on the system clock.
pub async fn build(config: Config) -> anyhow::Result<Scheduler> {
    build_on(config, Arc::new(SystemClock), true).await
}

/// [`build`] with the wall clock the scheduler fires by (tests pass a
/// [`ManualClock`](crate::ManualClock)).
pub async fn build_with_clock(config: Config, clock: SharedClock) -> anyhow::Result<Scheduler> {
    build_on(config, clock, false).await
}

/// [`build`] on the `local` clock, corrected by the clock guard when `guarded`.
async fn build_on(config: Config, local: SharedClock, guarded: bool) -> anyhow::Result<Scheduler> {
    let registry = MetricsRegistry::new();
    let metrics = Metrics::register(&registry)?;
    let role = Role::new("scheduler", DEFAULT_ADMIN_ADDR, &["tasks_loaded"])
        .with_subscription_capacity(WATCH_BUFFER);
    let base = Base::start(role, &config.shared, registry.clone()).await?;
    let Topology { tasks, leader, state, runs, backfills, cancels, calendars, .. } =
        base.ensure_topology(&config.shared.topology).await?;
    let Base { names, instance, readiness, admin, client, js } = base;
    // Calendars are read before the tasks: the first plan of each task already follows them.
    let (calendar_feed, calendars) = CalendarFeed::open(&js, calendars).await?;
    let dispatches = js
        .get_stream_no_info(names.dispatch_stream())
        .await
        .with_context(|| format!("look up stream {}", names.dispatch_stream()))?;
    let specs = Arc::new(Specs::default());
    let (feed, messages) = discovery::open_tasks(&tasks, specs.clone()).await?;
    let empty = messages == 0;
    // The bucket's message count bounds the number of tasks (history adds more): pre-size.
    let capacity = usize::try_from(messages).unwrap_or(usize::MAX).min(MAX_PRESIZE);

    // Events go through the shared publisher's queue (`jetsched_events_failed_total` counts
    // those not stored, a full queue included): the loop never waits for them.
    let (events, event_pump) =
        EventPublisher::with_metrics(js.clone(), names.clone(), &registry)?.queue(EVENT_QUEUE, EVENT_WINDOW);
    // The clock is corrected before the loop first reads it.
    let (meter, guard, clock) = if guarded {
        let key = names.clock_key(&instance);
        let gauge = metrics.clock_offset.clone();
        let (mut meter, guard) =
            Meter::new(leader.clone(), key, instance.clone(), local, config.max_clock_skew, gauge);
        meter.first(&events).await;
        let clock = meter.server_clock();
        (Some(meter), guard, clock)
    } else {
        (None, Guard::off(), local)
    };
    let campaign = Campaign::new(
        client.clone(),
        names.clone(),
        leader,
        instance.clone(),
        Timing { lease: config.shared.topology.lease, margin: config.lease_margin },
        clock.clone(),
        guard,
    )
    .await?;
    let limits = Limits { threshold: config.misfire_threshold, max: config.catchup_max };
    let takeover = Takeover::new(campaign, limits);
    // Backfill publishes go over a connection of their own: the server reads each connection in
    // turn, so a live fire's publish does not queue behind a window of backfill publishes on one
    // socket.
    let backfill_client =
        config.shared.nats.connect(&format!("jetsched-scheduler {instance} backfill")).await?;
    let backfills = Driver {
        names: names.clone(),
        js: async_nats::jetstream::new(backfill_client.clone()),
        tasks: tasks.clone(),
        runs: runs.clone(),
        state: state.clone(),
        backfills,
        events: events.clone(),
        lease: takeover.lease_watch(),
        calendars: calendars.view(),
        batch: config.backfill_batch,
        in_flight: config.backfill_in_flight,
    };
    let time = Time::new(clock);
    let core = Core {
        wake: Wake::new(time.now_ms(), capacity),
        time,
        tasks: Tasks::with_capacity(capacity, specs.clone()),
        follow: Follow::new(feed, empty, specs, readiness.jetstream_returns()),
        takeover,
        pipeline: Pipeline::new(config.publish_window, config.catchup_rate, Acks::subscribe(&client).await?),
        overlap: Overlap::default(),
        flush: Flush::new(config.state_flush),
        calendars,
        calendar_feed,
        nats: Nats {
            names,
            client: client.clone(),
            tasks,
            state,
            runs: Arc::new(runs),
            runs_ttl: config.shared.topology.runs_ttl,
            cancels,
            dispatches,
        },
        report: Report {
            metrics,
            partitions: Partitions::register(&registry, config.shared.topology.partitions)?,
            events,
            instance,
            fire_events: config.fire_events,
            readiness,
        },
    };
    if empty {
        core.report.readiness.set("tasks_loaded", true);
        tracing::info!(tasks = 0, elapsed_ms = 0, "tasks loaded");
    }
    let presence = jetsched_shared::presence::announce(
        &client,
        &core.nats.names,
        "scheduler",
        &core.report.instance,
        [],
    )
    .await?;
    tracing::info!(admin = %admin.local_addr(), instance = %core.report.instance, "scheduler ready");
    Ok(Scheduler { client, core, admin, event_pump, presence, meter, backfills, backfill_client })
}

impl Scheduler {
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin.local_addr()
    }

    /// Follows the tasks, campaigns for the lease and dispatches while leader, until `shutdown`;
    /// then waits for pending acks, writes the fire state, releases the lease and drains.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let Scheduler { client, mut core, admin, event_pump, presence, meter, backfills, backfill_client } =
            self;
        let admin_task = tokio::spawn(admin.serve(shutdown.clone()));
        let backfills_task = tokio::spawn(backfills.run(shutdown.clone()));
        let events_task = tokio::spawn(event_pump.run());
        let meter_task = meter.map(|m| tokio::spawn(m.run(core.report.events.clone(), shutdown.clone())));

        core.run(&shutdown).await;
        // A batch under way is acknowledged or stays pending for the next leader.
        if tokio::time::timeout(SHUTDOWN_GRACE, backfills_task).await.is_err() {
            tracing::warn!("a backfill batch still under way at shutdown");
        }
        if let Err(error) = backfill_client.drain().await {
            tracing::warn!(%error, "draining the backfills' connection");
        }
        core.drain().await;
        drop(core);
        if let Some(task) = meter_task {
            let _ = task.await;
        }

        if tokio::time::timeout(SHUTDOWN_GRACE, events_task).await.is_err() {
            tracing::warn!("events not all published before shutdown");
        }
        match admin_task.await {
            Ok(Err(error)) => tracing::warn!(error = format!("{error:#}"), "admin server stopped"),
            Err(error) => tracing::warn!(%error, "admin server panicked"),
            Ok(Ok(())) => {}
        }
        if let Err(error) = presence.stop().await {
            tracing::warn!(%error, "stopping the presence service");
        }
        client.drain().await.context("drain NATS connection")?;
        tracing::info!("scheduler stopped");
        Ok(())
    }
}
