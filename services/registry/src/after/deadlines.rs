//! Deadlines of children's waits: each wait that does not end at once gets one, a
//! server-scheduled message that comes back when `within` has passed; a wait still waiting
//! then ends `expired`, told once.

use anyhow::Context;
use async_nats::HeaderMap;
use chrono::Utc;
use jetsched_shared::names::Names;
use jetsched_shared::wire::{
    Event, EventKind, HDR_SCHEDULE, HDR_SCHEDULE_TARGET, Trigger, Wait, WaitState, format_time,
};

use super::rule::missing;
use super::{After, CAS_ATTEMPTS, Held};

impl After {
    /// The wait's deadline as a server-scheduled message (one per wait: published again, it
    /// replaces itself).
    pub(super) async fn schedule_deadline(&self, wait: &Wait, nominal_ms: i64) -> anyhow::Result<()> {
        let (namespace, task_id) = (&wait.namespace, &wait.task_id);
        let subject = self.names.after_deadline_subject(namespace, task_id, nominal_ms);
        let mut headers = HeaderMap::new();
        headers.insert(HDR_SCHEDULE, format!("@at {}", format_time(wait.deadline)).as_str());
        headers.insert(
            HDR_SCHEDULE_TARGET,
            self.names.after_due_subject(namespace, task_id, nominal_ms).as_str(),
        );
        let ack = self
            .js
            .publish_with_headers(subject.clone(), headers, bytes::Bytes::new())
            .await
            .with_context(|| format!("publish the deadline on {subject}"))?;
        ack.await.with_context(|| format!("store the deadline on {subject}"))?;
        Ok(())
    }

    /// A wait's deadline came: a wait still waiting ends `expired`, told once.
    pub(super) async fn deadline(&self, subject: &str) -> anyhow::Result<()> {
        let Some((namespace, task_id, nominal_ms)) = self.names.parse_after_due_subject(subject) else {
            tracing::warn!(%subject, "not a wait's deadline; ignored");
            return Ok(());
        };
        let key = Names::wait_key(namespace, task_id, nominal_ms);
        for _ in 0..CAS_ATTEMPTS {
            let Some(Held { mut wait, revision }) = self.read(&key).await? else { return Ok(()) };
            match wait.state {
                WaitState::Waiting => {}
                // Ended by this deadline before: told again (stored once).
                WaitState::Expired => return self.tell_expired(&wait).await,
                _ => return Ok(()),
            }
            let missing = self
                .graph
                .child(&jetsched_shared::names::task_key(namespace, task_id))
                .and_then(|child| child.spec.after.as_ref().map(|after| missing(&wait, after)))
                .unwrap_or_default();
            wait.state = WaitState::Expired;
            wait.reason = Some(if missing.is_empty() {
                "within passed".to_string()
            } else {
                format!("within passed waiting for {}", missing.join(", "))
            });
            wait.ended = Some(Utc::now());
            if self.write(&key, &wait, revision).await?.is_some() {
                if wait.fired.is_some() {
                    self.tell_fire_skipped(&wait).await?;
                }
                return self.tell_expired(&wait).await;
            }
        }
        anyhow::bail!("wait {key} is being changed concurrently")
    }

    async fn tell_expired(&self, wait: &Wait) -> anyhow::Result<()> {
        self.tell(Event {
            execution_id: Some(wait.execution_id.clone()),
            nominal_time: Some(wait.nominal_time),
            trigger: Some(Trigger::After),
            reason: wait.reason.clone(),
            ..Event::new(EventKind::AfterExpired, &wait.namespace, &wait.task_id)
        })
        .await
    }
}
