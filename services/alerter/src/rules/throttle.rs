//! What happens to a raised alert, as pure code with `now` passed in: de-duplication per
//! (rule, subject) window with repeat counts, grouping of one rule's alerts into one message,
//! and a global token bucket whose suppressed alerts are reported in a summary.
//!
//! Order: a candidate passes de-duplication ([`Throttle::admit`]); the caller claims it (the
//! service records the window in its KV bucket, shared by replicas) and hands it back with
//! [`Throttle::record_sent`]; it waits in its rule's group for `group_wait`; [`Throttle::flush`] turns
//! due groups into messages, each taking a token or being counted as suppressed.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use chrono::{DateTime, Utc};
use jetsched_shared::alert::{Alert, AlertMessage, RATE_LIMIT_SUMMARY, Severity, Suppressed};
use jetsched_shared::wire::format_time;

use super::{Candidate, Rule, chrono_duration};

/// Settings of the throttle: de-duplication window, rate limit, grouping.
#[derive(Debug, Clone)]
pub struct ThrottleConfig {
    /// One alert per (rule, subject) per window.
    pub dedup_window: Duration,
    /// Messages per minute (token refill rate).
    pub rate_per_minute: u32,
    /// Bucket size: messages that may go out at once.
    pub burst: u32,
    /// How long alerts of one rule are collected into one message (zero: no grouping).
    pub group_wait: Duration,
    /// How long after the first suppressed alert the summary goes out.
    pub summary_interval: Duration,
    /// Alerts listed by name in a grouped message's text.
    pub max_listed: usize,
}

impl Default for ThrottleConfig {
    fn default() -> Self {
        ThrottleConfig {
            dedup_window: Duration::from_secs(300),
            rate_per_minute: 10,
            burst: 10,
            group_wait: Duration::from_secs(2),
            summary_interval: Duration::from_secs(60),
            max_listed: 20,
        }
    }
}

/// What de-duplication is keyed on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DedupKey {
    pub rule: Rule,
    pub namespace: String,
    pub task_id: String,
}

impl DedupKey {
    pub fn of(candidate: &Candidate) -> DedupKey {
        DedupKey {
            rule: candidate.rule,
            namespace: candidate.namespace.clone(),
            task_id: candidate.task_id.clone(),
        }
    }

    /// `<rule>.<namespace>.<task_id>`: a valid KV key (ids are `[A-Za-z0-9_-]`).
    pub fn storage_key(&self) -> String {
        format!("{}.{}.{}", self.rule.name(), self.namespace, self.task_id)
    }

    pub fn parse(key: &str) -> Option<DedupKey> {
        let mut parts = key.splitn(3, '.');
        let rule = parts.next()?;
        let rule = Rule::ALL.into_iter().find(|r| r.name() == rule)?;
        let namespace = parts.next()?.to_string();
        let task_id = parts.next()?.to_string();
        Some(DedupKey { rule, namespace, task_id })
    }
}

/// An open de-duplication window.
#[derive(Debug, Clone)]
struct Window {
    until: DateTime<Utc>,
    /// Occurrences suppressed in this window.
    repeats: u64,
    /// The latest suppressed occurrence, sent as a follow-up when the window closes.
    last: Option<Candidate>,
}

/// The verdict of de-duplication.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Send it, reporting `repeats` occurrences suppressed before it.
    Send { repeats: u64 },
    /// Within the window of an earlier alert: counted.
    Repeat,
}

/// A token bucket: `capacity` tokens, refilled continuously at `per_minute`.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    capacity: f64,
    tokens: f64,
    per_ms: f64,
    last: Option<DateTime<Utc>>,
}

impl TokenBucket {
    pub fn new(per_minute: u32, burst: u32) -> TokenBucket {
        let capacity = f64::from(burst.max(1));
        TokenBucket { capacity, tokens: capacity, per_ms: f64::from(per_minute) / 60_000.0, last: None }
    }

    /// Takes a token if one is available at `now`.
    pub fn take(&mut self, now: DateTime<Utc>) -> bool {
        if let Some(last) = self.last {
            let elapsed = (now - last).num_milliseconds().max(0) as f64;
            self.tokens = (self.tokens + elapsed * self.per_ms).min(self.capacity);
        }
        self.last = Some(self.last.map_or(now, |last| last.max(now)));
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[derive(Debug)]
struct Group {
    deadline: DateTime<Utc>,
    alerts: Vec<Alert>,
}

#[derive(Debug, Default)]
struct Suppression {
    by_rule: BTreeMap<String, u64>,
    total: u64,
    since: Option<DateTime<Utc>>,
}

/// De-duplication, grouping and rate limit.
#[derive(Debug)]
pub struct Throttle {
    config: ThrottleConfig,
    instance: String,
    windows: HashMap<DedupKey, Window>,
    groups: BTreeMap<Rule, Group>,
    bucket: TokenBucket,
    suppressed: Suppression,
    /// Alerts held back by the rate limit since the last [`Throttle::take_rate_limited`].
    rate_limited: Vec<(Rule, u64)>,
}

impl Throttle {
    pub fn new(config: ThrottleConfig, instance: impl Into<String>) -> Throttle {
        let bucket = TokenBucket::new(config.rate_per_minute, config.burst);
        Throttle {
            config,
            instance: instance.into(),
            windows: HashMap::new(),
            groups: BTreeMap::new(),
            bucket,
            suppressed: Suppression::default(),
            rate_limited: Vec::new(),
        }
    }

    pub fn dedup_window(&self) -> Duration {
        self.config.dedup_window
    }

    /// De-duplication of one occurrence.
    pub fn admit(&mut self, now: DateTime<Utc>, candidate: &Candidate) -> Admission {
        let key = DedupKey::of(candidate);
        match self.windows.get_mut(&key) {
            Some(window) if now < window.until => {
                window.repeats += 1;
                window.last = Some(candidate.clone());
                Admission::Repeat
            }
            Some(window) => Admission::Send { repeats: window.repeats },
            None => Admission::Send { repeats: 0 },
        }
    }

    /// A window known from storage (written by this alerter before a restart, or by another
    /// replica). An earlier `until` never shortens a known window.
    pub fn restore(&mut self, key: DedupKey, until: DateTime<Utc>) {
        let window = self.windows.entry(key).or_insert(Window { until, repeats: 0, last: None });
        window.until = window.until.max(until);
    }

    /// Another replica claimed this occurrence's window first: count it as a repeat there.
    pub fn adopt(&mut self, candidate: &Candidate, until: DateTime<Utc>) {
        self.restore(DedupKey::of(candidate), until);
        let _ = self.admit(until - chrono::Duration::milliseconds(1), candidate);
    }

    /// The window the next sent alert of `candidate` opens.
    pub fn window_until(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        now + chrono_duration(self.config.dedup_window)
    }

    /// The occurrence was claimed: open its window and queue the alert in its rule's group.
    pub fn record_sent(
        &mut self,
        now: DateTime<Utc>,
        candidate: &Candidate,
        repeats: u64,
        until: DateTime<Utc>,
    ) {
        self.windows.insert(DedupKey::of(candidate), Window { until, repeats: 0, last: None });
        let summary = if repeats > 0 {
            format!("{} (repeated {repeats} more time(s) since the previous alert)", candidate.summary)
        } else {
            candidate.summary.clone()
        };
        let alert = Alert {
            rule: candidate.rule.name().to_string(),
            severity: candidate.rule.severity(),
            namespace: candidate.namespace.clone(),
            task_id: candidate.task_id.clone(),
            time: candidate.time,
            summary,
            repeats,
            details: candidate.details.clone(),
        };
        let deadline = now + chrono_duration(self.config.group_wait);
        self.groups
            .entry(candidate.rule)
            .or_insert(Group { deadline, alerts: Vec::new() })
            .alerts
            .push(alert);
    }

    /// Closed windows that counted repeats: their latest occurrence, to be sent again with the
    /// count. Closed windows without repeats are forgotten.
    pub fn due_followups(&mut self, now: DateTime<Utc>) -> Vec<(Candidate, u64)> {
        let mut out = Vec::new();
        self.windows.retain(|_, window| {
            if now < window.until {
                return true;
            }
            match window.last.take() {
                Some(last) if window.repeats > 0 => {
                    out.push((last, window.repeats));
                    // Kept until the follow-up is recorded (or a later admit reports it).
                    true
                }
                _ => false,
            }
        });
        out.sort_by_key(|(candidate, _)| candidate.time);
        out
    }

    /// Messages due at `now`: groups whose wait ended (each taking a token or being
    /// suppressed), and the rate limit's summary when due.
    pub fn flush(&mut self, now: DateTime<Utc>) -> Vec<AlertMessage> {
        let mut out = Vec::new();
        let due: Vec<Rule> = self.groups.iter().filter(|(_, g)| g.deadline <= now).map(|(r, _)| *r).collect();
        for rule in due {
            let Some(group) = self.groups.remove(&rule) else { continue };
            if self.bucket.take(now) {
                out.push(self.message(now, rule, group.alerts));
            } else {
                let count = group.alerts.len() as u64;
                *self.suppressed.by_rule.entry(rule.name().to_string()).or_default() += count;
                self.suppressed.total += count;
                self.suppressed.since.get_or_insert(now);
                self.rate_limited.push((rule, count));
            }
        }
        if let Some(since) = self.suppressed.since
            && now >= since + chrono_duration(self.config.summary_interval)
        {
            let suppressed = std::mem::take(&mut self.suppressed);
            let by_rule = suppressed
                .by_rule
                .iter()
                .map(|(rule, n)| format!("{rule}: {n}"))
                .collect::<Vec<_>>()
                .join(", ");
            out.push(AlertMessage {
                id: uuid::Uuid::new_v4().to_string(),
                text: format!(
                    "[WARNING] rate limit: {} alert(s) suppressed since {} ({by_rule})",
                    suppressed.total,
                    format_time(since)
                ),
                severity: Severity::Warning,
                rule: RATE_LIMIT_SUMMARY.to_string(),
                time: now,
                instance: self.instance.clone(),
                alerts: Vec::new(),
                suppressed: Some(Suppressed {
                    total: suppressed.total,
                    by_rule: suppressed.by_rule,
                    since,
                    until: now,
                }),
            });
        }
        out
    }

    /// Everything still waiting, at shutdown: groups go out now (through the rate limit) and
    /// a pending summary with them.
    pub fn drain(&mut self, now: DateTime<Utc>) -> Vec<AlertMessage> {
        for group in self.groups.values_mut() {
            group.deadline = group.deadline.min(now);
        }
        let mut out = self.flush(now);
        if let Some(since) = self.suppressed.since {
            // Make the summary due now.
            self.suppressed.since = Some(since.min(now - chrono_duration(self.config.summary_interval)));
            let mut summary = self.flush(now);
            for message in &mut summary {
                if let Some(suppressed) = &mut message.suppressed {
                    suppressed.since = since;
                }
            }
            out.extend(summary);
        }
        out
    }

    /// Alerts the rate limit held back since the previous call (for metrics).
    pub fn take_rate_limited(&mut self) -> Vec<(Rule, u64)> {
        std::mem::take(&mut self.rate_limited)
    }

    /// The next instant [`Throttle::flush`] or [`Throttle::due_followups`] has work.
    pub fn next_deadline(&self) -> Option<DateTime<Utc>> {
        let groups = self.groups.values().map(|g| g.deadline);
        let followups = self.windows.values().filter(|w| w.repeats > 0 && w.last.is_some()).map(|w| w.until);
        let summary = self.suppressed.since.map(|s| s + chrono_duration(self.config.summary_interval));
        groups.chain(followups).chain(summary).min()
    }

    fn message(&self, now: DateTime<Utc>, rule: Rule, alerts: Vec<Alert>) -> AlertMessage {
        let severity = alerts.iter().map(|a| a.severity).max().unwrap_or(rule.severity());
        let label = severity.as_str().to_ascii_uppercase();
        let text = match alerts.as_slice() {
            [alert] => format!("[{label}] {}: {}", rule.name(), alert.summary),
            many => {
                let mut text = format!("[{label}] {}: {} alerts", rule.name(), many.len());
                for alert in many.iter().take(self.config.max_listed) {
                    text.push_str(&format!("\n• {}", alert.summary));
                }
                if many.len() > self.config.max_listed {
                    text.push_str(&format!("\n… and {} more", many.len() - self.config.max_listed));
                }
                text
            }
        };
        AlertMessage {
            id: uuid::Uuid::new_v4().to_string(),
            text,
            severity,
            rule: rule.name().to_string(),
            time: now,
            instance: self.instance.clone(),
            alerts,
            suppressed: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    fn at_ms(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_700_000_000_000 + ms).unwrap()
    }

    fn candidate(rule: Rule, task: &str, time: DateTime<Utc>) -> Candidate {
        Candidate {
            rule,
            namespace: "ns".into(),
            task_id: task.into(),
            time,
            summary: format!("{} of {task}", rule.name()),
            details: BTreeMap::new(),
        }
    }

    /// Runs `candidate` through the throttle as the service does (claims always succeed).
    fn offer(throttle: &mut Throttle, now: DateTime<Utc>, c: &Candidate) -> bool {
        match throttle.admit(now, c) {
            Admission::Send { repeats } => {
                let until = throttle.window_until(now);
                throttle.record_sent(now, c, repeats, until);
                true
            }
            Admission::Repeat => false,
        }
    }

    fn drive(throttle: &mut Throttle, now: DateTime<Utc>) -> Vec<AlertMessage> {
        for (c, repeats) in throttle.due_followups(now) {
            let until = throttle.window_until(now);
            throttle.record_sent(now, &c, repeats, until);
        }
        throttle.flush(now)
    }

    fn config() -> ThrottleConfig {
        ThrottleConfig {
            dedup_window: Duration::from_secs(300),
            rate_per_minute: 10,
            burst: 10,
            group_wait: Duration::ZERO,
            summary_interval: Duration::from_secs(60),
            max_listed: 3,
        }
    }

    #[test]
    fn hundred_failures_make_one_alert_then_a_follow_up_with_the_count() {
        let mut throttle = Throttle::new(config(), "a1");
        let mut sent = Vec::new();
        for i in 0..100 {
            offer(&mut throttle, at_ms(i * 100), &candidate(Rule::RunFailed, "t", at_ms(i * 100)));
            sent.extend(drive(&mut throttle, at_ms(i * 100)));
        }
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].alerts[0].repeats, 0);
        assert_eq!(throttle.next_deadline(), Some(at_ms(300_000)));
        let later = drive(&mut throttle, at_ms(300_000));
        assert_eq!(later.len(), 1);
        assert_eq!(later[0].alerts[0].repeats, 99);
        assert!(later[0].text.contains("repeated 99"), "{}", later[0].text);
        // Nothing more to report: the follow-up's window closes quietly.
        assert!(drive(&mut throttle, at_ms(700_000)).is_empty());
        assert_eq!(throttle.next_deadline(), None);
    }

    #[test]
    fn storm_sends_the_burst_then_one_summary() {
        let mut throttle = Throttle::new(config(), "a1");
        let mut sent = Vec::new();
        for i in 0..50 {
            offer(&mut throttle, at_ms(i), &candidate(Rule::RunDead, &format!("t{i}"), at_ms(i)));
            sent.extend(drive(&mut throttle, at_ms(i)));
        }
        assert_eq!(sent.len(), 10);
        assert_eq!(throttle.next_deadline(), Some(at_ms(10 + 60_000)));
        let summary = drive(&mut throttle, at_ms(10 + 60_000));
        assert_eq!(summary.len(), 1);
        assert_eq!(summary[0].rule, RATE_LIMIT_SUMMARY);
        assert_eq!(summary[0].suppressed.as_ref().unwrap().total, 40);
        assert_eq!(summary[0].suppressed.as_ref().unwrap().by_rule["run_dead"], 40);
    }

    #[test]
    fn one_rules_alerts_are_grouped_within_group_wait() {
        let mut throttle =
            Throttle::new(ThrottleConfig { group_wait: Duration::from_secs(2), ..config() }, "a1");
        for i in 0..5 {
            offer(&mut throttle, at_ms(i * 100), &candidate(Rule::RunFailed, &format!("t{i}"), at_ms(0)));
        }
        offer(&mut throttle, at_ms(100), &candidate(Rule::RunDead, "x", at_ms(0)));
        assert!(drive(&mut throttle, at_ms(1_999)).is_empty());
        let out = drive(&mut throttle, at_ms(2_000));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].alerts.len(), 5);
        assert!(out[0].text.contains("5 alerts") && out[0].text.contains("… and 2 more"), "{}", out[0].text);
        let out = drive(&mut throttle, at_ms(2_100));
        assert_eq!(out[0].rule, "run_dead");
    }

    #[test]
    fn drain_sends_waiting_groups_and_the_summary() {
        let mut throttle = Throttle::new(
            ThrottleConfig { group_wait: Duration::from_secs(60), burst: 1, rate_per_minute: 1, ..config() },
            "a1",
        );
        offer(&mut throttle, at_ms(0), &candidate(Rule::RunFailed, "a", at_ms(0)));
        offer(&mut throttle, at_ms(0), &candidate(Rule::RunDead, "b", at_ms(0)));
        assert!(drive(&mut throttle, at_ms(1)).is_empty());
        let out = throttle.drain(at_ms(2));
        let rules: Vec<&str> = out.iter().map(|m| m.rule.as_str()).collect();
        assert_eq!(rules, ["run_failed", RATE_LIMIT_SUMMARY]);
        assert_eq!(out[1].suppressed.as_ref().unwrap().by_rule["run_dead"], 1);
        assert_eq!(out[1].suppressed.as_ref().unwrap().since, at_ms(2));
        assert_eq!(throttle.next_deadline(), None);
    }

    #[test]
    fn restored_windows_suppress_after_a_restart() {
        let mut throttle = Throttle::new(config(), "a2");
        let c = candidate(Rule::NoLeader, "scheduler", at_ms(0));
        throttle.restore(DedupKey::of(&c), at_ms(60_000));
        assert_eq!(throttle.admit(at_ms(1), &c), Admission::Repeat);
        assert_eq!(throttle.admit(at_ms(60_000), &c), Admission::Send { repeats: 1 });
    }

    #[test]
    fn storage_keys_round_trip() {
        let key = DedupKey { rule: Rule::QueueBacklog, namespace: "_system".into(), task_id: "q-1".into() };
        assert_eq!(key.storage_key(), "queue_backlog._system.q-1");
        assert_eq!(DedupKey::parse(&key.storage_key()), Some(key));
        assert_eq!(DedupKey::parse("nope.a.b"), None);
    }

    proptest! {
        /// A token bucket never lets more than burst + rate × elapsed through.
        #[test]
        fn bucket_never_exceeds_its_rate(
            per_minute in 1u32..120, burst in 1u32..20,
            gaps in proptest::collection::vec(0i64..5_000, 1..300),
        ) {
            let mut bucket = TokenBucket::new(per_minute, burst);
            let mut t = 0;
            let mut taken = 0u64;
            for gap in gaps {
                t += gap;
                if bucket.take(at_ms(t)) { taken += 1; }
                let allowed = f64::from(burst) + f64::from(per_minute) * t as f64 / 60_000.0;
                prop_assert!(taken as f64 <= allowed + 1e-9, "taken {taken} allowed {allowed}");
            }
        }

        /// Every occurrence of one key is either an alert or counted in a later alert's
        /// repeats, and alerts are at least a window apart.
        #[test]
        fn dedup_conserves_occurrences(gaps in proptest::collection::vec(0i64..200_000, 1..200)) {
            let mut throttle = Throttle::new(ThrottleConfig { rate_per_minute: 100_000, burst: 100_000, ..config() }, "p");
            let mut t = 0;
            let mut alerts = Vec::new();
            for gap in &gaps {
                t += gap;
                alerts.extend(drive(&mut throttle, at_ms(t)));
                offer(&mut throttle, at_ms(t), &candidate(Rule::RunFailed, "t", at_ms(t)));
                alerts.extend(drive(&mut throttle, at_ms(t)));
            }
            while let Some(deadline) = throttle.next_deadline() {
                alerts.extend(drive(&mut throttle, deadline));
            }
            let reported: u64 = alerts.iter().flat_map(|m| &m.alerts).map(|a| 1 + a.repeats).sum();
            // A follow-up re-sends the latest occurrence, which was counted in its repeats.
            let followups = alerts.iter().flat_map(|m| &m.alerts).filter(|a| a.repeats > 0).count() as u64;
            prop_assert_eq!(reported - followups, gaps.len() as u64);
            for pair in alerts.windows(2) {
                prop_assert!(pair[1].time - pair[0].time >= chrono::Duration::seconds(300));
            }
        }
    }
}
