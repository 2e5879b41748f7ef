//! `/events`: recent events with filters by kind and task, and the live tail (Server-Sent
//! Events carrying rendered rows; without JavaScript the page still lists the recent ones).

use jetsched_shared::names::SYSTEM_NAMESPACE;
use jetsched_shared::wire::{Event, EventKind};
use maud::{Markup, html};
use serde::Deserialize;

use super::{layout, task_href, when};
use crate::trace::TraceLinks;

/// Every kind, for the filter.
pub(crate) const KINDS: [EventKind; 35] = [
    EventKind::TaskRegistered,
    EventKind::TaskUpdated,
    EventKind::TaskDeleted,
    EventKind::TaskPaused,
    EventKind::TaskResumed,
    EventKind::TaskRejected,
    EventKind::FireDispatched,
    EventKind::FireSkipped,
    EventKind::FireMissed,
    EventKind::RunStarted,
    EventKind::RunSucceeded,
    EventKind::RunFailed,
    EventKind::RunRetrying,
    EventKind::RunDead,
    EventKind::RunSkipped,
    EventKind::RunHeld,
    EventKind::RunCancelled,
    EventKind::BreakerOpened,
    EventKind::BreakerHalfOpened,
    EventKind::BreakerClosed,
    EventKind::LimitThrottled,
    EventKind::LeaderAcquired,
    EventKind::LeaderLost,
    EventKind::QueuePaused,
    EventKind::QueueResumed,
    EventKind::LimitSaturated,
    EventKind::SchedulerClockSkew,
    EventKind::TriggerDeduplicated,
    EventKind::TriggerDebounced,
    EventKind::BackfillStarted,
    EventKind::BackfillProgress,
    EventKind::BackfillFinished,
    EventKind::BackfillCancelled,
    EventKind::TaskCompleted,
    EventKind::AfterExpired,
];

/// The filters of the events page and its stream.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct EventFilter {
    /// A kind (`run.failed`) or a family (`run`); empty: all.
    #[serde(default)]
    pub(crate) kind: String,
    /// `namespace/id`, or part of a task id; empty: all.
    #[serde(default)]
    pub(crate) task: String,
}

impl EventFilter {
    pub(crate) fn matches(&self, event: &Event) -> bool {
        let kind = event.kind.as_str();
        let kind_ok = self.kind.is_empty()
            || kind == self.kind
            || kind.split_once('.').is_some_and(|(family, _)| family == self.kind);
        let task = self.task.trim();
        let task_ok = task.is_empty()
            || match task.split_once('/') {
                Some((namespace, id)) => event.namespace == namespace && event.task_id == id,
                None => event.task_id.contains(task),
            };
        kind_ok && task_ok
    }

    /// The query string of the live stream.
    pub(crate) fn query(&self) -> String {
        let mut url = String::new();
        for (key, value) in [("kind", &self.kind), ("task", &self.task)] {
            if !value.is_empty() {
                url.push_str(if url.is_empty() { "?" } else { "&" });
                url.push_str(key);
                url.push('=');
                url.push_str(&encode(value));
            }
        }
        url
    }
}

/// Percent-encodes a query value.
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'/' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Whether an event is about a task, which has a page: not the scheduler's own events (leader,
/// clock skew, in the system namespace), nor a breaker's other than a task's own.
fn names_a_task(event: &Event) -> bool {
    let breaker_of_a_task = event.key.as_deref().is_none_or(|key| key.starts_with("task."));
    event.namespace != SYSTEM_NAMESPACE && breaker_of_a_task
}

/// One event as a table row (also what the live stream sends); its execution links to the
/// run's page and, with `--trace-url`, to its trace.
pub(crate) fn row(event: &Event, trace: &TraceLinks) -> Markup {
    html! {
        tr class="event" {
            td { (when(event.time)) }
            td { span class={"badge " (event.kind.as_str().replace('.', "-"))} { (event.kind.as_str()) } }
            td {
                @if let Some(key) = event.key.as_deref().filter(|_| event.kind.as_str().starts_with("breaker.")) {
                    a.breaker href=(super::breaker_href(key)) { "breaker " (key) } " "
                }
                @if names_a_task(event) { a href=(task_href(&event.namespace, &event.task_id)) { (event.namespace) "/" (event.task_id) } }
                @else { (event.namespace) "/" (event.task_id) }
            }
            td { @if let Some(execution) = &event.execution_id {
                a href={"/runs/" (execution)} { code { (execution) } }
                (trace.link(event.trace_id.as_deref().unwrap_or(execution)))
            } }
            td { @if let Some(attempt) = event.attempt { (attempt) } }
            td.error-text {
                @if let Some(error) = &event.error { (error) }
                @if let Some(reason) = &event.reason { " " (reason) }
                @if let Some(instance) = &event.instance { " " (instance) }
            }
        }
    }
}

/// Events, newest first.
pub(crate) fn table(events: &[Event], trace: &TraceLinks) -> Markup {
    html! {
        table.events {
            thead { tr { th scope="col" { "Time" } th scope="col" { "Kind" } th scope="col" { "Task" } th scope="col" { "Execution" } th scope="col" { "Attempt" } th scope="col" { "Details" } } }
            tbody #event-rows { @for event in events { (row(event, trace)) } }
        }
        @if events.is_empty() { p.empty { "No event yet." } }
    }
}

pub(crate) fn page(events: &[Event], filter: &EventFilter, trace: &TraceLinks) -> Markup {
    layout(
        "Events",
        "/events",
        html! {
            form.filters method="get" action="/events" {
                label { "Kind "
                    select name="kind" {
                        option value="" selected[filter.kind.is_empty()] { "any" }
                        @for family in ["task", "fire", "run", "leader"] { option value=(family) selected[filter.kind == family] { (family) ".*" } }
                        @for kind in KINDS { option value=(kind.as_str()) selected[filter.kind == kind.as_str()] { (kind.as_str()) } }
                    }
                }
                label { "Task " input type="text" name="task" value=(filter.task) placeholder="namespace/id"; }
                " " button type="submit" { "Filter" }
            }
            p #live-status data-stream={"/events/stream" (filter.query())} { "Live: waiting for events (needs JavaScript; reload otherwise)." }
            (table(events, trace))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_by_kind_family_and_task() {
        let event = Event::new(EventKind::RunFailed, "billing", "nightly");
        let matches =
            |kind: &str, task: &str| EventFilter { kind: kind.into(), task: task.into() }.matches(&event);
        assert!(matches("", ""));
        assert!(
            matches("run", "")
                && matches("run.failed", "")
                && !matches("run.succeeded", "")
                && !matches("fire", "")
        );
        assert!(matches("", "billing/nightly") && matches("", "night") && !matches("", "ops/nightly"));
        let filter = EventFilter { kind: "run".into(), task: "a b&c".into() };
        assert_eq!(filter.query(), "?kind=run&task=a%20b%26c");
    }

    #[test]
    fn rows_escape_errors() {
        let event = Event {
            error: Some("<svg onload=alert(1)>".into()),
            ..Event::new(EventKind::RunFailed, "n", "t")
        };
        let html = row(&event, &TraceLinks::default()).into_string();
        assert!(html.contains("&lt;svg onload=alert(1)&gt;") && !html.contains("<svg"), "{html}");
    }

    #[test]
    fn the_filter_offers_every_kind() {
        // A kind added to the enum fails to compile here until it is given a place in KINDS.
        fn place(kind: EventKind) -> usize {
            use EventKind::*;
            match kind {
                TaskRegistered => 0,
                TaskUpdated => 1,
                TaskDeleted => 2,
                TaskPaused => 3,
                TaskResumed => 4,
                TaskRejected => 5,
                FireDispatched => 6,
                FireSkipped => 7,
                FireMissed => 8,
                RunStarted => 9,
                RunSucceeded => 10,
                RunFailed => 11,
                RunRetrying => 12,
                RunDead => 13,
                RunSkipped => 14,
                RunHeld => 15,
                RunCancelled => 16,
                BreakerOpened => 17,
                BreakerHalfOpened => 18,
                BreakerClosed => 19,
                LimitThrottled => 20,
                LeaderAcquired => 21,
                LeaderLost => 22,
                QueuePaused => 23,
                QueueResumed => 24,
                LimitSaturated => 25,
                SchedulerClockSkew => 26,
                TriggerDeduplicated => 27,
                TriggerDebounced => 28,
                BackfillStarted => 29,
                BackfillProgress => 30,
                BackfillFinished => 31,
                BackfillCancelled => 32,
                TaskCompleted => 33,
                AfterExpired => 34,
            }
        }
        for (i, kind) in KINDS.iter().enumerate() {
            assert_eq!(place(*kind), i, "{kind:?}");
        }
    }

    #[test]
    fn only_events_about_a_task_link_to_a_task_page() {
        let leader = Event::new(EventKind::LeaderAcquired, SYSTEM_NAMESPACE, "scheduler");
        let own = Event {
            key: Some("task.billing.nightly".into()),
            ..Event::new(EventKind::BreakerOpened, "billing", "nightly")
        };
        let named = Event {
            key: Some("key.billing.payments".into()),
            ..Event::new(EventKind::BreakerOpened, "billing", "payments")
        };
        let run = Event::new(EventKind::RunFailed, "billing", "nightly");
        let links: Vec<bool> = [&leader, &own, &named, &run]
            .map(|e| row(e, &TraceLinks::default()).into_string().contains("href=\"/tasks/"))
            .to_vec();
        assert_eq!(links, [false, true, false, true]);
        let to_breaker = |e: &Event| {
            row(e, &TraceLinks::default()).into_string().contains("href=\"/breakers/key.billing.payments\"")
        };
        assert!(to_breaker(&named) && !to_breaker(&run));
    }
}
