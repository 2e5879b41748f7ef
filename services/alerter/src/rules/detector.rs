//! The rules' detector: turns events, lease changes and the checks' observations into
//! candidates, as pure code (every function takes `now`). Condition rules (backlog, no leader,
//! a nearly full dead-letter stream, an unavailable JetStream, an open breaker) fire once per
//! episode.

use std::collections::{HashMap, HashSet, VecDeque};

use chrono::{DateTime, Utc};
use jetsched_shared::names::SYSTEM_NAMESPACE;
use jetsched_shared::wire::{Event, EventKind, format_time};

use super::{
    Candidate, DLQ_SUBJECT, DlqState, JETSTREAM_SUBJECT, LimitWait, Rule, SCHEDULER_SUBJECT, Thresholds,
    chrono_duration,
};

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
    /// Concurrency keys whose current episode (a run waiting longer than the threshold)
    /// alerted.
    waiting_keys: HashSet<String>,
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
            waiting_keys: HashSet::new(),
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
            EventKind::AfterExpired if self.on(Rule::AfterExpired) => {
                let when = event.nominal_time.map(|t| format!(" of {}", format_time(t))).unwrap_or_default();
                let missing = event.reason.as_deref().unwrap_or("parents' runs missing");
                let summary = format!("{ns}/{task} gave up waiting for its parents' runs{when}: {missing}");
                out.push(run_details(Candidate::new(Rule::AfterExpired, ns, task, event.time, summary)));
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

    /// A check of the concurrency keys with waiting runs: a key whose longest waiting run has
    /// waited `limit_wait` or more alerts once, again only after no run of it waited that long
    /// (a key missing from `waits` has none waiting). The alert names the longest waiting run's
    /// namespace and task, so a team's alerts reach it.
    pub fn on_limit_waits(&mut self, now: DateTime<Utc>, waits: &[LimitWait]) -> Vec<Candidate> {
        let threshold = chrono_duration(self.thresholds.limit_wait);
        let over = |w: &LimitWait| now - w.since >= threshold;
        self.waiting_keys.retain(|key| waits.iter().any(|w| &w.key == key && over(w)));
        if !self.on(Rule::LimitWaiting) {
            return Vec::new();
        }
        let mut out = Vec::new();
        for wait in waits.iter().filter(|w| over(w)) {
            if !self.waiting_keys.insert(wait.key.clone()) {
                continue;
            }
            let waited = (now - wait.since).num_seconds();
            let summary = format!(
                "concurrency key {}: a run has waited {waited}s for a slot ({} waiting, {} of {} in use)",
                wait.key, wait.waiting, wait.in_use, wait.limit
            );
            out.push(
                Candidate::new(Rule::LimitWaiting, &wait.namespace, &wait.task_id, now, summary)
                    .detail("key", &wait.key)
                    .detail("waiting", wait.waiting)
                    .detail("in_use", wait.in_use)
                    .detail("limit", wait.limit)
                    .detail("waiting_since", format_time(wait.since))
                    .detail("execution_id", &wait.execution_id),
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
mod tests;
