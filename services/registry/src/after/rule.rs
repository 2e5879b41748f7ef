//! Pure rules of a child's wait: a parent's verdict merged into it, and what the wait says
//! then (dispatch the child, wait on, or give up).

use chrono::{DateTime, Utc};
use jetsched_shared::spec::{AfterMode, AfterSpec, TaskSpec};
use jetsched_shared::wire::{MAX_RESULTS_PER_CHILD, ParentRun, RunStatus, Trigger, Wait, WaitState};

/// What a wait says once a verdict is merged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Parents' verdicts are still to come.
    Wait,
    /// The rule holds: dispatch the child.
    Met,
    /// The rule can no longer hold (why).
    NotMet(String),
}

/// What reached a child's wait.
#[derive(Debug, Clone)]
pub(crate) enum Arrival {
    /// A parent's run ended.
    Verdict(ParentRun),
    /// The child's own fire came (a child with a schedule), `schedule` or `catchup`.
    Fire(Trigger),
}

/// Whether a parent's run of `nominal_time` concerns `spec`: every nominal time for a child
/// without a schedule, its schedule's own times for a child with one.
pub(crate) fn concerns(spec: &TaskSpec, nominal_time: DateTime<Utc>) -> bool {
    !spec.holds_fires_for_parents()
        || spec.schedule.next_after(nominal_time - chrono::Duration::milliseconds(1)) == Some(nominal_time)
}

/// A new wait of the child `namespace`/`task_id` for `nominal_time`, begun at `now`: its
/// execution id is its fire's for a `held` child, derived from the nominal time otherwise.
pub(crate) fn new_wait(
    namespace: &str,
    task_id: &str,
    nominal_time: DateTime<Utc>,
    after: &AfterSpec,
    now: DateTime<Utc>,
    held: bool,
) -> Wait {
    let within = chrono::Duration::from_std(after.within).unwrap_or(chrono::Duration::days(7));
    let nominal_ms = nominal_time.timestamp_millis();
    Wait {
        namespace: namespace.to_string(),
        task_id: task_id.to_string(),
        nominal_time,
        state: WaitState::Waiting,
        execution_id: match held {
            true => jetsched_shared::wire::scheduled_execution_id(namespace, task_id, nominal_ms),
            false => jetsched_shared::wire::child_execution_id(namespace, task_id, nominal_ms),
        },
        since: now,
        deadline: now + within,
        parents: Default::default(),
        fired: None,
        result_bytes: 0,
        reason: None,
        ended: None,
    }
}

/// Merges what arrived into `wait`; whether the wait changed.
pub(crate) fn merge_arrival(wait: &mut Wait, after: &AfterSpec, arrival: Arrival) -> bool {
    match arrival {
        Arrival::Verdict(run) => merge(wait, after, run),
        Arrival::Fire(trigger) => wait.fired.replace(trigger).is_none(),
    }
}

/// What `wait` says under `after`, for a `held` child too: met only once its fire came.
pub(crate) fn decide_held(wait: &Wait, after: &AfterSpec, held: bool) -> Decision {
    match decide(wait, after) {
        Decision::Met if held && wait.fired.is_none() => Decision::Wait,
        decision => decision,
    }
}

/// Merges a parent's run into `wait`; whether the wait changed. A parent's later run of the
/// same nominal time (a replayed dead letter) replaces an earlier one only when it meets the
/// rule and the earlier did not. Results are kept while the wait's results stay within
/// [`MAX_RESULTS_PER_CHILD`]; past it a result is left out (`result_omitted`).
pub(crate) fn merge(wait: &mut Wait, after: &AfterSpec, mut run: ParentRun) -> bool {
    if let Some(known) = wait.parents.get(&run.task) {
        let better = after.satisfied_by(run.status) && !after.satisfied_by(known.status);
        if known.execution_id == run.execution_id || !better {
            return false;
        }
    }
    let size = run.result.as_ref().map_or(0, |r| r.to_string().len());
    if size > 0 && wait.result_bytes + size > MAX_RESULTS_PER_CHILD {
        run.result = None;
        run.result_omitted = true;
    } else {
        wait.result_bytes += size;
    }
    wait.parents.insert(run.task.clone(), run);
    true
}

/// What `wait` says under `after`.
pub(crate) fn decide(wait: &Wait, after: &AfterSpec) -> Decision {
    let mut missing = 0;
    let mut first_unmet = None;
    let mut any_met = false;
    for parent in &after.tasks {
        match wait.parents.get(&parent.to_string()) {
            None => missing += 1,
            Some(run) if after.satisfied_by(run.status) => any_met = true,
            Some(run) => {
                first_unmet.get_or_insert_with(|| format!("{parent} ended {}", run.status.as_str()));
            }
        }
    }
    let when = after.when.as_str();
    match after.mode {
        AfterMode::Any if any_met => Decision::Met,
        AfterMode::Any if missing == 0 => Decision::NotMet(format!("no parent's run {when}")),
        AfterMode::Any => Decision::Wait,
        AfterMode::All => match first_unmet {
            Some(unmet) => Decision::NotMet(format!("{unmet}, not {when}")),
            None if missing == 0 => Decision::Met,
            None => Decision::Wait,
        },
    }
}

/// The parents still missing from `wait`, as `<namespace>/<id>`.
pub(crate) fn missing(wait: &Wait, after: &AfterSpec) -> Vec<String> {
    after.tasks.iter().map(ToString::to_string).filter(|task| !wait.parents.contains_key(task)).collect()
}

/// Whether a run that ended `status` is a verdict a child hears of.
pub(crate) fn is_verdict(status: RunStatus) -> bool {
    matches!(status, RunStatus::Succeeded | RunStatus::Dead | RunStatus::Skipped | RunStatus::Cancelled)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn after(mode: &str, when: &str) -> AfterSpec {
        let spec = json!({
            "id": "child", "namespace": "ns",
            "after": {"tasks": ["a", "b", "c"], "mode": mode, "when": when},
            "executor": {"kind": "handler", "name": "h"}
        });
        jetsched_shared::spec::TaskSpec::parse_value(spec).unwrap().after.map(|after| *after).unwrap()
    }

    fn run(task: &str, execution: &str, status: RunStatus) -> ParentRun {
        ParentRun {
            task: format!("ns/{task}"),
            execution_id: execution.into(),
            status,
            finished: None,
            result: Some(json!({"from": task})),
            result_omitted: false,
        }
    }

    fn wait(after: &AfterSpec) -> Wait {
        new_wait("ns", "child", DateTime::UNIX_EPOCH, after, DateTime::UNIX_EPOCH, false)
    }

    #[test]
    fn a_held_child_runs_once_its_fire_and_its_parents_are_in_on_its_own_times_only() {
        let rule = after("all", "succeeded");
        let mut w = new_wait("ns", "child", DateTime::UNIX_EPOCH, &rule, DateTime::UNIX_EPOCH, true);
        assert_eq!(w.execution_id, jetsched_shared::wire::scheduled_execution_id("ns", "child", 0));
        for (task, id) in [("a", "1"), ("b", "2"), ("c", "3")] {
            merge_arrival(&mut w, &rule, Arrival::Verdict(run(task, id, RunStatus::Succeeded)));
        }
        assert_eq!(decide_held(&w, &rule, false), Decision::Met);
        assert_eq!(decide_held(&w, &rule, true), Decision::Wait, "not before its fire");
        assert!(merge_arrival(&mut w, &rule, Arrival::Fire(Trigger::Schedule)));
        assert!(!merge_arrival(&mut w, &rule, Arrival::Fire(Trigger::Schedule)), "a fire told again");
        assert_eq!(decide_held(&w, &rule, true), Decision::Met);

        let spec = |schedule: serde_json::Value| {
            jetsched_shared::spec::TaskSpec::parse_value(json!({
                "id": "child", "namespace": "ns", "schedule": schedule,
                "after": {"tasks": ["a"]}, "executor": {"kind": "handler", "name": "h"}
            }))
            .unwrap()
        };
        let daily = spec(json!({"cron": "0 0 0 * * *"}));
        let midnight = DateTime::parse_from_rfc3339("2026-12-07T00:00:00Z").unwrap().to_utc();
        assert!(daily.holds_fires_for_parents());
        assert!(concerns(&daily, midnight));
        assert!(!concerns(&daily, midnight + chrono::Duration::hours(1)), "an hourly parent's other runs");
        let unscheduled = jetsched_shared::spec::TaskSpec::parse_value(json!({
            "id": "child", "namespace": "ns", "after": {"tasks": ["a"]},
            "executor": {"kind": "handler", "name": "h"}
        }))
        .unwrap();
        assert!(
            !unscheduled.holds_fires_for_parents()
                && concerns(&unscheduled, midnight + chrono::Duration::hours(1))
        );
    }

    #[test]
    fn all_waits_for_every_parent_and_gives_up_on_the_first_wrong_verdict() {
        let rule = after("all", "succeeded");
        let mut w = wait(&rule);
        assert!(merge(&mut w, &rule, run("a", "1", RunStatus::Succeeded)));
        assert!(!merge(&mut w, &rule, run("a", "1", RunStatus::Succeeded)), "a redelivery changes nothing");
        assert_eq!(decide(&w, &rule), Decision::Wait);
        assert_eq!(missing(&w, &rule), vec!["ns/b", "ns/c"]);
        merge(&mut w, &rule, run("b", "2", RunStatus::Succeeded));
        merge(&mut w, &rule, run("c", "3", RunStatus::Succeeded));
        assert_eq!(decide(&w, &rule), Decision::Met);
        let mut w = wait(&rule);
        merge(&mut w, &rule, run("b", "2", RunStatus::Dead));
        assert_eq!(decide(&w, &rule), Decision::NotMet("ns/b ended dead, not succeeded".into()));
        // the dead run replayed with success puts the wait back on course
        assert!(merge(&mut w, &rule, run("b", "2r", RunStatus::Succeeded)));
        assert_eq!(decide(&w, &rule), Decision::Wait);
    }

    #[test]
    fn any_fires_on_the_first_parent_that_meets_it() {
        let rule = after("any", "failed");
        let mut w = wait(&rule);
        merge(&mut w, &rule, run("a", "1", RunStatus::Succeeded));
        assert_eq!(decide(&w, &rule), Decision::Wait);
        merge(&mut w, &rule, run("c", "3", RunStatus::Dead));
        assert_eq!(decide(&w, &rule), Decision::Met);
        let mut w = wait(&rule);
        for (task, id) in [("a", "1"), ("b", "2"), ("c", "3")] {
            merge(&mut w, &rule, run(task, id, RunStatus::Succeeded));
        }
        assert_eq!(decide(&w, &rule), Decision::NotMet("no parent's run failed".into()));
    }

    #[test]
    fn results_past_the_bound_are_left_out() {
        let rule = after("all", "completed");
        let mut w = wait(&rule);
        w.result_bytes = MAX_RESULTS_PER_CHILD - 5;
        merge(&mut w, &rule, run("a", "1", RunStatus::Succeeded));
        let kept = &w.parents["ns/a"];
        assert!(kept.result.is_none() && kept.result_omitted);
    }

    fn status() -> impl Strategy<Value = RunStatus> {
        prop_oneof![
            Just(RunStatus::Succeeded),
            Just(RunStatus::Dead),
            Just(RunStatus::Skipped),
            Just(RunStatus::Cancelled)
        ]
    }

    proptest! {
        /// Against a reference: the decision depends only on the set of verdicts, not on the
        /// order they come in or on redeliveries.
        #[test]
        fn the_decision_is_the_reference_rules_in_any_order(
            verdicts in proptest::collection::vec((0usize..3, status()), 0..8),
            mode in prop_oneof![Just("all"), Just("any")],
            when in prop_oneof![Just("succeeded"), Just("failed"), Just("completed")],
        ) {
            let rule = after(mode, when);
            let tasks = ["a", "b", "c"];
            // First verdict per parent (later ones with other ids only replace a miss).
            let mut forward = wait(&rule);
            for (i, (task, status)) in verdicts.iter().enumerate() {
                merge(&mut forward, &rule, run(tasks[*task], &i.to_string(), *status));
                merge(&mut forward, &rule, run(tasks[*task], &i.to_string(), *status));
            }
            let mut backward = wait(&rule);
            for (i, (task, status)) in verdicts.iter().enumerate().rev() {
                merge(&mut backward, &rule, run(tasks[*task], &i.to_string(), *status));
            }
            let met = |w: &Wait| tasks.iter().filter(|t| w.parents.get(&format!("ns/{t}")).is_some_and(|r| rule.satisfied_by(r.status))).count();
            let seen = |w: &Wait| w.parents.len();
            // Reference: a parent counts as met when any of its verdicts meets the rule.
            let reference_met = (0..3).filter(|t| verdicts.iter().any(|(task, s)| task == t && rule.satisfied_by(*s))).count();
            let reference_seen = (0..3).filter(|t| verdicts.iter().any(|(task, _)| task == t)).count();
            prop_assert_eq!(met(&forward), reference_met);
            prop_assert_eq!(met(&backward), reference_met);
            prop_assert_eq!(seen(&forward), reference_seen);
            let expected = match mode {
                "any" if reference_met > 0 => "met",
                "any" if reference_seen == 3 => "not_met",
                "all" if reference_seen > reference_met => "not_met",
                "all" if reference_met == 3 => "met",
                _ => "wait",
            };
            let name = |d: Decision| match d { Decision::Met => "met", Decision::NotMet(_) => "not_met", Decision::Wait => "wait" };
            prop_assert_eq!(name(decide(&forward, &rule)), expected);
            prop_assert_eq!(name(decide(&backward, &rule)), expected);
        }
    }
}
