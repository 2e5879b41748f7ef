//! Tests of the throttle: de-duplication with repeat counts, grouping, the rate limit and its
//! summary, restored windows; property tests of the token bucket and of de-duplication.

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
    let mut throttle = Throttle::new(ThrottleConfig { group_wait: Duration::from_secs(2), ..config() }, "a1");
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
