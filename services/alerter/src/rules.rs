//! Alert rules as pure code: the rules, what each reads, their thresholds and the candidate
//! a firing rule raises. No I/O and no clock: every function takes `now`. Which events and
//! observations raise which alert is [`detector`]; what happens to a raised alert
//! (de-duplication, rate limit, grouping) is [`throttle`].

pub mod detector;
pub mod throttle;

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::ValueEnum;
use jetsched_shared::alert::Severity;
use jetsched_shared::wire::EventKind;

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
    /// A run has waited for a slot of a concurrency key longer than the threshold; once per
    /// episode of the key, until no run has waited that long.
    LimitWaiting,
    /// A task with `after` gave up waiting for its parents' runs (`after.expired`).
    AfterExpired,
}

impl Rule {
    pub const ALL: [Rule; 14] = [
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
        Rule::LimitWaiting,
        Rule::AfterExpired,
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
            Rule::LimitWaiting => "limit_waiting",
            Rule::AfterExpired => "after_expired",
        }
    }

    pub fn severity(self) -> Severity {
        match self {
            Rule::RunFailed
            | Rule::FireLag
            | Rule::DlqGrowing
            | Rule::BreakerOpen
            | Rule::ClockSkew
            | Rule::LimitWaiting
            | Rule::AfterExpired => Severity::Warning,
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
            Rule::AfterExpired => &[EventKind::AfterExpired],
            Rule::QueueBacklog
            | Rule::NoLeader
            | Rule::DlqGrowing
            | Rule::DlqFull
            | Rule::JetstreamUnavailable
            | Rule::LimitWaiting => &[],
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
    /// A run waiting this long for a slot of a concurrency key alerts.
    pub limit_wait: Duration,
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
            limit_wait: Duration::from_secs(300),
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

/// What a check of one concurrency key with waiting runs saw: how many wait and the run
/// that has waited longest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitWait {
    /// The concurrency key (as `jetsched limits` shows it).
    pub key: String,
    pub waiting: usize,
    pub limit: u32,
    pub in_use: usize,
    /// The longest waiting run: when it started waiting, its task and execution id.
    pub since: DateTime<Utc>,
    pub namespace: String,
    pub task_id: String,
    pub execution_id: String,
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

/// A std duration as a chrono one, capped at 100 years so instant arithmetic cannot overflow.
pub(crate) fn chrono_duration(d: Duration) -> chrono::Duration {
    const CAP: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    chrono::Duration::from_std(d.min(CAP)).unwrap_or(chrono::Duration::MAX)
}
