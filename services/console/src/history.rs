//! `/runs`: run history read from the events stream, not from the console's memory. A page is
//! the newest runs (by their final events: `run.succeeded`, `run.failed`, `run.dead`,
//! `run.skipped`) before a cursor (a stream sequence), inside a time range (`from`, `to`,
//! mapped to sequences by a binary search over the events' times), matching namespace, task
//! and outcome as subject filters. A filter naming a task is a few literal subjects, walked
//! back message by message from the cursor ([`walk`]): its cost follows the task's events, not
//! the stream's. Other filters read windows back from the cursor, each sized from how many
//! matches the ones before found, at most [`MAX_SCAN`] sequences per page: a page costs the
//! same whatever the history's size, and a sparse filter gives a short page with a cursor
//! further back.

mod walk;

use std::collections::HashSet;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::DeliverPolicy, stream::LastRawMessageErrorKind};
use axum::extract::{Query, RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, NaiveDateTime, Utc};
use futures::StreamExt;
use jetsched_shared::direct_batch::DirectBatch;
use jetsched_shared::names::Names;
use jetsched_shared::spec::validate_id;
use jetsched_shared::wire::Event;
use serde::Deserialize;

use self::walk::Stored;
use crate::pages;
use crate::runs::{RunRow, runs_from_events};
use crate::state::{AppState, html};

/// Runs per page.
pub(crate) const PAGE: usize = 50;
/// Most stream sequences one page reads (server-side filtered).
pub(crate) const MAX_SCAN: u64 = 200_000;
/// The first window, in sequences per run asked for.
const FIRST_WINDOW_PER_RUN: u64 = 8;
/// How much larger a window may be than the one before.
const MAX_GROWTH: u64 = 8;
/// How long a delivery the consumer announced may take.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The page's filters, as the query string gives them.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct HistoryQuery {
    #[serde(default)]
    pub(crate) outcome: String,
    #[serde(default)]
    pub(crate) namespace: String,
    #[serde(default)]
    pub(crate) task: String,
    /// `2026-12-04T10:00` (a `datetime-local` field, UTC) or RFC 3339.
    #[serde(default)]
    pub(crate) from: String,
    #[serde(default)]
    pub(crate) to: String,
    /// Runs whose final event is stored before this sequence (the "older" link).
    #[serde(default)]
    pub(crate) before: Option<u64>,
}

/// The query once checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Filter {
    pub(crate) subjects: Vec<String>,
    pub(crate) from: Option<DateTime<Utc>>,
    pub(crate) to: Option<DateTime<Utc>>,
    pub(crate) before: Option<u64>,
    /// The filter names a task: the stream is asked which literal subjects match (the
    /// namespace may be a wildcard), and they are walked back (see [`literal`]).
    pub(crate) narrow: bool,
}

/// Most literal subjects a task's filter becomes; past it, the wildcard filter is read by windows.
const MAX_NARROWED: usize = 64;

/// The event kinds of each outcome the filter offers (the final events of a run).
fn kinds(outcome: &str) -> Option<&'static [&'static str]> {
    Some(match outcome {
        "" => &["run.succeeded", "run.failed", "run.dead", "run.skipped"],
        "succeeded" => &["run.succeeded"],
        "failed" => &["run.failed"],
        "dead-lettered" => &["run.dead"],
        "skipped" => &["run.skipped"],
        _ => return None,
    })
}

/// Outcomes the history filter offers.
pub(crate) const OUTCOMES: [&str; 4] = ["succeeded", "failed", "dead-lettered", "skipped"];

/// A time as typed: RFC 3339, or `YYYY-MM-DDTHH:MM[:SS]` in UTC.
fn parse_time(text: &str) -> Option<DateTime<Utc>> {
    let text = text.trim();
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Some(t.with_timezone(&Utc));
    }
    ["%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M"]
        .iter()
        .find_map(|format| NaiveDateTime::parse_from_str(text, format).ok())
        .map(|t| t.and_utc())
}

impl HistoryQuery {
    /// The checked filter, or every problem of the query.
    pub(crate) fn check(&self, names: &Names) -> Result<Filter, Vec<String>> {
        let mut problems = Vec::new();
        let kinds = kinds(self.outcome.trim()).unwrap_or_else(|| {
            problems.push(format!("outcome: {:?} is not one of {}", self.outcome, OUTCOMES.join(", ")));
            &[]
        });
        let mut token = |field: &str, value: &str| -> String {
            let value = value.trim();
            if value.is_empty() {
                return "*".into();
            }
            if let Err(error) = validate_id(field, value) {
                problems.push(format!("{field}: {error}"));
            }
            value.to_string()
        };
        let namespace = token("namespace", &self.namespace);
        let task = token("task", &self.task);
        let narrow = task != "*";
        let mut instant = |field: &str, text: &str| {
            if text.trim().is_empty() {
                return None;
            }
            let parsed = parse_time(text);
            if parsed.is_none() {
                problems
                    .push(format!("{field}: {text:?} is not a time (2026-12-04T10:00, UTC, or RFC 3339)"));
            }
            parsed
        };
        let (from, to) = (instant("from", &self.from), instant("to", &self.to));
        if let (Some(from), Some(to)) = (from, to)
            && from >= to
        {
            problems.push("from: must be before to".into());
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        let subjects = kinds.iter().map(|kind| names.event_subject(kind, &namespace, &task)).collect();
        Ok(Filter { subjects, from, to, before: self.before, narrow })
    }
}

/// One page of history.
#[derive(Debug, Clone, Default)]
pub(crate) struct HistoryPage {
    pub(crate) rows: Vec<RunRow>,
    /// The cursor of the next (older) page, when there is more to read.
    pub(crate) older: Option<u64>,
    /// Stream sequences read for this page.
    pub(crate) scanned: u64,
}

/// The newest runs of the filter, [`PAGE`] at most.
pub(crate) async fn page(
    js: &jetstream::Context,
    names: &Names,
    filter: &Filter,
) -> anyhow::Result<HistoryPage> {
    let mut stream = js.get_stream(names.events_stream()).await?;
    let state = stream.info().await?.state.clone();
    if state.messages == 0 {
        return Ok(HistoryPage::default());
    }
    let literal = literal(&stream, filter).await?;
    if literal.as_ref().is_some_and(Vec::is_empty) {
        return Ok(HistoryPage::default());
    }
    let end = state.last_sequence + 1;
    let first = state.first_sequence.max(1);
    let mut upper = match filter.to {
        Some(to) => seq_at(&stream, names, to, first, end).await?,
        None => end,
    };
    if let Some(before) = filter.before {
        upper = upper.min(before);
    }
    let Some(subjects) = literal else {
        return windows(&stream, names, filter, first, upper).await;
    };
    let mut reader = DirectBatch::new(js.client(), &names.events_stream()).await?;
    let walked = walk::walk_back(&stream, &mut reader, &subjects, upper, filter.from, PAGE).await?;
    let rows = runs_from_events(walked.events.iter().map(|(_, e)| e), |_| true);
    Ok(HistoryPage { rows, older: walked.older, scanned: walked.reads })
}

/// A page read by windows back from `upper` (a filter that names no task).
async fn windows(
    stream: &jetstream::stream::Stream,
    names: &Names,
    filter: &Filter,
    first: u64,
    upper: u64,
) -> anyhow::Result<HistoryPage> {
    let subjects = &filter.subjects;
    let lower = match filter.from {
        Some(from) => seq_at(stream, names, from, first, upper.max(first)).await?,
        None => first,
    };
    let mut found: Vec<Stored> = Vec::new();
    let (mut start, mut window, mut scanned) = (upper, PAGE as u64 * FIRST_WINDOW_PER_RUN, 0u64);
    while start > lower && scanned < MAX_SCAN && executions(&found) < PAGE {
        let from = start.saturating_sub(window).max(lower);
        let mut older = read(stream, subjects, from, start).await?;
        scanned += start - from;
        older.append(&mut found);
        found = older;
        start = from;
        let needed = (PAGE - executions(&found).min(PAGE)) as u64;
        window = match found.len() as u64 {
            0 => window * MAX_GROWTH,
            n => (needed * scanned * 3 / 2 / n).clamp(PAGE as u64, window * MAX_GROWTH),
        }
        .min(MAX_SCAN.saturating_sub(scanned).max(1));
    }
    let (kept, cut) = newest_runs(found, PAGE);
    let older = cut.or((start > lower).then_some(start));
    let rows = runs_from_events(kept.iter().map(|(_, e)| e), |_| true);
    Ok(HistoryPage { rows, older, scanned })
}

/// The literal subjects a task's filter matches in the stream (at most [`MAX_NARROWED`]), when
/// the filter names a task; `None` to read the filter by windows. The server answers from its
/// subject index.
async fn literal(stream: &jetstream::stream::Stream, filter: &Filter) -> anyhow::Result<Option<Vec<String>>> {
    use futures::TryStreamExt;
    if !filter.narrow {
        return Ok(None);
    }
    let mut literal = Vec::new();
    for subject in &filter.subjects {
        let matches: Vec<(String, usize)> = stream.info_with_subjects(subject).await?.try_collect().await?;
        literal.extend(matches.into_iter().map(|(subject, _)| subject));
        if literal.len() > MAX_NARROWED {
            return Ok(None);
        }
    }
    literal.sort();
    Ok(Some(literal))
}

fn executions(events: &[Stored]) -> usize {
    events.iter().filter_map(|(_, e)| e.execution_id.as_deref()).collect::<HashSet<_>>().len()
}

/// The events of the newest `runs` executions among `events` (in stream order), and the
/// sequence the next page starts before when some were left out.
fn newest_runs(events: Vec<Stored>, runs: usize) -> (Vec<Stored>, Option<u64>) {
    let mut seen = HashSet::new();
    let mut cut = None;
    for (sequence, event) in events.iter().rev() {
        let execution = event.execution_id.as_deref().unwrap_or("");
        if !seen.contains(execution) && seen.len() == runs {
            cut = Some(*sequence + 1);
            break;
        }
        seen.insert(execution);
    }
    match cut {
        Some(cut) => (events.into_iter().filter(|(s, _)| *s >= cut).collect(), Some(cut)),
        None => (events, None),
    }
}

/// The first sequence whose event happened at or after `at` (`end` when none did): a binary
/// search over the stream by the events' own times (events are stored in the order they
/// happen), one read per step, about twenty for a million events.
async fn seq_at(
    stream: &jetstream::stream::Stream,
    names: &Names,
    at: DateTime<Utc>,
    first: u64,
    end: u64,
) -> anyhow::Result<u64> {
    let (mut low, mut high) = (first, end);
    while low < high {
        let middle = low + (high - low) / 2;
        let next = stream
            .raw_message_builder()
            .sequence(middle)
            .next_by_subject(names.events_wildcard())
            .send()
            .await;
        let message = match next {
            Ok(message) => message,
            Err(error) if error.kind() == LastRawMessageErrorKind::NoMessageFound => {
                high = middle;
                continue;
            }
            Err(error) => return Err(error.into()),
        };
        let happened = serde_json::from_slice::<Event>(&message.payload).map(|e| e.time).ok();
        match happened {
            Some(time) if time < at => low = message.sequence + 1,
            _ => high = middle,
        }
    }
    Ok(low)
}

/// The events matching `subjects` stored in `[from, to)`, in stream order.
async fn read(
    stream: &jetstream::stream::Stream,
    subjects: &[String],
    from: u64,
    to: u64,
) -> anyhow::Result<Vec<Stored>> {
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::OrderedConfig {
            filter_subjects: subjects.to_vec(),
            deliver_policy: DeliverPolicy::ByStartSequence { start_sequence: from },
            ..Default::default()
        })
        .await?;
    let mut pending = consumer.cached_info().num_pending;
    let mut out = Vec::new();
    if pending == 0 {
        return Ok(out);
    }
    let mut messages = consumer.messages().await?;
    while pending > 0 {
        let Ok(Some(message)) = tokio::time::timeout(READ_TIMEOUT, messages.next()).await else {
            anyhow::bail!("the events stream stopped delivering");
        };
        let message = message?;
        let info = message.info().map_err(|e| anyhow::anyhow!("event metadata: {e}"))?;
        if info.stream_sequence >= to {
            break;
        }
        pending = info.pending;
        if let Ok(event) = serde_json::from_slice::<Event>(&message.payload) {
            out.push((info.stream_sequence, event));
        }
    }
    Ok(out)
}

pub(crate) async fn runs(
    State(state): State<AppState>,
    Query(query): Query<HistoryQuery>,
    RawQuery(raw): RawQuery,
) -> Response {
    let filter = match query.check(&state.names) {
        Ok(filter) => filter,
        Err(problems) => {
            return html(
                StatusCode::BAD_REQUEST,
                pages::history::page(&query, "", Err(&problems), &state.trace),
            );
        }
    };
    let raw = raw.unwrap_or_default();
    match page(&state.js, &state.names, &filter).await {
        Ok(found) => html(StatusCode::OK, pages::history::page(&query, &raw, Ok(&found), &state.trace)),
        Err(error) => {
            let problems = [format!("read the events stream: {error:#}")];
            html(StatusCode::BAD_GATEWAY, pages::history::page(&query, &raw, Err(&problems), &state.trace))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jetsched_shared::wire::EventKind;

    fn query(outcome: &str, namespace: &str, task: &str, from: &str, to: &str) -> HistoryQuery {
        HistoryQuery {
            outcome: outcome.into(),
            namespace: namespace.into(),
            task: task.into(),
            from: from.into(),
            to: to.into(),
            before: None,
        }
    }

    #[test]
    fn filters_become_subjects_and_times() {
        let names = Names::new("js").expect("prefix");
        let filter = query("failed", "billing", "", "2026-12-04T10:00", "2026-12-04T11:30:00Z")
            .check(&names)
            .expect("valid");
        assert_eq!(filter.subjects, ["js.event.run.failed.billing.*"]);
        assert!(!filter.narrow, "a namespace without a task is read by windows");
        assert_eq!(
            filter.from,
            DateTime::parse_from_rfc3339("2026-12-04T10:00:00Z").ok().map(|t| t.to_utc())
        );
        assert_eq!(filter.to, DateTime::parse_from_rfc3339("2026-12-04T11:30:00Z").ok().map(|t| t.to_utc()));
        let any = query("", "", "nightly", "", "").check(&names).expect("valid");
        assert_eq!(any.subjects.len(), 4);
        assert!(any.subjects.iter().all(|s| s.ends_with(".*.nightly")), "{:?}", any.subjects);
        assert!(any.narrow, "a task without its namespace is narrowed to literal subjects");
        let both = query("", "billing", "nightly", "", "").check(&names).expect("valid");
        assert!(both.narrow, "a task is walked back by its literal subjects");
        let namespace = query("", "billing", "", "", "").check(&names).expect("valid");
        assert!(!namespace.narrow, "a namespace alone is read by windows");
    }

    #[test]
    fn every_problem_of_a_query_is_named() {
        let names = Names::new("js").expect("prefix");
        let problems =
            query("won", "a.b", "x>", "yesterday", "2026-12-04T10:00").check(&names).expect_err("refused");
        let text = problems.join("\n");
        for field in ["outcome:", "namespace:", "task:", "from:"] {
            assert!(text.contains(field), "{field} in {text}");
        }
        let reversed =
            query("", "", "", "2026-12-04T11:00", "2026-12-04T10:00").check(&names).expect_err("refused");
        assert_eq!(reversed, ["from: must be before to"]);
    }

    fn stored(sequence: u64, kind: EventKind, execution: &str) -> Stored {
        (sequence, Event { execution_id: Some(execution.into()), ..Event::new(kind, "ns", "t") })
    }

    #[test]
    fn a_page_keeps_the_newest_runs_whole_and_cuts_before_the_oldest_kept() {
        let events = vec![
            stored(10, EventKind::RunSucceeded, "a"),
            stored(11, EventKind::RunFailed, "b"),
            stored(12, EventKind::RunDead, "b"),
            stored(13, EventKind::RunSucceeded, "c"),
        ];
        let (kept, cut) = newest_runs(events.clone(), 2);
        assert_eq!(kept.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [11, 12, 13]);
        assert_eq!(cut, Some(11));
        let (all, cut) = newest_runs(events, 3);
        assert_eq!((all.len(), cut), (4, None));
    }
}
