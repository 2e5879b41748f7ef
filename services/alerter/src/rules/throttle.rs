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

impl Window {
    /// The de-duplication rule: an occurrence within the window is a repeat.
    fn covers(&self, now: DateTime<Utc>) -> bool {
        now < self.until
    }
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

    /// An occurrence at `time` that is older than a window at `now`: history replayed at
    /// start-up, whose alert (if any) went out before.
    pub fn is_history(&self, time: DateTime<Utc>, now: DateTime<Utc>) -> bool {
        now - time > chrono_duration(self.config.dedup_window)
    }

    /// De-duplication of one occurrence.
    pub fn admit(&mut self, now: DateTime<Utc>, candidate: &Candidate) -> Admission {
        let key = DedupKey::of(candidate);
        match self.windows.get_mut(&key) {
            Some(window) if window.covers(now) => {
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
            if window.covers(now) {
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
mod tests;
