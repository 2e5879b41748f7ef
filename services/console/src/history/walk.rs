//! One task's run history read backwards, message by message: the task's final run events
//! are a few literal subjects, and the server finds the last message of a subject before a
//! sequence from its subject index (a direct get, `multi_last` up to a sequence), walking back
//! only through the blocks between two of the task's events. Windows read by consumers would
//! make the server count every match from the window's start to the stream's end first: for one
//! task among 100,000 in a range hours back, that count, not the reading, was the cost.
//!
//! The walk keeps one frontier per subject (its newest message not yet taken), takes the
//! newest of them, and asks only that subject for its next older message; it stops after
//! [`PAGE`](super::PAGE) executions, at the range's start, or when every subject is exhausted.
//! A subject is asked only while it has messages before the frontier (its first sequence is
//! known), so the server never walks back to the stream's start for nothing.

use std::collections::{BinaryHeap, HashMap, HashSet};

use async_nats::jetstream::stream::{LastRawMessageErrorKind, Stream};
use chrono::{DateTime, Utc};
use jetsched_shared::direct_batch::DirectBatch;
use jetsched_shared::wire::Event;

/// An event and where it is stored.
pub(super) type Stored = (u64, Event);

/// What the walk found: the events of the newest executions, in stream order, and the
/// sequence the next (older) page starts before when some were left.
#[derive(Debug, Default)]
pub(super) struct Walked {
    pub(super) events: Vec<Stored>,
    pub(super) older: Option<u64>,
    /// Direct gets made.
    pub(super) reads: u64,
}

/// The final run events of `subjects` (literal subjects) stored before sequence `before` and
/// happened at or after `from`, newest first, until `runs` executions are whole.
pub(super) async fn walk_back(
    stream: &Stream,
    reader: &mut DirectBatch,
    subjects: &[String],
    before: u64,
    from: Option<DateTime<Utc>>,
    runs: usize,
) -> anyhow::Result<Walked> {
    let mut walked = Walked::default();
    let mut first = HashMap::new();
    for subject in subjects {
        walked.reads += 1;
        match stream.raw_message_builder().sequence(1).next_by_subject(subject.clone()).send().await {
            Ok(message) if message.sequence < before => {
                first.insert(subject.clone(), message.sequence);
            }
            Ok(_) => {}
            Err(error) if error.kind() == LastRawMessageErrorKind::NoMessageFound => {}
            Err(error) => return Err(error.into()),
        }
    }
    let asked: Vec<String> = first.keys().cloned().collect();
    let mut frontier = BinaryHeap::new();
    if !asked.is_empty() {
        walked.reads += 1;
        for message in reader.last_before(&asked, before).await? {
            frontier.push((message.sequence, message.subject, message.payload));
        }
    }
    let mut executions = HashSet::new();
    let mut taken = Vec::new();
    while let Some((sequence, subject, payload)) = frontier.pop() {
        // A message that is not an event is passed over; the walk goes on below it.
        if let Ok(event) = serde_json::from_slice::<Event>(&payload) {
            if from.is_some_and(|from| event.time < from) {
                break;
            }
            let execution = event.execution_id.clone().unwrap_or_default();
            if !executions.contains(&execution) && executions.len() == runs {
                walked.older = Some(sequence + 1);
                break;
            }
            executions.insert(execution);
            taken.push((sequence, event));
        }
        if first.get(&subject).is_some_and(|first| *first < sequence) {
            walked.reads += 1;
            for message in reader.last_before(&[subject], sequence).await? {
                frontier.push((message.sequence, message.subject, message.payload));
            }
        }
    }
    taken.reverse();
    walked.events = taken;
    Ok(walked)
}
