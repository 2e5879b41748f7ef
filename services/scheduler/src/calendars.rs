//! Business calendars as the scheduler applies them: every namespace's calendars, followed
//! from the calendars bucket, and the fate of a task's next fire under its calendars.
//!
//! The fate is a pure function of the task, its cursor (the nominal time it fired or passed
//! last), the nominal time and the calendars, so every replica plans alike and a new leader
//! dispatches a shifted fire under the execution id of its nominal time, as the old one would.
//! A calendar edit changes the fate of the next fires: the loop re-plans every task of the
//! namespace naming a calendar (`Core::on_calendar`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::{self, kv};
use futures::StreamExt;
use jetsched_shared::calendar::{
    Calendar, Calendars, Decision, Fires, MAX_SHIFT_DAYS, Refusal, decide, schedule_zone,
};
use jetsched_shared::schedule::EndReason;
use tokio::sync::watch;

use crate::tasks::{TaskInfo, from_ms};

/// The nominal fires [`CalendarBook::first_shifted_ahead`] looks at, at most.
const AHEAD_SCAN: usize = 100_000;

/// What happens to a task's next nominal fire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Dispatched when the wheel reaches `due_ms` (its nominal time, or the business day a
    /// calendar shifted it to), under its nominal time.
    Due { due_ms: i64, shifted: Option<Refusal> },
    /// Skipped at its nominal time: a calendar refused it.
    Skip(Refusal),
    /// Its effective time is not after the fire made last (`floor_ms`): it runs once, as that
    /// fire (a shift landing on the next occurrence, or a shift back before the cursor).
    Merged { floor_ms: i64, refusal: Option<Refusal> },
}

/// How long the feed waits before it opens the watch again after it failed or ended.
const REOPEN: Duration = Duration::from_secs(1);

/// The calendars bucket's watch: current values, then every change; opened again (from the
/// history: applying a calendar twice changes nothing) after it fails or ends.
pub(crate) struct CalendarFeed {
    store: kv::Store,
    watch: Option<kv::Watch>,
    reopen_at: Option<tokio::time::Instant>,
}

impl CalendarFeed {
    /// Opens the watch and reads every stored calendar before the tasks are planned.
    pub(crate) async fn open(
        js: &jetstream::Context,
        store: kv::Store,
    ) -> anyhow::Result<(CalendarFeed, CalendarBook)> {
        let mut watch = store.watch_with_history(">").await.context("open the calendars watch")?;
        let mut stream = js.get_stream(&store.stream_name).await.context("open the calendars stream")?;
        let messages = stream.info().await.context("read the calendars stream")?.state.messages;
        let mut book = CalendarBook::default();
        if messages > 0 {
            while let Some(entry) = watch.next().await {
                let entry = entry.context("read the calendars watch")?;
                book.apply(&entry);
                if entry.delta == 0 {
                    break;
                }
            }
        }
        Ok((CalendarFeed { store, watch: Some(watch), reopen_at: None }, book))
    }

    /// The next change (cancel-safe: a change is taken from the watch only when returned).
    pub(crate) async fn next(&mut self) -> kv::Entry {
        loop {
            let Some(watch) = self.watch.as_mut() else {
                if let Some(at) = self.reopen_at {
                    tokio::time::sleep_until(at).await;
                }
                match self.store.watch_with_history(">").await {
                    Ok(watch) => {
                        self.watch = Some(watch);
                        self.reopen_at = None;
                    }
                    Err(error) => {
                        tracing::warn!(%error, "calendars watch not opened; trying again");
                        self.reopen_at = Some(tokio::time::Instant::now() + REOPEN);
                    }
                }
                continue;
            };
            match watch.next().await {
                Some(Ok(entry)) => return entry,
                Some(Err(error)) => tracing::warn!(%error, "calendars watch failed; opening it again"),
                None => tracing::debug!("calendars watch ended; opening it again"),
            }
            self.watch = None;
            self.reopen_at = Some(tokio::time::Instant::now() + REOPEN);
        }
    }
}

/// Every namespace's calendars, as parts of the service beside the loop (the backfill driver)
/// see them: a copy replaced after each change.
pub(crate) type CalendarView = watch::Receiver<Arc<HashMap<String, Calendars>>>;

/// Every namespace's calendars.
#[derive(Debug)]
pub(crate) struct CalendarBook {
    by_namespace: HashMap<String, Calendars>,
    empty: Calendars,
    /// The copy [`CalendarView`]s see, replaced after each change once one is taken.
    shared: watch::Sender<Arc<HashMap<String, Calendars>>>,
}

impl Default for CalendarBook {
    fn default() -> CalendarBook {
        CalendarBook {
            by_namespace: HashMap::new(),
            empty: Calendars::default(),
            shared: watch::Sender::new(Arc::default()),
        }
    }
}

impl CalendarBook {
    /// A view of every namespace's calendars that follows this book's changes.
    pub(crate) fn view(&self) -> CalendarView {
        self.shared.send_replace(Arc::new(self.by_namespace.clone()));
        self.shared.subscribe()
    }

    /// Applies one entry of the calendars bucket; the namespace it changed, if any.
    pub(crate) fn apply(&mut self, entry: &kv::Entry) -> Option<String> {
        let changed = self.apply_entry(entry);
        if changed.is_some() && self.shared.receiver_count() > 0 {
            self.shared.send_replace(Arc::new(self.by_namespace.clone()));
        }
        changed
    }

    fn apply_entry(&mut self, entry: &kv::Entry) -> Option<String> {
        let (namespace, name) = entry.key.split_once('.')?;
        let calendars = self.by_namespace.entry(namespace.to_string()).or_default();
        match entry.operation {
            kv::Operation::Put => {
                let parsed = serde_json::from_slice(&entry.value)
                    .map_err(|e| e.to_string())
                    .and_then(|value| Calendar::parse_value(&value).map_err(|e| e.to_string()));
                match parsed {
                    Ok(calendar) => {
                        calendars.insert(calendar);
                    }
                    Err(error) => {
                        tracing::warn!(calendar = %entry.key, %error, "calendars bucket holds an invalid calendar; ignoring it");
                        calendars.remove(name);
                    }
                }
            }
            kv::Operation::Delete | kv::Operation::Purge => {
                calendars.remove(name);
            }
        }
        Some(namespace.to_string())
    }

    fn of(&self, namespace: &str) -> &Calendars {
        self.by_namespace.get(namespace).unwrap_or(&self.empty)
    }

    /// The fate of `info`'s fire at `nominal_ms`, the task having fired or passed `cursor_ms`
    /// last.
    pub(crate) fn fate(&self, info: &TaskInfo, cursor_ms: i64, nominal_ms: i64) -> Fate {
        if info.calendars().is_empty() {
            return Fate::Due { due_ms: nominal_ms, shifted: None };
        }
        let calendars = self.of(info.namespace());
        let zone = schedule_zone(&info.schedule);
        let effective = |ms: i64| match decide(info.calendars(), calendars, from_ms(ms), zone) {
            Decision::Fire => (Some(ms), None),
            Decision::Shift { at, refusal } => (Some(at.timestamp_millis()), Some(refusal)),
            Decision::Skip(refusal) => (None, Some(refusal)),
        };
        let (due, refusal) = effective(nominal_ms);
        let Some(due_ms) = due else {
            return Fate::Skip(refusal.expect("a skip names its refusal"));
        };
        // The fire made last ran at its effective time when the cursor is one of the
        // schedule's fire times; otherwise (a registration, a catch-up) fires start after it.
        let cursor = from_ms(cursor_ms);
        let cursor_is_fire = info.schedule.next_after(from_ms(cursor_ms - 1)) == Some(cursor);
        let floor_ms = if cursor_is_fire { effective(cursor_ms).0.unwrap_or(cursor_ms) } else { cursor_ms };
        if due_ms <= floor_ms {
            return Fate::Merged { floor_ms, refusal };
        }
        // A fire shifted out of the task's bounds (past `end_at`, before `start_at`) is skipped.
        let bounds = info.bounds();
        if let Some(refusal) = refusal {
            if due_ms >= bounds.end_at_ms || due_ms < bounds.start_ms {
                return Fate::Skip(refusal);
            }
            return Fate::Due { due_ms, shifted: Some(refusal) };
        }
        Fate::Due { due_ms, shifted: None }
    }

    /// The first nominal fire of `info` in `(floor_ms, now_ms]` that its calendars shift to
    /// a time after `now_ms`, if any. Only the last [`MAX_SHIFT_DAYS`] days before `now_ms` are
    /// looked at (no shift moves a fire further), at most [`AHEAD_SCAN`] fires.
    pub(crate) fn first_shifted_ahead(&self, info: &TaskInfo, floor_ms: i64, now_ms: i64) -> Option<i64> {
        if info.calendars().is_empty() {
            return None;
        }
        let reach_ms = i64::try_from(MAX_SHIFT_DAYS).ok()?.saturating_add(1).saturating_mul(86_400_000);
        let mut previous = floor_ms.max(now_ms.saturating_sub(reach_ms));
        let bounds = info.bounds();
        for _ in 0..AHEAD_SCAN {
            let nominal = bounds.next_after(&info.schedule, previous).filter(|&next| next <= now_ms)?;
            if let Fate::Due { due_ms, .. } = self.fate(info, previous, nominal)
                && due_ms > now_ms
            {
                return Some(nominal);
            }
            previous = nominal;
        }
        None
    }

    /// The calendar that moved the fire at `nominal_ms` and where to (for its dispatch event),
    /// if one did.
    pub(crate) fn shift_of(&self, info: &TaskInfo, nominal_ms: i64) -> Option<(Refusal, i64)> {
        if info.calendars().is_empty() {
            return None;
        }
        let zone = schedule_zone(&info.schedule);
        match decide(info.calendars(), self.of(info.namespace()), from_ms(nominal_ms), zone) {
            Decision::Shift { at, refusal } => Some((refusal, at.timestamp_millis())),
            _ => None,
        }
    }

    /// Refits the end of `info`'s window when `max_runs` bounds it: fires its calendars skip,
    /// shift out of the window or merge into another do not count, as they never run on their
    /// own. Every replica refits alike from the same calendars, so they agree on the last fire.
    pub(crate) fn refit(&self, info: &mut TaskInfo) {
        if info.calendars().is_empty() {
            return;
        }
        let bounds = info.bounds();
        let Some(max_runs) = bounds.max_runs else { return };
        let (start_ms, end_at_ms) = (bounds.start_ms, bounds.end_at_ms);
        let fires = Fires {
            schedule: &info.schedule,
            zone: schedule_zone(&info.schedule),
            refs: info.calendars(),
            calendars: self.of(info.namespace()),
            start: from_ms(start_ms),
            end_at: (end_at_ms < i64::MAX).then(|| from_ms(end_at_ms)),
        };
        let end = match fires.nth_run(max_runs) {
            Some(last) => (last.timestamp_millis().saturating_add(1), Some(EndReason::MaxRuns)),
            None => (end_at_ms, (end_at_ms < i64::MAX).then_some(EndReason::EndAt)),
        };
        if let Some(bounds) = info.bounds_mut() {
            (bounds.end_ms, bounds.ends_by) = end;
        }
    }
}

#[cfg(test)]
mod tests {
    use jetsched_shared::spec::TaskSpec;
    use serde_json::json;

    use super::*;

    fn ms(text: &str) -> i64 {
        text.parse::<chrono::DateTime<chrono::Utc>>().expect("instant").timestamp_millis()
    }

    fn book() -> CalendarBook {
        let calendar = Calendar::parse_value(&json!({
            "namespace": "ns", "name": "de", "zone": "Europe/Berlin",
            "holidays": ["2026-04-03", "2026-12-25"], "working_days": ["mon", "tue", "wed", "thu", "fri"],
        }))
        .expect("calendar");
        let mut book = CalendarBook::default();
        book.by_namespace.insert("ns".to_string(), Calendars::new([calendar]));
        book
    }

    fn task(rule: &str) -> TaskInfo {
        task_with(rule, json!({}))
    }

    /// A daily 09:00 Berlin task naming calendar `de` with `rule`, and `extra` fields.
    fn task_with(rule: &str, extra: serde_json::Value) -> TaskInfo {
        let mut json = json!({
            "id": "t", "namespace": "ns", "schedule": {"cron": "0 0 9 * * *", "timezone": "Europe/Berlin"},
            "executor": {"kind": "nats", "subject": "x"}, "calendars": [{"name": "de", "rule": rule}],
        });
        for (field, value) in extra.as_object().expect("fields") {
            json[field] = value.clone();
        }
        let json = json.to_string();
        let spec = TaskSpec::parse(json.as_bytes()).expect("spec");
        TaskInfo::new(spec, json.as_bytes(), 1, 0)
    }

    #[test]
    fn christmas_is_skipped_and_an_ordinary_day_is_due_at_its_nominal_time() {
        let (book, task) = (book(), task("exclude"));
        let christmas = ms("2026-12-25T08:00:00Z");
        match book.fate(&task, ms("2026-12-24T08:00:00Z"), christmas) {
            Fate::Skip(refusal) => assert_eq!(refusal.date.to_string(), "2026-12-25"),
            other => panic!("{other:?}"),
        }
        let tuesday = ms("2026-12-22T08:00:00Z");
        assert_eq!(
            book.fate(&task, ms("2026-12-21T08:00:00Z"), tuesday),
            Fate::Due { due_ms: tuesday, shifted: None }
        );
    }

    /// Good Friday shifted forward lands on Monday 09:00; the weekend and Monday's own fire
    /// then run once, as that fire.
    #[test]
    fn a_shift_onto_the_next_occurrence_runs_once() {
        let (book, task) = (book(), task("shift_next_business_day"));
        let friday = ms("2026-04-03T07:00:00Z");
        let monday = ms("2026-04-06T07:00:00Z");
        match book.fate(&task, ms("2026-04-02T07:00:00Z"), friday) {
            Fate::Due { due_ms, shifted: Some(_) } => assert_eq!(due_ms, monday),
            other => panic!("{other:?}"),
        }
        for (cursor, nominal) in [
            (friday, ms("2026-04-04T07:00:00Z")),
            (ms("2026-04-04T07:00:00Z"), ms("2026-04-05T07:00:00Z")),
            (ms("2026-04-05T07:00:00Z"), monday),
        ] {
            assert!(
                matches!(book.fate(&task, cursor, nominal), Fate::Merged { floor_ms, .. } if floor_ms == monday)
            );
        }
        let tuesday = ms("2026-04-07T07:00:00Z");
        assert_eq!(book.fate(&task, monday, tuesday), Fate::Due { due_ms: tuesday, shifted: None });
    }

    #[test]
    fn a_task_without_calendars_or_in_a_namespace_without_them_is_due_at_its_nominal_time() {
        let book = CalendarBook::default();
        let task = task("exclude");
        let christmas = ms("2026-12-25T08:00:00Z");
        assert_eq!(
            book.fate(&task, ms("2026-12-24T08:00:00Z"), christmas),
            Fate::Due { due_ms: christmas, shifted: None }
        );
    }

    /// Good Friday and the weekend after it are excluded: they do not count towards
    /// `max_runs`: the third run is on Monday 6 April.
    #[test]
    fn excluded_fires_do_not_count_towards_max_runs() {
        let book = book();
        let mut task = task_with("exclude", json!({"start_at": "2026-04-01T00:00:00Z", "max_runs": 3}));
        let unfit = task.bounds();
        assert_eq!(unfit.end_ms, ms("2026-04-03T07:00:00Z") + 1, "without calendars: 1, 2, 3 April");
        book.refit(&mut task);
        let bounds = task.bounds();
        assert_eq!(bounds.end_ms, ms("2026-04-06T07:00:00Z") + 1, "1, 2 and 6 April run");
        assert_eq!(bounds.ends_by, Some(EndReason::MaxRuns));
        assert_eq!(task.next_nominal(ms("2026-04-06T07:00:00Z")), None, "no fourth run");
        assert_eq!(task.ended_by(ms("2026-04-06T07:00:00Z")), Some(EndReason::MaxRuns));
        // A calendar with no room left ends the window at `end_at`, or never.
        let empty = CalendarBook::default();
        let mut refit = task_with("exclude", json!({"start_at": "2026-04-01T00:00:00Z", "max_runs": 3}));
        empty.refit(&mut refit);
        assert_eq!(refit.bounds(), unfit, "a namespace without the calendar refuses nothing");
    }

    /// Good Friday shifted forward lands on Monday 6 April, past `end_at`: skipped, naming
    /// the calendar and the date.
    #[test]
    fn a_fire_shifted_past_end_at_is_skipped() {
        let book = book();
        let task = task_with("shift_next_business_day", json!({"end_at": "2026-04-05T00:00:00Z"}));
        match book.fate(&task, ms("2026-04-02T07:00:00Z"), ms("2026-04-03T07:00:00Z")) {
            Fate::Skip(refusal) => {
                assert_eq!(refusal.calendar, "de");
                assert_eq!(refusal.date.to_string(), "2026-04-03");
            }
            other => panic!("{other:?}"),
        }
        let thursday = ms("2026-04-02T07:00:00Z");
        assert_eq!(
            book.fate(&task, thursday - 86_400_000, thursday),
            Fate::Due { due_ms: thursday, shifted: None }
        );
        assert!(book.shift_of(&task, ms("2026-04-03T07:00:00Z")).is_some());
    }
}
