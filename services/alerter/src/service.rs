//! `build` (all fallible I/O: bind and serve the admin port, connect, ensure the topology and
//! the alerter's bucket and consumers, restore open de-duplication windows, start the channels)
//! and `Alerter::run` (one loop over events, lease changes, periodic checks and deadlines).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::{
    self,
    consumer::{AckPolicy, DeliverPolicy, PullConsumer, pull},
    kv,
};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use jetsched_shared::admin::Readiness;
use jetsched_shared::backoff::Backoff;
use jetsched_shared::config::DEFAULT_SUBSCRIPTION_CAPACITY;
use jetsched_shared::names::Names;
use jetsched_shared::service::{Base, Role};
use jetsched_shared::topology::{self, TopologyError};
use jetsched_shared::wire::{Event, EventKind, LeaderRecord};
use prometheus::Registry as MetricsRegistry;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::channels::{Channels, log::LogChannel, nats::NatsChannel, webhook::WebhookChannel};
use crate::config::{Config, DEFAULT_ADMIN_ADDR};
use crate::metrics::Metrics;
use crate::probes;
use crate::rules::throttle::{Admission, DedupKey, Throttle};
use crate::rules::{Candidate, Detector, Rule};
use crate::state::{Claim, DedupStore, MAX_DEDUP_WINDOW};

/// How long `run` lets channels deliver what is queued after shutdown.
/// Pause between start-up attempts while a JetStream resource has conflicting settings.
const CONFLICT_RETRY: Duration = Duration::from_millis(500);
/// First pause after an events pull error; it doubles up to [`PULL_RETRY_MAX`] while errors
/// last and starts over after a message.
const PULL_RETRY_FIRST: Duration = Duration::from_millis(200);
const PULL_RETRY_MAX: Duration = Duration::from_secs(5);
const CHANNEL_GRACE: Duration = Duration::from_secs(10);

/// A started alerter, ready to run.
pub struct Alerter {
    client: async_nats::Client,
    js: jetstream::Context,
    names: Names,
    /// One durable consumer per event kind the rules read.
    consumers: Vec<PullConsumer>,
    leader: kv::Store,
    lease: Option<kv::Watch>,
    leader_events: Option<pull::Ordered>,
    /// Time of the latest leader event seen (where a reopened leader consumer resumes).
    leader_events_seen: DateTime<Utc>,
    store: DedupStore,
    detector: Detector,
    throttle: Throttle,
    channels: Channels,
    tracker: TaskTracker,
    admin_addr: SocketAddr,
    admin_stop: CancellationToken,
    readiness: Readiness,
    metrics: Metrics,
    check_interval: Duration,
    /// `jetsched-alerter` micro service: lets `jetsched status` count live replicas.
    presence: async_nats::service::Service,
}

/// Binds and serves the admin listener (so `/readyz` answers during start-up), connects,
/// ensures the topology (waiting up to `--startup-timeout` for a conflicting resource to be
/// replaced), the alerter's bucket and durable consumers, and restores the open de-duplication
/// windows.
pub async fn build(config: Config) -> anyhow::Result<Alerter> {
    config.validate()?;
    anyhow::ensure!(
        config.dedup_window <= MAX_DEDUP_WINDOW,
        "invalid configuration: --dedup-window is at most {MAX_DEDUP_WINDOW:?}"
    );
    let registry = MetricsRegistry::new();
    let metrics = Metrics::register(&registry)?;
    let role = Role {
        name: "alerter",
        default_admin: DEFAULT_ADMIN_ADDR,
        checks: &["consumer", "lease_watch", "leader_events"],
        subscription_capacity: DEFAULT_SUBSCRIPTION_CAPACITY,
    };
    let Base { names, instance, readiness, admin, client, js } =
        Base::start(role, &config.common, &config.nats, registry).await?;
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
            |_| topology::ensure(&js, &names, &config.topology),
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
    let mut store = DedupStore::open(&js, &names, &config.topology, &instance).await?;
    readiness.set("topology", true);

    let consumers = events_consumers(&js, &names, &config.rules).await?;
    let history_start = Utc::now() - crate::rules::chrono_duration(config.flap_window);
    let leader_events = leader_events(&js, &names, history_start).await?;
    readiness.set("consumer", true);
    readiness.set("leader_events", true);

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
    let mut alerter = Alerter {
        presence,
        client,
        js,
        names,
        consumers,
        leader: topology.leader,
        lease: None,
        leader_events: Some(leader_events),
        leader_events_seen: history_start,
        store,
        detector: Detector::new(config.thresholds()),
        throttle,
        channels,
        tracker,
        admin_addr,
        admin_stop,
        readiness,
        metrics,
        check_interval: config.check_interval,
    };
    alerter.lease = alerter.open_lease_watch().await;
    anyhow::ensure!(alerter.lease.is_some(), "cannot watch the leader lease (see the log)");
    guard.disarm();
    tracing::info!(admin = %admin_addr, instance = %instance, restored_windows = restored, "alerter ready");
    Ok(alerter)
}

/// Every leader change since `since`, for this replica alone (each replica counts every
/// change towards flapping; the dedup bucket keeps their alerts single).
async fn leader_events(
    js: &jetstream::Context,
    names: &Names,
    since: DateTime<Utc>,
) -> anyhow::Result<pull::Ordered> {
    let name = names.events_stream();
    let stream = js.get_stream(&name).await.with_context(|| format!("look up stream {name}"))?;
    let start_time = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(
        since.timestamp_nanos_opt().unwrap_or_default(),
    ))
    .context("leader events start time")?;
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            filter_subject: names.event_subject(LEADER_KIND.as_str(), "*", "*"),
            deliver_policy: DeliverPolicy::ByStartTime { start_time },
            ..Default::default()
        })
        .await
        .with_context(|| format!("ordered consumer of leader events on {name}"))?;
    consumer.messages().await.with_context(|| format!("read leader events from {name}"))
}

/// The durable consumers on the events stream, shared by replicas: one per kind the enabled
/// rules read, each filtered to that kind alone (see [`Names::alerter_consumer`] for why not
/// one consumer with several filters). A new consumer starts with new events: history is not
/// re-alerted. The earlier combined consumer, if any, is removed.
async fn events_consumers(
    js: &jetstream::Context,
    names: &Names,
    rules: &[Rule],
) -> anyhow::Result<Vec<PullConsumer>> {
    let kinds = shared_kinds(rules);
    let name = names.events_stream();
    let stream = js.get_stream(&name).await.with_context(|| format!("look up stream {name}"))?;
    let combined = names.alerter_combined_consumer();
    match stream.delete_consumer(combined).await {
        Ok(_) => tracing::info!(consumer = combined, "removed the earlier combined events consumer"),
        Err(error) => tracing::debug!(%error, consumer = combined, "no earlier combined events consumer"),
    }
    let mut consumers = Vec::with_capacity(kinds.len());
    for kind in kinds {
        let durable = names.alerter_consumer(kind.as_str());
        let consumer = stream
            .create_consumer(pull::Config {
                durable_name: Some(durable.clone()),
                description: Some(format!("jetsched alerter: {} events", kind.as_str())),
                filter_subject: names.event_subject(kind.as_str(), "*", "*"),
                deliver_policy: DeliverPolicy::New,
                ack_policy: AckPolicy::Explicit,
                ack_wait: Duration::from_secs(30),
                max_ack_pending: 1000,
                ..Default::default()
            })
            .await
            .with_context(|| format!("ensure consumer {durable} on {name}"))?;
        consumers.push(consumer);
    }
    Ok(consumers)
}

/// Leader changes go to every replica through its own ordered consumer ([`leader_events`]).
const LEADER_KIND: EventKind = EventKind::LeaderAcquired;

/// The kinds read through the shared consumers when `rules` are on, one consumer each.
fn shared_kinds(rules: &[Rule]) -> Vec<EventKind> {
    let mut kinds: Vec<EventKind> = Vec::new();
    for &kind in rules.iter().flat_map(|rule| rule.reads()) {
        if kind != LEADER_KIND && !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    kinds
}

fn entry_time(entry: &kv::Entry) -> DateTime<Utc> {
    let nanos = entry.created.unix_timestamp_nanos();
    DateTime::from_timestamp_nanos(i64::try_from(nanos).unwrap_or(i64::MAX))
}

impl Alerter {
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// Consumes events, follows the lease, runs the checks and sends alerts until `shutdown`;
    /// then lets the channels deliver what is queued (bounded) and drains the connection.
    pub async fn run(mut self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let mut pulls = Vec::with_capacity(self.consumers.len());
        for consumer in &self.consumers {
            pulls.push(
                consumer
                    .stream()
                    .max_messages_per_batch(256)
                    .messages()
                    .await
                    .context("start pulling events")?,
            );
        }
        let mut messages = futures::stream::select_all(pulls);
        let mut lease = self.lease.take();
        let mut leaders = self.leader_events.take();
        let mut leaders_retry: Option<tokio::time::Instant> = None;
        let mut checks = tokio::time::interval(self.check_interval);
        checks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut lease_retry: Option<tokio::time::Instant> = None;
        let mut pull_pause = Backoff::new(PULL_RETRY_FIRST, PULL_RETRY_MAX);
        loop {
            let now = Utc::now();
            let deadline =
                [self.throttle.next_deadline(), self.detector.next_deadline()].into_iter().flatten().min();
            // Work made due by the last wake-up (an alert to send now) runs at once: a zero
            // sleep would lose the race against an event stream that is always ready.
            if deadline.is_some_and(|deadline| deadline <= now) {
                self.settle().await;
                continue;
            }
            let sleep = deadline.map(|d| (d - now).to_std().unwrap_or(Duration::ZERO));
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                // Timers before the event stream, so a flood of events cannot starve them.
                _ = async { tokio::time::sleep(sleep.expect("guarded")).await }, if sleep.is_some() => {
                    self.settle().await;
                }
                // Before the watches' retries: while JetStream is down those are always due (each
                // waits out its request's timeout), and the checks are what alert on it.
                _ = checks.tick() => self.check().await,
                next = async { lease.as_mut().expect("guarded").next().await }, if lease.is_some() => match next {
                    Some(Ok(entry)) => self.on_lease_entry(&entry),
                    Some(Err(error)) => {
                        self.metrics.errors.with_label_values(&["lease_watch"]).inc();
                        tracing::warn!(%error, "lease watch error; continuing");
                    }
                    None => {
                        tracing::warn!("lease watch ended; reopening");
                        lease = None;
                        self.readiness.set("lease_watch", false);
                        lease_retry = Some(tokio::time::Instant::now() + Duration::from_secs(1));
                    }
                },
                _ = async { tokio::time::sleep_until(lease_retry.expect("guarded")).await }, if lease.is_none() && lease_retry.is_some() => {
                    lease = self.open_lease_watch().await;
                    lease_retry = lease.is_none().then(|| tokio::time::Instant::now() + Duration::from_secs(1));
                }
                next = async { leaders.as_mut().expect("guarded").next().await }, if leaders.is_some() => match next {
                    Some(Ok(message)) => self.on_leader_event(&message.payload).await,
                    Some(Err(error)) => {
                        self.metrics.errors.with_label_values(&["leader_events"]).inc();
                        tracing::warn!(%error, "leader events error; continuing");
                    }
                    None => {
                        tracing::warn!("leader events ended; reopening");
                        leaders = None;
                        self.readiness.set("leader_events", false);
                        leaders_retry = Some(tokio::time::Instant::now() + Duration::from_secs(1));
                    }
                },
                _ = async { tokio::time::sleep_until(leaders_retry.expect("guarded")).await }, if leaders.is_none() && leaders_retry.is_some() => {
                    let since = self.leader_events_seen + chrono::Duration::milliseconds(1);
                    match leader_events(&self.js, &self.names, since).await {
                        Ok(stream) => {
                            leaders = Some(stream);
                            leaders_retry = None;
                            self.readiness.set("leader_events", true);
                        }
                        Err(error) => {
                            self.metrics.errors.with_label_values(&["leader_events"]).inc();
                            tracing::warn!(error = format!("{error:#}"), "cannot reopen leader events; retrying");
                            leaders_retry = Some(tokio::time::Instant::now() + Duration::from_secs(1));
                        }
                    }
                }
                // Last: always ready under load.
                next = messages.next() => match next {
                    Some(Ok(message)) => {
                        pull_pause.reset();
                        self.on_message(message).await
                    }
                    Some(Err(error)) => {
                        self.metrics.errors.with_label_values(&["pull"]).inc();
                        tracing::warn!(%error, "pulling events failed; continuing");
                        tokio::time::sleep(pull_pause.next_delay()).await;
                    }
                    None => anyhow::bail!("event message stream ended"),
                },
            }
        }
        self.admin_stop.cancel();
        for message in self.throttle.drain(Utc::now()) {
            self.channels.send(message);
        }
        // Dropping the senders lets each channel deliver its queue, then end.
        let Alerter { client, channels, tracker, presence, .. } = self;
        if let Err(error) = presence.stop().await {
            tracing::warn!(%error, "stopping the presence service");
        }
        drop(channels);
        tracker.close();
        if tokio::time::timeout(CHANNEL_GRACE, tracker.wait()).await.is_err() {
            tracing::warn!("alert channels still busy after {CHANNEL_GRACE:?}; leaving queued messages");
        }
        client.drain().await.context("drain NATS connection")?;
        tracing::info!("alerter stopped");
        Ok(())
    }

    /// Watches the lease key (current value first, then changes); `None` on failure (retried).
    async fn open_lease_watch(&mut self) -> Option<kv::Watch> {
        let key = self.names.leader_key();
        let watch = match self.leader.watch_with_history(key).await {
            Ok(watch) => watch,
            Err(error) => {
                self.metrics.errors.with_label_values(&["lease_watch"]).inc();
                tracing::warn!(%error, "cannot watch the leader lease; retrying");
                return None;
            }
        };
        // An empty key delivers nothing: read it once so "no leader" starts counting now.
        match self.leader.entry(key).await {
            Ok(entry) => match jetsched_shared::cas::live(entry) {
                Some(entry) => self.on_lease_entry(&entry),
                None => {
                    self.metrics.leader_present.set(0);
                    self.detector.on_leader(None, Utc::now());
                }
            },
            Err(error) => {
                self.metrics.errors.with_label_values(&["lease_read"]).inc();
                tracing::warn!(%error, "cannot read the leader lease");
            }
        }
        self.readiness.set("lease_watch", true);
        Some(watch)
    }

    fn on_lease_entry(&mut self, entry: &kv::Entry) {
        if entry.operation == kv::Operation::Put {
            let holder = serde_json::from_slice::<LeaderRecord>(&entry.value)
                .map(|record| record.instance)
                .unwrap_or_else(|_| "unknown".to_string());
            self.metrics.leader_present.set(1);
            self.detector.on_leader(Some(&holder), entry_time(entry));
        } else {
            self.metrics.leader_present.set(0);
            self.detector.on_leader(None, entry_time(entry));
        }
    }

    async fn on_message(&mut self, message: jetstream::Message) {
        match serde_json::from_slice::<Event>(&message.payload) {
            Ok(event) => {
                self.metrics.events.with_label_values(&[event.kind.as_str()]).inc();
                let candidates = self.detector.on_event(&event);
                self.raise(candidates).await;
            }
            Err(error) => {
                self.metrics.events.with_label_values(&["undecodable"]).inc();
                tracing::warn!(%error, subject = %message.subject, "ignoring an undecodable event");
            }
        }
        // Acked once its alerts are claimed and queued: a crash before redelivers the event,
        // and the claimed window keeps it from alerting twice.
        if let Err(error) = message.ack().await {
            self.metrics.errors.with_label_values(&["ack"]).inc();
            tracing::warn!(%error, "ack event");
        }
    }

    /// A leader change seen by this replica's own consumer. Changes older than the dedup
    /// window (history replayed at start-up) only count towards flapping; newer ones raise
    /// alerts, which the dedup bucket keeps from repeating what was already sent.
    async fn on_leader_event(&mut self, payload: &[u8]) {
        let event = match serde_json::from_slice::<Event>(payload) {
            Ok(event) => event,
            Err(error) => {
                self.metrics.events.with_label_values(&["undecodable"]).inc();
                tracing::warn!(%error, "ignoring an undecodable leader event");
                return;
            }
        };
        self.metrics.events.with_label_values(&[event.kind.as_str()]).inc();
        self.leader_events_seen = self.leader_events_seen.max(event.time);
        if Utc::now() - event.time > crate::rules::chrono_duration(self.throttle.dedup_window()) {
            self.detector.record_leader_change(event.time);
        } else {
            let candidates = self.detector.on_event(&event);
            self.raise(candidates).await;
        }
    }

    async fn check(&mut self) {
        let now = Utc::now();
        let answer = tokio::time::timeout(Duration::from_secs(2), self.js.query_account()).await;
        let error = match answer {
            Ok(Ok(_)) => None,
            Ok(Err(error)) => Some(error.to_string()),
            Err(_) => Some("no answer within 2s".to_owned()),
        };
        let candidates = self.detector.on_jetstream(now, error.as_deref());
        self.raise(candidates).await;
        if error.is_some() {
            // Every probe below would only wait out its timeout.
            return;
        }
        match probes::queue_depths(&self.js, &self.names).await {
            Ok(depths) => {
                for (queue, depth) in &depths {
                    self.metrics
                        .queue_depth
                        .with_label_values(&[queue])
                        .set(i64::try_from(*depth).unwrap_or(i64::MAX));
                }
                let candidates = self.detector.on_queue_depths(now, &depths);
                self.raise(candidates).await;
            }
            Err(error) => {
                self.metrics.errors.with_label_values(&["queue_depth"]).inc();
                tracing::warn!(error = format!("{error:#}"), "cannot read queue depths");
            }
        }
        match probes::dlq_state(&self.js, &self.names).await {
            Ok(dlq) => {
                self.metrics.dlq_depth.set(i64::try_from(dlq.messages).unwrap_or(i64::MAX));
                self.metrics.dlq_bytes.set(i64::try_from(dlq.bytes).unwrap_or(i64::MAX));
                self.metrics.dlq_max_bytes.set(dlq.max_bytes);
                let candidates = self.detector.on_dlq(now, dlq);
                self.raise(candidates).await;
            }
            Err(error) => {
                self.metrics.errors.with_label_values(&["dlq_depth"]).inc();
                tracing::warn!(error = format!("{error:#}"), "cannot read the dead-letter stream");
            }
        }
    }

    /// Runs time-driven rules, follow-ups of closed windows and due messages.
    async fn settle(&mut self) {
        let now = Utc::now();
        let candidates = self.detector.tick(now);
        self.raise(candidates).await;
        for (candidate, repeats) in self.throttle.due_followups(now) {
            self.claim_and_record(now, &candidate, repeats).await;
        }
        for message in self.throttle.flush(now) {
            self.channels.send(message);
        }
        for (rule, count) in self.throttle.take_rate_limited() {
            self.metrics.suppressed.with_label_values(&[rule.name(), "rate_limit"]).inc_by(count);
        }
    }

    async fn raise(&mut self, candidates: Vec<Candidate>) {
        let now = Utc::now();
        for candidate in candidates {
            self.metrics.raised.with_label_values(&[candidate.rule.name()]).inc();
            match self.throttle.admit(now, &candidate) {
                Admission::Repeat => {
                    self.metrics.suppressed.with_label_values(&[candidate.rule.name(), "dedup"]).inc();
                }
                Admission::Send { repeats } => self.claim_and_record(now, &candidate, repeats).await,
            }
        }
    }

    async fn claim_and_record(&mut self, now: DateTime<Utc>, candidate: &Candidate, repeats: u64) {
        let until = self.throttle.window_until(now);
        match self.store.claim(&DedupKey::of(candidate), now, until).await {
            Ok(Claim::Won) => self.throttle.record_sent(now, candidate, repeats, until),
            Ok(Claim::Lost { until }) => {
                self.metrics.suppressed.with_label_values(&[candidate.rule.name(), "dedup"]).inc();
                self.throttle.adopt(candidate, until);
            }
            Err(error) => {
                // Better a possible duplicate than a lost alert.
                self.metrics.errors.with_label_values(&["dedup_store"]).inc();
                tracing::warn!(
                    error = format!("{error:#}"),
                    rule = candidate.rule.name(),
                    "cannot record the alert window; sending anyway"
                );
                self.throttle.record_sent(now, candidate, repeats, until);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `subject` matches the NATS subject `filter` (`*` one token, `>` the rest).
    fn matches(filter: &str, subject: &str) -> bool {
        let (mut f, mut s) = (filter.split('.'), subject.split('.'));
        loop {
            match (f.next(), s.next()) {
                (Some(">"), Some(_)) => return true,
                (Some(a), Some(b)) if a == "*" || a == b => {}
                (None, None) => return true,
                _ => return false,
            }
        }
    }

    /// Every kind a rule reads reaches the alerter: a shared consumer's filter or the leader
    /// events' takes its events.
    #[test]
    fn every_kind_a_rule_reads_is_consumed() {
        let names = Names::default();
        for rule in Rule::ALL {
            let mut filters: Vec<String> = shared_kinds(&[rule])
                .into_iter()
                .map(|kind| names.event_subject(kind.as_str(), "*", "*"))
                .collect();
            filters.push(names.event_subject(LEADER_KIND.as_str(), "*", "*"));
            for kind in rule.reads() {
                let subject = names.event_subject(kind.as_str(), "billing", "report");
                assert!(
                    filters.iter().any(|f| matches(f, &subject)),
                    "{} reads {}, which no consumer takes ({filters:?})",
                    rule.name(),
                    kind.as_str()
                );
            }
        }
    }

    #[test]
    fn only_what_enabled_rules_read_is_consumed_once() {
        let kinds =
            |rules: &[Rule]| -> Vec<&str> { shared_kinds(rules).iter().map(|k| k.as_str()).collect() };
        assert_eq!(kinds(&[Rule::RunDead, Rule::NoLeader]), ["run.dead"]);
        assert_eq!(kinds(&[Rule::LeaderChanged, Rule::LeaderFlapping]), Vec::<&str>::new());
        assert_eq!(
            kinds(&Rule::ALL),
            [
                "run.failed",
                "run.dead",
                "fire.dispatched",
                "breaker.opened",
                "breaker.closed",
                "scheduler.clock_skew"
            ]
        );
    }
}
