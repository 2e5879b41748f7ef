//! Triggers: a run now, or the task's debounced run joined, with an optional payload; at most
//! once per de-duplication key within its time to live.
//!
//! With a key, the trigger first claims it ([`claim`](super::claim)) holding its execution id
//! and what it asked for, then runs, then marks the claim done. A trigger that finds the key
//! claimed answers the claim's execution id (`deduplicated`) and runs nothing, except when the
//! claim is not marked done: its registry may have died between claim and dispatch, so the
//! trigger carries it out itself with the claim's execution id and payload. A run dispatched
//! now has a message id derived from its execution id, so a claim carried out twice (its
//! registry was only slow) is stored once by the dispatch stream's de-duplication; a debounced
//! trigger joins the window once more (one more trigger counted, the same payload).

use std::time::Duration;

use chrono::{DateTime, Utc};
use jetsched_shared::dispatch::{self, DispatchMessage, Origin, SpecBody, Target};
use jetsched_shared::names::{DedupeScope, dedupe_key, task_key};
use jetsched_shared::spec::{Priority, TaskSpec};
use jetsched_shared::wire::{DedupeClaim, Event, EventKind, Trigger, TriggerReply, fresh_execution_id};

use super::claim::Claim;
use super::{Latest, TaskStore, decode, not_found};
use crate::failure::Failure;

/// What a trigger asks for, validated.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TriggerAsk {
    /// The lane of this run instead of the spec's.
    pub priority: Option<Priority>,
    /// Given to the run instead of the spec's body or payload.
    pub payload: Option<serde_json::Value>,
    /// At most one run per key within its time to live.
    pub dedupe: Option<DedupeAsk>,
}

/// A de-duplication key and how long it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DedupeAsk {
    pub key: String,
    pub ttl: Duration,
}

impl TaskStore {
    /// Triggers one run of a task as `ask` says: dispatched now, or joined to its pending
    /// debounced run; with a de-duplication key, at most once per key.
    pub async fn trigger(&self, namespace: &str, id: &str, ask: TriggerAsk) -> Result<TriggerReply, Failure> {
        crate::spans::task(namespace, id);
        let entry = self.entry(&task_key(namespace, id)).await?.ok_or_else(|| not_found(namespace, id))?;
        let spec = decode(&entry)?;
        let now = Utc::now();
        let Some(dedupe) = &ask.dedupe else {
            let execution_id = fresh_execution_id();
            return self.run(&spec, &entry, &execution_id, ask.payload.as_ref(), ask.priority, now).await;
        };
        let key = dedupe_key(namespace, id, DedupeScope::Trigger, &dedupe.key);
        let claim = DedupeClaim {
            at: now,
            ttl_s: dedupe.ttl.as_secs(),
            execution_id: Some(fresh_execution_id()),
            done: false,
            payload: ask.payload.clone(),
            priority: ask.priority,
            intake_sequence: None,
        };
        let (mut claim, sequence, reply) = match self.claim(&key, &claim).await? {
            Claim::Claimed { sequence } => {
                let execution_id = claim.execution_id.clone().unwrap_or_else(fresh_execution_id);
                let reply =
                    self.run(&spec, &entry, &execution_id, ask.payload.as_ref(), ask.priority, now).await?;
                (claim, sequence, reply)
            }
            Claim::Held { claim: held, sequence } => {
                let execution_id = held.execution_id.clone().unwrap_or_else(fresh_execution_id);
                let mut reply = if held.done {
                    let nominal_time = held.at;
                    TriggerReply {
                        execution_id,
                        namespace: namespace.to_string(),
                        id: id.to_string(),
                        nominal_time,
                        stream_sequence: None,
                        deduplicated: true,
                        debounced: false,
                        triggers: None,
                    }
                } else {
                    // Its registry may have died before the run: carry the claim out.
                    self.run(&spec, &entry, &execution_id, held.payload.as_ref(), held.priority, now).await?
                };
                reply.deduplicated = true;
                self.emit(Event {
                    execution_id: Some(reply.execution_id.clone()),
                    trigger: Some(Trigger::Manual),
                    key: Some(dedupe.key.clone()),
                    ..Event::new(EventKind::TriggerDeduplicated, namespace, id)
                })
                .await;
                if held.done {
                    return Ok(reply);
                }
                (held, sequence, reply)
            }
        };
        claim.execution_id = Some(reply.execution_id.clone());
        claim.done = true;
        claim.payload = None;
        self.settle_claim(&key, sequence, &claim, Utc::now()).await;
        Ok(reply)
    }

    /// One run of `spec` with `execution_id`: dispatched now, or joined to the pending run
    /// when the task debounces its triggers.
    async fn run(
        &self,
        spec: &TaskSpec,
        entry: &Latest,
        execution_id: &str,
        payload: Option<&serde_json::Value>,
        priority: Option<Priority>,
        now: DateTime<Utc>,
    ) -> Result<TriggerReply, Failure> {
        let (namespace, id) = (spec.namespace.as_str(), spec.id.as_str());
        let mut reply = TriggerReply {
            execution_id: execution_id.to_string(),
            namespace: namespace.to_string(),
            id: id.to_string(),
            nominal_time: now,
            stream_sequence: None,
            deduplicated: false,
            debounced: false,
            triggers: None,
        };
        if let Some(debounce) = spec.debounce {
            let joined = self.debounce(spec, entry, debounce, execution_id, payload, priority, now).await?;
            if joined.triggers.is_power_of_two() {
                self.emit(Event {
                    execution_id: Some(joined.execution_id.clone()),
                    trigger: Some(Trigger::Manual),
                    release_at: Some(joined.starts_at),
                    revision: Some(entry.revision),
                    triggers: Some(joined.triggers),
                    ..Event::new(EventKind::TriggerDebounced, namespace, id)
                })
                .await;
            }
            reply.execution_id = joined.execution_id;
            reply.nominal_time = joined.starts_at;
            reply.debounced = true;
            reply.triggers = Some(joined.triggers);
            return Ok(reply);
        }
        // The stored spec JSON goes into the dispatch as it is (it just parsed).
        // The request's span, when traced, is the parent of the run.
        let parent = crate::spans::dispatch_parent();
        let DispatchMessage { subject, message, trace_id, .. } = dispatch::build_traced(
            &self.names,
            Target::of(spec, entry.revision).with_priority(priority),
            Origin::Requested { at: now, execution_id, payload },
            SpecBody::Json(&entry.value),
            parent.as_ref(),
        )
        .map_err(|e| Failure::internal("encode dispatch", e))?;
        let ack = self
            .js
            .send_publish(subject, message)
            .await
            .map_err(|e| Failure::unavailable("publish dispatch", e))?
            .await
            .map_err(|e| Failure::unavailable("store dispatch", e))?;
        // A dispatch carried out again (a de-duplication claim) is stored once: one event.
        if !ack.duplicate {
            self.emit(Event {
                execution_id: Some(execution_id.to_string()),
                nominal_time: Some(now),
                trigger: Some(Trigger::Manual),
                revision: Some(entry.revision),
                trace_id,
                ..Event::new(EventKind::FireDispatched, namespace, id)
            })
            .await;
        }
        reply.stream_sequence = Some(ack.sequence);
        Ok(reply)
    }
}
