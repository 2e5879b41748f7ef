//! Alert rules as pure code: which events and observations raise which alert. No I/O and no
//! clock: every function takes `now`. What happens to a raised alert (de-duplication, rate
//! limit, grouping) is [`throttle`].

pub mod throttle;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::ValueEnum;
use jetsched_shared::alert::Severity;
use jetsched_shared::names::SYSTEM_NAMESPACE;
use jetsched_shared::wire::{Event, EventKind, format_time};

/// Every rule of the alerter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum Rule {
    /// A run failed for good (`run.failed`).
    RunFailed,
    /// A run was dead-lettered (`run.dead`).
    RunDead,
    /// A queue's consumer has more pending dispatches than the threshold for the duration.
    QueueBacklog,
    /// A scheduler replica acquired the lease (`leader.acquired`).
    LeaderChanged,
    /// The lease key has been absent for longer than the threshold.
    NoLeader,
    /// A fire was dispatched later than the threshold after its nominal time.
    FireLag,
    /// More leader changes than allowed within the window.
    LeaderFlapping,
    /// The dead-letter stream grew since the previous check.
    DlqGrowing,
    /// The dead-letter stream is nearly full (it then refuses new dead letters).
    DlqFull,
    /// A circuit breaker opened (`breaker.opened`); once per episode, until it closes.
    BreakerOpen,
    /// A scheduler replica's clock is off the server's by more than its maximum skew
    /// (`scheduler.clock_skew`).
    ClockSkew,
    /// JetStream does not answer (its servers disabled it, e.g. on a full disk, or none is
    /// reachable): nothing can be dispatched or recorded; once per episode.
    JetstreamUnavailable,
}

impl Rule {
    pub const ALL: [Rule; 12] = [
        Rule::RunFailed,
        Rule::RunDead,
        Rule::QueueBacklog,
        Rule::LeaderChanged,
        Rule::NoLeader,
        Rule::FireLag,
        Rule::LeaderFlapping,
        Rule::DlqGrowing,
        Rule::DlqFull,
        Rule::BreakerOpen,
        Rule::ClockSkew,
        Rule::JetstreamUnavailable,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Rule::RunFailed => "run_failed",
            Rule::RunDead => "run_dead",
            Rule::QueueBacklog => "queue_backlog",
            Rule::LeaderChanged => "leader_changed",
            Rule::NoLeader => "no_leader",
            Rule::FireLag => "fire_lag",
            Rule::LeaderFlapping => "leader_flapping",
            Rule::DlqGrowing => "dlq_growing",
            Rule::DlqFull => "dlq_full",
            Rule::BreakerOpen => "breaker_open",
            Rule::ClockSkew => "clock_skew",
            Rule::JetstreamUnavailable => "jetstream_unavailable",
        }
    }

    pub fn severity(self) -> Severity {
        match self {
            Rule::RunFailed | Rule::FireLag | Rule::DlqGrowing | Rule::BreakerOpen | Rule::ClockSkew => {
                Severity::Warning
            }
            Rule::RunDead
            | Rule::QueueBacklog
            | Rule::LeaderChanged
            | Rule::LeaderFlapping
            | Rule::DlqFull => Severity::Critical,
            Rule::NoLeader | Rule::JetstreamUnavailable => Severity::Fatal,
        }
    }

    /// The event kinds the rule reads from the events stream; none for the rules fed by the
    /// checks or the lease. The alerter's event consumers are derived from these, so a rule
    /// never reads a kind nobody consumes.
    pub fn reads(self) -> &'static [EventKind] {
        match self {
            Rule::RunFailed => &[EventKind::RunFailed],
            Rule::RunDead => &[EventKind::RunDead],
            Rule::FireLag => &[EventKind::FireDispatched],
            Rule::LeaderChanged | Rule::LeaderFlapping => &[EventKind::LeaderAcquired],
            // A breaker's episode ends when it closes.
            Rule::BreakerOpen => &[EventKind::BreakerOpened, EventKind::BreakerClosed],
            Rule::ClockSkew => &[EventKind::SchedulerClockSkew],
            Rule::QueueBacklog
            | Rule::NoLeader
            | Rule::DlqGrowing
            | Rule::DlqFull
            | Rule::JetstreamUnavailable => &[],
        }
    }
}

/// What the subject of a system alert is called (the `task_id` of the alert).
pub(crate) const SCHEDULER_SUBJECT: &str = "scheduler";
pub(crate) const DLQ_SUBJECT: &str = "dlq";
pub(crate) const JETSTREAM_SUBJECT: &str = "jetstream";

/// Thresholds of the rules and which rules are on.
#[derive(Debug, Clone)]
pub struct Thresholds {
    pub enabled: Vec<Rule>,
    /// Pending dispatches on one queue that count as a backlog.
    pub backlog_threshold: u64,
    /// How long the backlog must last.
    pub backlog_for: Duration,
    /// How long without a lease holder is fatal.
    pub no_leader_after: Duration,
    /// Dispatch later than this after the nominal time.
    pub fire_lag: Duration,
    /// More than this many leader changes within `flap_window` is flapping.
    pub flap_changes: usize,
    pub flap_window: Duration,
    /// Share of the dead-letter stream's byte limit that counts as nearly full (0..=1).
    pub dlq_full_ratio: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            enabled: Rule::ALL.to_vec(),
            backlog_threshold: 1000,
            backlog_for: Duration::from_secs(60),
            no_leader_after: Duration::from_secs(30),
            fire_lag: Duration::from_secs(5),
            flap_changes: 3,
            flap_window: Duration::from_secs(600),
            dlq_full_ratio: 0.9,
        }
    }
}

/// What a check of the dead-letter stream saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DlqState {
    pub messages: u64,
    pub bytes: u64,
    /// The stream's byte limit; zero or less when unlimited.
    pub max_bytes: i64,
}

/// A rule that fired, before de-duplication.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub rule: Rule,
    pub namespace: String,
    pub task_id: String,
    pub time: DateTime<Utc>,
    pub summary: String,
    pub details: BTreeMap<String, String>,
}

impl Candidate {
    fn new(rule: Rule, namespace: &str, task_id: &str, time: DateTime<Utc>, summary: String) -> Candidate {
        Candidate {
            rule,
            namespace: namespace.to_string(),
            task_id: task_id.to_string(),
            time,
            summary,
            details: BTreeMap::new(),
        }
    }

    fn detail(mut self, key: &str, value: impl ToString) -> Candidate {
        self.details.insert(key.to_string(), value.to_string());
        self
    }
}

/// The `breaker_open` alert of a `breaker.opened` event. Its subject is the event's: the task
/// for a task's own breaker, `<namespace>/<key>` for a namespace's named one, `=shared/<key>`
/// for a key shared by every namespace.
fn breaker_open(event: &Event) -> Candidate {
    let (ns, task) = (event.namespace.as_str(), event.task_id.as_str());
    let name = event.key.as_deref().unwrap_or(task);
    let rate = event.failure_rate.map(|r| format!("{:.0}%", r * 100.0)).unwrap_or_else(|| "?".into());
    let counts = match (event.failures, event.runs) {
        (Some(failures), Some(runs)) => format!(" ({failures} of {runs} attempts)"),
        _ => String::new(),
    };
    let until = event.open_until.map(|t| format!("; probes after {}", format_time(t))).unwrap_or_default();
    let summary = format!("circuit breaker {name} opened: failure rate {rate}{counts}{until}");
    let mut candidate = Candidate::new(Rule::BreakerOpen, ns, task, event.time, summary);
    for (key, value) in [
        ("key", event.key.clone()),
        ("failure_rate", event.failure_rate.map(|r| r.to_string())),
        ("failures", event.failures.map(|n| n.to_string())),
        ("runs", event.runs.map(|n| n.to_string())),
        ("open_until", event.open_until.map(format_time)),
    ] {
        if let Some(value) = value {
            candidate = candidate.detail(key, value);
        }
    }
    candidate
}

/// Which breaker a `breaker.*` event is about: its bucket key when it carries one.
fn breaker_of(event: &Event) -> (String, String) {
    match &event.key {
        Some(key) => (String::new(), key.clone()),
        None => (event.namespace.clone(), event.task_id.clone()),
    }
}

/// A std duration as a chrono one, capped at 100 years so instant arithmetic cannot overflow.
pub(crate) fn chrono_duration(d: Duration) -> chrono::Duration {
    const CAP: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    chrono::Duration::from_std(d.min(CAP)).unwrap_or(chrono::Duration::MAX)
}

/// Turns events and observations into candidates. Condition rules (backlog, no leader) fire
/// once per episode: again only after the condition cleared.
#[derive(Debug)]
pub struct Detector {
    thresholds: Thresholds,
    leader_changes: VecDeque<DateTime<Utc>>,
    /// Per queue: since when it is over the threshold, and whether that episode alerted.
    backlog: HashMap<String, (DateTime<Utc>, bool)>,
    /// Since when no lease holder is seen, and whether that episode alerted.
    leaderless: Option<(DateTime<Utc>, bool)>,
    dlq_depth: Option<u64>,
    /// Whether the current nearly-full episode alerted.
    dlq_full: bool,
    /// JetStream has not answered since its alert.
    jetstream_down: bool,
    /// Breakers (the bucket key their events carry, else `(namespace, id)` of the events) open
    /// since their alert: a breaker that re-opens after a failed probe does not alert again
    /// until it has closed. By key, since a task's own breaker and a named one of its namespace
    /// may have events about the same `(namespace, id)`.
    open_breakers: HashSet<(String, String)>,
}

impl Detector {
    pub fn new(thresholds: Thresholds) -> Detector {
        Detector {
            thresholds,
            leader_changes: VecDeque::new(),
            backlog: HashMap::new(),
            leaderless: None,
            dlq_depth: None,
            dlq_full: false,
            jetstream_down: false,
            open_breakers: HashSet::new(),
        }
    }

    fn on(&self, rule: Rule) -> bool {
        self.thresholds.enabled.contains(&rule)
    }

    /// An event from the events stream.
    pub fn on_event(&mut self, event: &Event) -> Vec<Candidate> {
        let mut out = Vec::new();
        let (ns, task) = (event.namespace.as_str(), event.task_id.as_str());
        let run_details = |c: Candidate| {
            let mut c = c;
            if let Some(id) = &event.execution_id {
                c = c.detail("execution_id", id);
            }
            if let Some(attempt) = event.attempt {
                c = c.detail("attempt", attempt);
            }
            if let Some(worker) = &event.worker {
                c = c.detail("worker", worker);
            }
            if let Some(error) = &event.error {
                c = c.detail("error", error);
            }
            if let Some(reason) = &event.reason {
                c = c.detail("reason", reason);
            }
            c
        };
        match event.kind {
            EventKind::RunFailed if self.on(Rule::RunFailed) => {
                let what = event.error.as_deref().or(event.reason.as_deref()).unwrap_or("no error given");
                let summary = format!("run of {ns}/{task} failed: {what}");
                out.push(run_details(Candidate::new(Rule::RunFailed, ns, task, event.time, summary)));
            }
            EventKind::RunDead if self.on(Rule::RunDead) => {
                let attempts = event.attempt.map(|a| format!(" after {a} attempt(s)")).unwrap_or_default();
                let reason = event.reason.as_deref().unwrap_or("retries exhausted");
                let summary = format!("run of {ns}/{task} dead-lettered{attempts}: {reason}");
                out.push(run_details(Candidate::new(Rule::RunDead, ns, task, event.time, summary)));
            }
            EventKind::FireDispatched if self.on(Rule::FireLag) => {
                if let Some(nominal) = event.nominal_time {
                    let lag = event.time - nominal;
                    if lag > chrono_duration(self.thresholds.fire_lag) {
                        let ms = lag.num_milliseconds();
                        let summary = format!(
                            "fire of {ns}/{task} dispatched {:.3}s after its nominal time (threshold {:?})",
                            ms as f64 / 1000.0,
                            self.thresholds.fire_lag
                        );
                        out.push(
                            Candidate::new(Rule::FireLag, ns, task, event.time, summary)
                                .detail("lag_ms", ms)
                                .detail("nominal_time", format_time(nominal)),
                        );
                    }
                }
            }
            // Inserted only when the rule is on; a breaker already open is the same episode.
            EventKind::BreakerOpened
                if self.on(Rule::BreakerOpen) && self.open_breakers.insert(breaker_of(event)) =>
            {
                out.push(breaker_open(event));
            }
            EventKind::SchedulerClockSkew if self.on(Rule::ClockSkew) => {
                // One alert subject per replica: `_system/<instance>`.
                let instance = event.instance.as_deref().unwrap_or(SCHEDULER_SUBJECT);
                let offset = event.reason.as_deref().unwrap_or("offset unknown");
                let summary =
                    format!("scheduler {instance}: clock skewed ({offset}); it campaigns one lease later");
                out.push(
                    Candidate::new(Rule::ClockSkew, SYSTEM_NAMESPACE, instance, event.time, summary)
                        .detail("instance", instance),
                );
            }
            EventKind::BreakerClosed => {
                self.open_breakers.remove(&breaker_of(event));
            }
            EventKind::LeaderAcquired => {
                let instance = event.instance.as_deref().unwrap_or("unknown");
                let term = event.term.map(|t| t.to_string()).unwrap_or_else(|| "?".to_string());
                if self.on(Rule::LeaderChanged) {
                    let summary = format!("scheduler leader is now {instance} (term {term})");
                    out.push(
                        Candidate::new(
                            Rule::LeaderChanged,
                            SYSTEM_NAMESPACE,
                            SCHEDULER_SUBJECT,
                            event.time,
                            summary,
                        )
                        .detail("instance", instance)
                        .detail("term", &term),
                    );
                }
                // (The lease bucket, not this event, ends a leaderless episode: events may be
                // replayed history.)
                let changes = self.record_leader_change(event.time);
                if self.on(Rule::LeaderFlapping) && changes > self.thresholds.flap_changes {
                    let summary = format!(
                        "scheduler leadership changed {changes} times within {:?} (more than {})",
                        self.thresholds.flap_window, self.thresholds.flap_changes
                    );
                    out.push(
                        Candidate::new(
                            Rule::LeaderFlapping,
                            SYSTEM_NAMESPACE,
                            SCHEDULER_SUBJECT,
                            event.time,
                            summary,
                        )
                        .detail("changes", changes)
                        .detail("latest_instance", instance),
                    );
                }
            }
            _ => {}
        }
        out
    }

    /// Remembers a leader change for the flapping window without raising anything (history
    /// replayed at start-up); returns the changes within the window ending at `time`.
    pub fn record_leader_change(&mut self, time: DateTime<Utc>) -> usize {
        let at = self.leader_changes.partition_point(|t| *t <= time);
        self.leader_changes.insert(at, time);
        let latest = self.leader_changes.back().copied().unwrap_or(time);
        let window_start = latest - chrono_duration(self.thresholds.flap_window);
        while self.leader_changes.front().is_some_and(|t| *t < window_start) {
            self.leader_changes.pop_front();
        }
        self.leader_changes
            .iter()
            .filter(|t| **t >= time - chrono_duration(self.thresholds.flap_window) && **t <= time)
            .count()
    }

    /// The lease key: `Some(instance)` while held, `None` once deleted, purged or expired.
    /// `since` is when it disappeared (the marker's time, or now when unknown).
    pub fn on_leader(&mut self, holder: Option<&str>, since: DateTime<Utc>) {
        match holder {
            Some(_) => self.leaderless = None,
            None => {
                if self.leaderless.is_none() {
                    self.leaderless = Some((since, false));
                }
            }
        }
    }

    /// Pending dispatch counts per queue, read from the queue consumers.
    pub fn on_queue_depths(&mut self, now: DateTime<Utc>, depths: &[(String, u64)]) -> Vec<Candidate> {
        let mut out = Vec::new();
        let threshold = self.thresholds.backlog_threshold;
        self.backlog.retain(|queue, _| depths.iter().any(|(q, d)| q == queue && *d > threshold));
        if !self.on(Rule::QueueBacklog) {
            return out;
        }
        let duration = chrono_duration(self.thresholds.backlog_for);
        for (queue, depth) in depths {
            if *depth <= threshold {
                continue;
            }
            let (since, alerted) = self.backlog.entry(queue.clone()).or_insert((now, false));
            if !*alerted && now - *since >= duration {
                *alerted = true;
                let summary = format!(
                    "queue {queue} has {depth} pending dispatches (over {threshold} for {}s)",
                    (now - *since).num_seconds()
                );
                out.push(
                    Candidate::new(Rule::QueueBacklog, SYSTEM_NAMESPACE, queue, now, summary)
                        .detail("queue", queue)
                        .detail("pending", depth)
                        .detail("threshold", threshold),
                );
            }
        }
        out
    }

    /// A check of the dead-letter stream: growth since the previous check, and how full it is.
    pub fn on_dlq(&mut self, now: DateTime<Utc>, dlq: DlqState) -> Vec<Candidate> {
        let mut out = Vec::new();
        let depth = dlq.messages;
        let previous = self.dlq_depth.replace(depth);
        if let Some(previous) = previous
            && depth > previous
            && self.on(Rule::DlqGrowing)
        {
            let summary = format!("dead-letter stream grew from {previous} to {depth} entries");
            out.push(
                Candidate::new(Rule::DlqGrowing, SYSTEM_NAMESPACE, DLQ_SUBJECT, now, summary)
                    .detail("depth", depth)
                    .detail("previous", previous),
            );
        }
        let full =
            dlq.max_bytes > 0 && dlq.bytes as f64 >= self.thresholds.dlq_full_ratio * dlq.max_bytes as f64;
        if !full {
            self.dlq_full = false;
        } else if !self.dlq_full && self.on(Rule::DlqFull) {
            self.dlq_full = true;
            let percent = 100.0 * dlq.bytes as f64 / dlq.max_bytes as f64;
            let summary = format!(
                "dead-letter stream is {percent:.0}% full ({} of {} bytes): new dead letters will be refused",
                dlq.bytes, dlq.max_bytes
            );
            out.push(
                Candidate::new(Rule::DlqFull, SYSTEM_NAMESPACE, DLQ_SUBJECT, now, summary)
                    .detail("bytes", dlq.bytes)
                    .detail("max_bytes", dlq.max_bytes)
                    .detail("depth", depth),
            );
        }
        out
    }

    /// A check of JetStream itself: `error` when it did not answer. One alert per episode.
    pub fn on_jetstream(&mut self, now: DateTime<Utc>, error: Option<&str>) -> Vec<Candidate> {
        let Some(error) = error else {
            self.jetstream_down = false;
            return Vec::new();
        };
        if self.jetstream_down || !self.on(Rule::JetstreamUnavailable) {
            return Vec::new();
        }
        self.jetstream_down = true;
        let summary = "JetStream does not answer: nothing can be dispatched, recorded or stored \
                       (a full disk disables it until its server restarts)";
        vec![
            Candidate::new(
                Rule::JetstreamUnavailable,
                SYSTEM_NAMESPACE,
                JETSTREAM_SUBJECT,
                now,
                summary.to_owned(),
            )
            .detail("error", error),
        ]
    }

    /// Time-driven rules (no leader for too long).
    pub fn tick(&mut self, now: DateTime<Utc>) -> Vec<Candidate> {
        let after = chrono_duration(self.thresholds.no_leader_after);
        match &mut self.leaderless {
            Some((since, alerted))
                if !*alerted
                    && now - *since >= after
                    && self.thresholds.enabled.contains(&Rule::NoLeader) =>
            {
                *alerted = true;
                let summary = format!(
                    "no scheduler holds the leader lease since {} ({}s); nothing is being dispatched",
                    format_time(*since),
                    (now - *since).num_seconds()
                );
                vec![
                    Candidate::new(Rule::NoLeader, SYSTEM_NAMESPACE, SCHEDULER_SUBJECT, now, summary)
                        .detail("since", format_time(*since)),
                ]
            }
            _ => Vec::new(),
        }
    }

    /// When [`Detector::tick`] has something to do next.
    pub fn next_deadline(&self) -> Option<DateTime<Utc>> {
        match self.leaderless {
            Some((since, false)) if self.on(Rule::NoLeader) => {
                Some(since + chrono_duration(self.thresholds.no_leader_after))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + s, 0).unwrap()
    }

    fn event(kind: EventKind, time: DateTime<Utc>) -> Event {
        Event { time, ..Event::new(kind, "billing", "report") }
    }

    /// Every event kind (the match stops compiling when a kind is added).
    fn every_kind() -> Vec<EventKind> {
        use EventKind::*;
        let all = [
            TaskRegistered,
            TaskUpdated,
            TaskDeleted,
            TaskPaused,
            TaskResumed,
            TaskRejected,
            FireDispatched,
            FireSkipped,
            FireMissed,
            RunStarted,
            RunSucceeded,
            RunFailed,
            RunRetrying,
            RunDead,
            RunSkipped,
            BreakerOpened,
            BreakerHalfOpened,
            BreakerClosed,
            LeaderAcquired,
            LeaderLost,
            SchedulerClockSkew,
        ];
        for kind in all {
            match kind {
                TaskRegistered | TaskUpdated | TaskDeleted | TaskPaused | TaskResumed | TaskRejected
                | FireDispatched | FireSkipped | FireMissed | RunStarted | RunSucceeded | RunFailed
                | RunRetrying | RunDead | RunSkipped | BreakerOpened | BreakerHalfOpened | BreakerClosed
                | LeaderAcquired | LeaderLost | SchedulerClockSkew => {}
            }
        }
        all.to_vec()
    }

    /// What [`Rule::reads`] declares is what the detector reacts to: every kind that raises a
    /// rule's alert is one it reads (the consumers are derived from those), and every kind it
    /// reads raises it, except a breaker's closing, which ends an episode.
    #[test]
    fn each_rule_raises_on_the_kinds_it_reads_and_no_other() {
        for rule in Rule::ALL {
            for kind in every_kind() {
                let mut d = Detector::new(Thresholds {
                    enabled: vec![rule],
                    flap_changes: 1,
                    fire_lag: Duration::from_secs(1),
                    ..Thresholds::default()
                });
                let event = Event {
                    nominal_time: Some(at(-60)),
                    instance: Some("s1".into()),
                    key: Some("task.billing.report".into()),
                    ..event(kind, at(0))
                };
                let raised = (0..3).flat_map(|_| d.on_event(&event)).any(|c| c.rule == rule);
                let reads = rule.reads().contains(&kind);
                assert!(!raised || reads, "{} raises on {} but does not read it", rule.name(), kind.as_str());
                assert!(
                    raised || !reads || kind == EventKind::BreakerClosed,
                    "{} reads {} but never raises on it",
                    rule.name(),
                    kind.as_str()
                );
            }
        }
    }

    #[test]
    fn an_open_breaker_alerts_once_per_episode_until_it_closes() {
        let mut d = Detector::new(Thresholds::default());
        let opened = |s: i64| Event {
            key: Some("key.billing.pay".into()),
            failure_rate: Some(0.75),
            failures: Some(3),
            runs: Some(4),
            open_until: Some(at(s + 30)),
            ..Event { time: at(s), ..Event::new(EventKind::BreakerOpened, "billing", "pay") }
        };
        let out = d.on_event(&opened(0));
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].rule, out[0].rule.severity()), (Rule::BreakerOpen, Severity::Warning));
        assert_eq!((out[0].namespace.as_str(), out[0].task_id.as_str()), ("billing", "pay"));
        assert!(out[0].summary.contains("75%") && out[0].summary.contains("3 of 4"), "{}", out[0].summary);
        assert_eq!(out[0].details.get("key").map(String::as_str), Some("key.billing.pay"));
        // Re-opened after a failed probe: the same episode.
        assert!(d.on_event(&event(EventKind::BreakerHalfOpened, at(31))).is_empty());
        assert!(d.on_event(&opened(32)).is_empty());
        // Another breaker alerts on its own: one of another namespace, and the own breaker of a
        // task whose id is the key (its events are about the same namespace and id).
        let other = Event { key: Some("key.demo.pay".into()), namespace: "demo".into(), ..opened(33) };
        assert_eq!(d.on_event(&other).len(), 1);
        let own = Event { key: Some("task.billing.pay".into()), ..opened(33) };
        assert_eq!(d.on_event(&own).len(), 1);
        // Closed: the next opening is a new episode.
        let closed = Event {
            key: Some("key.billing.pay".into()),
            ..Event { time: at(40), ..Event::new(EventKind::BreakerClosed, "billing", "pay") }
        };
        d.on_event(&closed);
        assert_eq!(d.on_event(&opened(50)).len(), 1);
        // Events without a key (from before keys were told) are told apart by namespace and id.
        let keyless = |kind| Event { key: None, ..Event { kind, ..opened(60) } };
        d.on_event(&keyless(EventKind::BreakerClosed));
        assert_eq!(d.on_event(&keyless(EventKind::BreakerOpened)).len(), 1);
        assert!(d.on_event(&keyless(EventKind::BreakerOpened)).is_empty());
        let mut off = Detector::new(Thresholds { enabled: vec![Rule::RunFailed], ..Thresholds::default() });
        assert!(off.on_event(&opened(0)).is_empty());
    }

    #[test]
    fn a_skewed_scheduler_clock_raises_a_warning_per_replica() {
        let mut d = Detector::new(Thresholds::default());
        let skewed = |instance: &str| Event {
            instance: Some(instance.into()),
            reason: Some("local clock minus server clock: +5.000 s".into()),
            ..event(EventKind::SchedulerClockSkew, at(0))
        };
        let out = d.on_event(&skewed("sched-a"));
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].rule.name(), out[0].rule.severity()), ("clock_skew", Severity::Warning));
        assert_eq!((out[0].namespace.as_str(), out[0].task_id.as_str()), (SYSTEM_NAMESPACE, "sched-a"));
        assert!(out[0].summary.contains("+5.000 s"), "{}", out[0].summary);
        assert_eq!(d.on_event(&skewed("sched-b"))[0].task_id, "sched-b");
        let mut off = Detector::new(Thresholds { enabled: vec![Rule::RunFailed], ..Thresholds::default() });
        assert!(off.on_event(&skewed("sched-a")).is_empty());
    }

    #[test]
    fn run_events_raise_their_rules() {
        let mut d = Detector::new(Thresholds::default());
        let failed = Event { error: Some("HTTP 500".into()), ..event(EventKind::RunFailed, at(0)) };
        let out = d.on_event(&failed);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].rule, Rule::RunFailed);
        assert!(out[0].summary.contains("HTTP 500"), "{}", out[0].summary);
        let out = d.on_event(&Event { attempt: Some(4), ..event(EventKind::RunDead, at(0)) });
        assert_eq!(out[0].rule, Rule::RunDead);
        assert_eq!(out[0].details["attempt"], "4");
        assert!(d.on_event(&event(EventKind::RunSucceeded, at(0))).is_empty());
        assert!(d.on_event(&event(EventKind::RunRetrying, at(0))).is_empty());
    }

    #[test]
    fn disabled_rules_stay_quiet() {
        let mut d = Detector::new(Thresholds { enabled: vec![Rule::RunDead], ..Thresholds::default() });
        assert!(d.on_event(&event(EventKind::RunFailed, at(0))).is_empty());
        assert_eq!(d.on_event(&event(EventKind::RunDead, at(0))).len(), 1);
    }

    #[test]
    fn fire_lag_over_the_threshold_only() {
        let mut d = Detector::new(Thresholds { fire_lag: Duration::from_secs(5), ..Thresholds::default() });
        let on_time = Event { nominal_time: Some(at(0)), ..event(EventKind::FireDispatched, at(1)) };
        assert!(d.on_event(&on_time).is_empty());
        let late = Event { nominal_time: Some(at(0)), ..event(EventKind::FireDispatched, at(6)) };
        let out = d.on_event(&late);
        assert_eq!(out[0].rule, Rule::FireLag);
        assert_eq!(out[0].details["lag_ms"], "6000");
    }

    #[test]
    fn flapping_counts_changes_in_the_window() {
        let mut d = Detector::new(Thresholds {
            flap_changes: 2,
            flap_window: Duration::from_secs(60),
            ..Thresholds::default()
        });
        let acquired = |s| Event { instance: Some("s1".into()), ..event(EventKind::LeaderAcquired, at(s)) };
        assert_eq!(d.on_event(&acquired(0)).len(), 1); // leader_changed only
        assert_eq!(d.on_event(&acquired(10)).len(), 1);
        let out = d.on_event(&acquired(20));
        assert_eq!(
            out.iter().map(|c| c.rule).collect::<Vec<_>>(),
            [Rule::LeaderChanged, Rule::LeaderFlapping]
        );
        // Two minutes later the window holds one change again.
        assert_eq!(d.on_event(&acquired(200)).len(), 1);
    }

    #[test]
    fn replayed_leader_changes_count_towards_flapping() {
        let mut d = Detector::new(Thresholds {
            flap_changes: 2,
            flap_window: Duration::from_secs(60),
            ..Thresholds::default()
        });
        assert_eq!(d.record_leader_change(at(0)), 1);
        assert_eq!(d.record_leader_change(at(10)), 2);
        let acquired = Event { instance: Some("s2".into()), ..event(EventKind::LeaderAcquired, at(20)) };
        let rules: Vec<Rule> = d.on_event(&acquired).into_iter().map(|c| c.rule).collect();
        assert_eq!(rules, [Rule::LeaderChanged, Rule::LeaderFlapping]);
    }

    #[test]
    fn no_leader_fires_once_per_episode_at_its_deadline() {
        let mut d =
            Detector::new(Thresholds { no_leader_after: Duration::from_secs(10), ..Thresholds::default() });
        d.on_leader(None, at(0));
        assert_eq!(d.next_deadline(), Some(at(10)));
        assert!(d.tick(at(9)).is_empty());
        assert_eq!(d.tick(at(10))[0].rule, Rule::NoLeader);
        assert!(d.tick(at(20)).is_empty());
        assert_eq!(d.next_deadline(), None);
        d.on_leader(Some("s1"), at(21));
        d.on_leader(None, at(30));
        assert_eq!(d.tick(at(40)).len(), 1);
    }

    #[test]
    fn backlog_must_last_before_it_alerts() {
        let mut d = Detector::new(Thresholds {
            backlog_threshold: 10,
            backlog_for: Duration::from_secs(30),
            ..Thresholds::default()
        });
        let q = |n| vec![("default".to_string(), n)];
        assert!(d.on_queue_depths(at(0), &q(11)).is_empty());
        assert!(d.on_queue_depths(at(29), &q(50)).is_empty());
        assert_eq!(d.on_queue_depths(at(30), &q(50))[0].rule, Rule::QueueBacklog);
        assert!(d.on_queue_depths(at(40), &q(50)).is_empty());
        // Cleared, then over again: a new episode with its own duration.
        assert!(d.on_queue_depths(at(41), &q(5)).is_empty());
        assert!(d.on_queue_depths(at(42), &q(50)).is_empty());
        assert_eq!(d.on_queue_depths(at(72), &q(50)).len(), 1);
    }

    fn dlq(messages: u64, bytes: u64) -> DlqState {
        DlqState { messages, bytes, max_bytes: 1000 }
    }

    #[test]
    fn dlq_growth_compares_with_the_previous_check() {
        let mut d = Detector::new(Thresholds::default());
        assert!(d.on_dlq(at(0), dlq(3, 30)).is_empty()); // first sight: no baseline
        assert!(d.on_dlq(at(1), dlq(3, 30)).is_empty());
        assert_eq!(d.on_dlq(at(2), dlq(5, 50))[0].details["previous"], "3");
        assert!(d.on_dlq(at(3), dlq(2, 20)).is_empty());
    }

    #[test]
    fn jetstream_unavailable_alerts_once_per_episode() {
        let mut d = Detector::new(Thresholds::default());
        assert!(d.on_jetstream(at(0), None).is_empty());
        let out = d.on_jetstream(at(1), Some("jetstream not enabled"));
        assert_eq!((out[0].rule.name(), out[0].rule.severity()), ("jetstream_unavailable", Severity::Fatal));
        assert_eq!(out[0].details["error"], "jetstream not enabled");
        assert!(d.on_jetstream(at(2), Some("timed out")).is_empty());
        assert!(d.on_jetstream(at(3), None).is_empty());
        assert_eq!(d.on_jetstream(at(4), Some("timed out")).len(), 1);
    }

    #[test]
    fn dlq_nearly_full_alerts_once_per_episode() {
        let mut d = Detector::new(Thresholds { dlq_full_ratio: 0.9, ..Thresholds::default() });
        assert!(d.on_dlq(at(0), dlq(10, 899)).is_empty());
        let out = d.on_dlq(at(1), dlq(10, 900));
        assert_eq!(out.iter().map(|c| c.rule).collect::<Vec<_>>(), [Rule::DlqFull]);
        assert!(d.on_dlq(at(2), dlq(10, 950)).is_empty());
        assert!(d.on_dlq(at(3), dlq(5, 500)).is_empty());
        assert_eq!(d.on_dlq(at(4), dlq(5, 990)).iter().filter(|c| c.rule == Rule::DlqFull).count(), 1);
        // Unlimited streams are never full.
        let mut d = Detector::new(Thresholds::default());
        assert!(d.on_dlq(at(0), DlqState { messages: 1, bytes: u64::MAX, max_bytes: -1 }).is_empty());
    }
}
