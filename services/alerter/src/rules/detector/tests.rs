//! Tests of the detector: each rule's events and observations, once per episode, table-driven
//! against what each rule declares it reads.

use std::time::Duration;

use jetsched_shared::alert::Severity;

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
        RunHeld,
        RunCancelled,
        BreakerOpened,
        BreakerHalfOpened,
        BreakerClosed,
        LimitThrottled,
        LeaderAcquired,
        LeaderLost,
        QueuePaused,
        QueueResumed,
        LimitSaturated,
        SchedulerClockSkew,
        TriggerDeduplicated,
        TriggerDebounced,
        BackfillStarted,
        BackfillProgress,
        BackfillFinished,
        BackfillCancelled,
        TaskCompleted,
        AfterExpired,
    ];
    for kind in all {
        match kind {
            TaskRegistered | TaskUpdated | TaskDeleted | TaskPaused | TaskResumed | TaskRejected
            | FireDispatched | FireSkipped | FireMissed | RunStarted | RunSucceeded | RunFailed
            | RunRetrying | RunDead | RunSkipped | RunHeld | RunCancelled | BreakerOpened
            | BreakerHalfOpened | BreakerClosed | LimitThrottled | LeaderAcquired | LeaderLost
            | QueuePaused | QueueResumed | LimitSaturated | SchedulerClockSkew | TriggerDeduplicated
            | TriggerDebounced | BackfillStarted | BackfillProgress | BackfillFinished
            | BackfillCancelled | TaskCompleted | AfterExpired => {}
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

/// More than two leader changes within a minute is flapping.
fn flapping_after_two_in_a_minute() -> Detector {
    Detector::new(Thresholds {
        flap_changes: 2,
        flap_window: Duration::from_secs(60),
        ..Thresholds::default()
    })
}

fn acquired(instance: &str, s: i64) -> Event {
    Event { instance: Some(instance.into()), ..event(EventKind::LeaderAcquired, at(s)) }
}

#[test]
fn flapping_counts_changes_in_the_window() {
    let mut d = flapping_after_two_in_a_minute();
    let acquired = |s| acquired("s1", s);
    assert_eq!(d.on_event(&acquired(0)).len(), 1); // leader_changed only
    assert_eq!(d.on_event(&acquired(10)).len(), 1);
    let out = d.on_event(&acquired(20));
    assert_eq!(out.iter().map(|c| c.rule).collect::<Vec<_>>(), [Rule::LeaderChanged, Rule::LeaderFlapping]);
    // Two minutes later the window holds one change again.
    assert_eq!(d.on_event(&acquired(200)).len(), 1);
}

#[test]
fn replayed_leader_changes_count_towards_flapping() {
    let mut d = flapping_after_two_in_a_minute();
    assert_eq!(d.record_leader_change(at(0)), 1);
    assert_eq!(d.record_leader_change(at(10)), 2);
    let rules: Vec<Rule> = d.on_event(&acquired("s2", 20)).into_iter().map(|c| c.rule).collect();
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

fn waiting(key: &str, since: DateTime<Utc>, task: &str) -> LimitWait {
    LimitWait {
        key: key.to_string(),
        waiting: 3,
        limit: 2,
        in_use: 2,
        since,
        namespace: "billing".to_string(),
        task_id: task.to_string(),
        execution_id: format!("billing.{task}:1"),
    }
}

#[test]
fn a_run_waiting_too_long_for_a_slot_alerts_once_per_key_and_episode() {
    let mut d = Detector::new(Thresholds { limit_wait: Duration::from_secs(60), ..Thresholds::default() });
    let payments = |since| waiting("billing.payments", since, "charge");
    assert!(d.on_limit_waits(at(59), &[payments(at(0))]).is_empty());
    let out = d.on_limit_waits(at(60), &[payments(at(0)), waiting("billing.exports", at(30), "export")]);
    assert_eq!(out.len(), 1, "{out:?}");
    let alert = &out[0];
    assert_eq!((alert.rule, alert.rule.severity()), (Rule::LimitWaiting, Severity::Warning));
    // The team of the longest waiting run gets it.
    assert_eq!((alert.namespace.as_str(), alert.task_id.as_str()), ("billing", "charge"));
    assert_eq!(alert.details["key"], "billing.payments");
    assert_eq!(alert.details["execution_id"], "billing.charge:1");
    assert!(alert.summary.contains("waited 60s"), "{}", alert.summary);
    // Still waiting: the same episode. The other key reaches the threshold: its own alert.
    let out = d.on_limit_waits(at(90), &[payments(at(0)), waiting("billing.exports", at(30), "export")]);
    assert_eq!(out.iter().map(|c| c.details["key"].as_str()).collect::<Vec<_>>(), ["billing.exports"]);
    // The runs started (the key is gone from the check), then one waits too long again.
    assert!(d.on_limit_waits(at(100), &[]).is_empty());
    assert!(d.on_limit_waits(at(150), &[payments(at(100))]).is_empty());
    assert_eq!(d.on_limit_waits(at(160), &[payments(at(100))]).len(), 1);
    // A newer waiter alone (the old ones started) below the threshold ends the episode too.
    assert!(d.on_limit_waits(at(170), &[payments(at(165))]).is_empty());
    assert_eq!(d.on_limit_waits(at(225), &[payments(at(165))]).len(), 1);
}

#[test]
fn limit_waiting_off_raises_nothing() {
    let mut d = Detector::new(Thresholds {
        enabled: vec![Rule::RunDead],
        limit_wait: Duration::from_secs(1),
        ..Thresholds::default()
    });
    assert!(d.on_limit_waits(at(100), &[waiting("billing.payments", at(0), "charge")]).is_empty());
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
