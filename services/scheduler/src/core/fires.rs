//! Fires, from due to acknowledged: the wheel's due tasks into the pipeline, the pump that
//! publishes within the window behind the lease fence and the overlap turns, acks into fire
//! counts and fire state, and the coalesced fire-state writes.

use async_nats::jetstream::message::OutboundMessage;
use jetsched_shared::calendar::Refusal;
use jetsched_shared::dispatch::{self, Origin, SpecBody, Target};
use jetsched_shared::trace;
use jetsched_shared::wire::{Event as WireEvent, EventKind, Trigger, scheduled_execution_id};
use tokio::task::JoinError;
use tokio::time::Instant;
use tracing::Instrument;

use super::Core;
use crate::acks::Acked;
use crate::calendars::Fate;
use crate::catchup::SkipReason;
use crate::fire::Fire;
use crate::flush::{Flushed, Step};
use crate::overlap::{self, Admission, Checked, Decision, Prior, Queued, Room};
use crate::spans::{self, FireFacts};
use crate::tasks::from_ms;
use crate::timer::DenseKey;

impl Core {
    /// The wheel's deadline passed: due tasks fire (queued while leading, passed otherwise)
    /// and get their next fire.
    pub(super) fn on_wake(&mut self) {
        let due = self.wake.take_due(self.time.now_ms());
        let leading = self.takeover.leading();
        for &(DenseKey(idx), _) in &due {
            let Some(slot) = self.tasks.get_mut(idx) else { continue };
            let Some(nominal) = slot.next_ms.take() else { continue };
            let fate = self.calendars.fate(&slot.info, slot.cursor_ms, nominal);
            slot.cursor_ms = nominal;
            match fate {
                Fate::Due { .. } if leading => {
                    slot.inflight += 1;
                    let generation = slot.generation;
                    self.pipeline.push(Fire {
                        idx,
                        generation,
                        nominal_ms: nominal,
                        trigger: Trigger::Schedule,
                    });
                }
                Fate::Skip(refusal) if leading => self.skip_by_calendar(idx, nominal, Some(&refusal), None),
                Fate::Merged { floor_ms, refusal } if leading => {
                    self.skip_by_calendar(idx, nominal, refusal.as_ref(), Some(floor_ms));
                }
                _ => {}
            }
            self.wake.schedule_next(&mut self.tasks, idx, &self.calendars);
        }
        self.wake.recycle(due);
    }

    /// `fire.skipped` (reason `calendar`, naming the calendar and the date it refused, if one
    /// refused this fire; for a fire merged into the one made at `merged_at`, that time as
    /// `shifted_to`: it runs once, as that fire), and the fire state advances past the fire.
    pub(super) fn skip_by_calendar(
        &mut self,
        idx: u32,
        nominal: i64,
        refusal: Option<&Refusal>,
        merged_at: Option<i64>,
    ) {
        let Some(slot) = self.tasks.get_mut(idx) else { return };
        let reason = "calendar";
        self.report.metrics.skipped.with_label_values(&[reason]).inc();
        let info = &slot.info;
        spans::skipped(info.namespace(), info.task_id(), nominal, reason, self.takeover.term());
        self.report.emit(WireEvent {
            nominal_time: Some(from_ms(nominal)),
            trigger: Some(Trigger::Schedule),
            reason: Some(reason.to_string()),
            calendar: refusal.map(|r| r.calendar.clone()),
            calendar_date: refusal.map(|r| r.date.format("%Y-%m-%d").to_string()),
            shifted_to: merged_at.map(from_ms),
            instance: Some(self.report.instance.clone()),
            term: self.takeover.term(),
            ..WireEvent::new(EventKind::FireSkipped, info.namespace(), info.task_id())
        });
        // Handled once every fire before it is: the fire state then covers it too.
        slot.pending_ms = Some(slot.pending_ms.map_or(nominal, |p| p.max(nominal)));
        let generation = slot.generation;
        if slot.inflight == 0 {
            let pending = slot.pending_ms.take();
            slot.done_ms = slot.done_ms.max(pending);
            self.flush.mark(&mut self.tasks, idx, Instant::now());
        }
        // A skipped last fire completes the task too (a skipped fire does not count towards
        // `max_runs`: the window's end is past the last fire that runs).
        self.completed_if_last(idx, generation, nominal);
    }

    /// Publishes queued fires while the window has room and the lease is valid.
    pub(super) async fn pump(&mut self) {
        if !self.takeover.leading() {
            return;
        }
        while let Some(fire) = self.pipeline.next() {
            // Fencing: never publish once the lease may have lapsed. The fire waits for the
            // lease task's verdict: a late `Renewed` resumes, `Lost` steps down.
            let term = match self.takeover.publish_term(Instant::now()) {
                Ok(term) => term,
                Err(just_fenced) => {
                    self.pipeline.push_front(fire);
                    if just_fenced {
                        tracing::warn!(
                            term = self.takeover.term(),
                            "lease deadline passed; dispatch paused until renewed"
                        );
                    }
                    break;
                }
            };
            if !self.admit(fire) {
                continue;
            }
            let Some((slot, spec_json)) = self.tasks.live_with_spec(fire.idx, fire.generation) else {
                continue;
            };
            let info = &slot.info;
            let target = Target {
                namespace: info.namespace(),
                task_id: info.task_id(),
                queue: &info.queue,
                revision: info.revision,
                priority: info.priority,
            };
            let catchup = fire.trigger == Trigger::Catchup;
            let origin = Origin::Scheduled { nominal_ms: fire.nominal_ms, term, catchup };
            // The stored spec JSON is spliced into the body as it is.
            let spec = SpecBody::Json(spec_json);
            let span = spans::fire(FireFacts {
                namespace: target.namespace,
                task_id: target.task_id,
                nominal_ms: fire.nominal_ms,
                trigger: fire.trigger,
                term,
                now_ms: self.time.now_ms(),
            });
            let parent = span.as_ref().map(|(_, cx)| cx);
            let message = match dispatch::build_traced(&self.nats.names, target, origin, spec, parent) {
                Ok(message) => message,
                Err(error) => {
                    tracing::error!(%error, task = %slot.info.key(), "cannot encode dispatch; fire dropped");
                    slot.inflight = slot.inflight.saturating_sub(1);
                    continue;
                }
            };
            // A fire held for its parents goes to the registry instead, as the same dispatch.
            let subject = match slot.info.held {
                true => self.nats.names.after_fire_subject(target.namespace, target.task_id),
                false => message.subject,
            };
            let (number, reply) = self.pipeline.reply_to(fire, Instant::now());
            let OutboundMessage { subject, payload, headers } = message.message.outbound_message(subject);
            let publish = self.nats.client.publish_with_reply_and_headers(
                subject,
                reply,
                headers.unwrap_or_default(),
                payload,
            );
            let published = match &span {
                Some((span, _)) => publish.instrument(span.clone()).await,
                None => publish.await,
            };
            if let Err(error) = published {
                self.pipeline.unsent(number);
                self.report.metrics.publish_errors.inc();
                tracing::warn!(%error, task = %slot.info.key(), nominal = fire.nominal_ms, "publish failed; retrying");
                self.pipeline.retry_later(fire, Instant::now());
            }
        }
        self.pipeline.pace(Instant::now());
        self.report.metrics.publish_inflight.set(self.pipeline.inflight() as i64);
    }

    /// A publish was acknowledged: it and every other ack already arrived are handled before
    /// the next round of publishing (bounded by the window: nothing is published meanwhile).
    pub(super) fn on_ack(&mut self, acked: Acked) {
        self.acked(acked);
        while let Some(acked) = self.pipeline.ready_ack() {
            self.acked(acked);
        }
        self.report.metrics.publish_inflight.set(self.pipeline.inflight() as i64);
    }

    fn acked(&mut self, (fire, result): Acked) {
        let metrics = &self.report.metrics;
        let ack = match result {
            Ok(ack) => ack,
            Err(error) => {
                metrics.publish_errors.inc();
                if self.takeover.holds() {
                    tracing::warn!(%error, nominal = fire.nominal_ms, "dispatch not acknowledged; retrying");
                    self.pipeline.retry_later(fire, Instant::now());
                }
                return;
            }
        };
        let trigger = fire.trigger.as_str();
        let lag_ms = self.time.now_ms() - fire.nominal_ms;
        metrics.lag.with_label_values(&[trigger]).observe(lag_ms as f64 / 1000.0);
        let Some(slot) = self.tasks.get_live(fire.idx, fire.generation) else { return };
        if ack.duplicate {
            metrics.duplicates.inc();
        } else {
            metrics.dispatched.with_label_values(&[trigger]).inc();
            self.report.partitions.fired(&slot.info);
            slot.fires += 1;
        }
        // A duplicate is the fire's dispatch stored already: by this scheduler (a retry after
        // a lost acknowledgement) or by a leader that stepped down before its acknowledgement
        // came. Its event is emitted again: named after the execution, the stream keeps one.
        if self.report.fire_events {
            let info = &slot.info;
            let execution_id = scheduled_execution_id(info.namespace(), info.task_id(), fire.nominal_ms);
            // A fire a calendar shifted says which calendar, which date and where it moved.
            let shift = match fire.trigger {
                Trigger::Schedule | Trigger::Catchup => self.calendars.shift_of(info, fire.nominal_ms),
                _ => None,
            };
            self.report.emit(WireEvent {
                calendar: shift.as_ref().map(|(r, _)| r.calendar.clone()),
                calendar_date: shift.as_ref().map(|(r, _)| r.date.format("%Y-%m-%d").to_string()),
                shifted_to: shift.as_ref().map(|&(_, at)| from_ms(at)),
                trace_id: trace::trace_id_of(&execution_id).map(|id| id.to_string()),
                execution_id: Some(execution_id),
                nominal_time: Some(from_ms(fire.nominal_ms)),
                trigger: Some(fire.trigger),
                instance: Some(self.report.instance.clone()),
                term: self.takeover.term(),
                // Sent to the registry rather than to the workers.
                reason: info.held.then(|| "held until its parents' runs meet its rule".to_string()),
                ..WireEvent::new(EventKind::FireDispatched, info.namespace(), info.task_id())
            });
        }
        self.completed_if_last(fire.idx, fire.generation, fire.nominal_ms);
        self.handled(&fire);
    }

    /// `task.completed` when `nominal_ms` is the task's last fire (its one-shot, the last before
    /// `end_at`, the `max_runs`-th): emitted before the fire state covering it is written, and
    /// named after the task and the fire, so a leader that handles the fire again (after its
    /// predecessor died) adds no second event.
    pub(super) fn completed_if_last(&self, idx: u32, generation: u32, nominal_ms: i64) {
        let Some(slot) = self.tasks.get(idx).filter(|slot| slot.generation == generation) else { return };
        let info = &slot.info;
        let Some(reason) = info.ended_by(nominal_ms) else { return };
        self.report.emit(WireEvent {
            nominal_time: Some(from_ms(nominal_ms)),
            reason: Some(reason.as_str().to_string()),
            revision: Some(info.revision),
            instance: Some(self.report.instance.clone()),
            term: self.takeover.term(),
            ..WireEvent::new(EventKind::TaskCompleted, info.namespace(), info.task_id())
        });
    }

    /// A queued fire is handled (stored or skipped): once none of the task's is pending, the
    /// fire state advances past the latest.
    fn handled(&mut self, fire: &Fire) {
        let Some(slot) = self.tasks.get_live(fire.idx, fire.generation) else { return };
        slot.inflight = slot.inflight.saturating_sub(1);
        slot.pending_ms = Some(slot.pending_ms.map_or(fire.nominal_ms, |p| p.max(fire.nominal_ms)));
        if slot.inflight == 0 {
            let pending = slot.pending_ms.take();
            slot.done_ms = slot.done_ms.max(pending);
            self.flush.mark(&mut self.tasks, fire.idx, Instant::now());
        }
    }

    // ---- overlap -----------------------------------------------------------------------

    /// Whether `fire` may be published now. A fire of a gated task whose previous scheduled
    /// run may still be going is held for a check (its decision comes back as
    /// an overlap event), or skipped when another fire of the task already waits; under
    /// `cancel_other` and `replace` it takes the waiting fire's place instead (that one is
    /// skipped, reason `replaced`) and the previous run is cancelled as the policy says.
    fn admit(&mut self, fire: Fire) -> bool {
        let Some(slot) = self.tasks.get_live(fire.idx, fire.generation) else { return true };
        let policy = slot.info.overlap;
        let admission = self.overlap.admit(fire, policy, slot.done_ms);
        if let Some(replaced) = self.overlap.take_replaced() {
            self.skip(&replaced, SkipReason::Replaced);
        }
        let Some(slot) = self.tasks.get_live(fire.idx, fire.generation) else { return true };
        match admission {
            Admission::Publish => true,
            Admission::Skip => {
                self.skip(&fire, SkipReason::Overlap);
                false
            }
            Admission::Check(prior_ms, previous) => {
                let info = &slot.info;
                let prior = Prior {
                    execution_id: scheduled_execution_id(info.namespace(), info.task_id(), prior_ms),
                    previous,
                    age: overlap::age(prior_ms, self.time.now_ms()),
                    ttl: self.nats.runs_ttl,
                };
                if overlap::newest_wins(policy) {
                    let room = Room {
                        runs: self.nats.runs.clone(),
                        cancels: self.nats.cancels.clone(),
                        events: self.report.events.clone(),
                        policy,
                        prior,
                        prior_ms,
                        namespace: info.namespace().to_string(),
                        task_id: info.task_id().to_string(),
                        queue: info.queue.to_string(),
                        fire_ms: fire.nominal_ms,
                        fire_execution: scheduled_execution_id(
                            info.namespace(),
                            info.task_id(),
                            fire.nominal_ms,
                        ),
                        queued: Queued {
                            stream: self.nats.dispatches.clone(),
                            subject: self.nats.names.lane_subject(
                                &info.queue,
                                info.priority,
                                info.namespace(),
                                info.task_id(),
                            ),
                        },
                    };
                    self.overlap.make_room(fire, room);
                } else {
                    self.overlap.check(fire, policy, prior, self.nats.runs.clone());
                }
                false
            }
        }
    }

    pub(super) fn on_decided(&mut self, checked: Checked) {
        let fire = checked.0;
        match self.overlap.decided(checked) {
            Some(Decision::Dispatch) => self.pipeline.push_front(fire),
            Some(Decision::Skip) => self.skip(&fire, SkipReason::Overlap),
            None => {}
        }
    }

    /// `fire.skipped` (reason `overlap` or `replaced`) and the fire state advances past the fire.
    fn skip(&mut self, fire: &Fire, reason: SkipReason) {
        let Some(slot) = self.tasks.get_live(fire.idx, fire.generation) else { return };
        let reason = reason.as_str();
        self.report.metrics.skipped.with_label_values(&[reason]).inc();
        let info = &slot.info;
        spans::skipped(info.namespace(), info.task_id(), fire.nominal_ms, reason, self.takeover.term());
        self.report.emit(WireEvent {
            nominal_time: Some(from_ms(fire.nominal_ms)),
            trigger: Some(fire.trigger),
            reason: Some(reason.to_string()),
            instance: Some(self.report.instance.clone()),
            term: self.takeover.term(),
            ..WireEvent::new(EventKind::FireSkipped, info.namespace(), info.task_id())
        });
        self.completed_if_last(fire.idx, fire.generation, fire.nominal_ms);
        self.handled(fire);
    }

    // ---- fire state --------------------------------------------------------------------

    /// Writes the dirty fire states (coalesced since the last flush), unless dispatch goes
    /// first; `force` writes regardless (shutdown).
    pub(super) fn flush(&mut self, force: bool) {
        let now = Instant::now();
        if self.flush.step(self.pipeline.busy(), force, now) != Step::Write {
            return;
        }
        let Some(valid_until) = self.takeover.valid_until(now) else { return };
        // A fire state says "handled up to here": it is written only after the events of the
        // fires it covers (skipped, missed) are stored, so a leader dying in between leaves
        // them to its successor instead of skipping them silently.
        let events = self.report.events.barrier();
        self.flush.write(&mut self.tasks, &self.nats.state, events, valid_until);
    }

    pub(super) fn on_written(&mut self, result: Result<Flushed, JoinError>) {
        let (stored, failed) = self.flush.ended(result);
        let writes = &self.report.metrics.state_writes;
        writes.with_label_values(&["stored"]).inc_by(stored);
        writes.with_label_values(&["failed"]).inc_by(failed.len() as u64);
        if self.takeover.holds() {
            let now = Instant::now();
            for (idx, generation) in failed {
                if self.tasks.get_live(idx, generation).is_some() {
                    self.flush.mark(&mut self.tasks, idx, now);
                }
            }
        }
    }
}
