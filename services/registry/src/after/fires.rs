//! Fires of children with a schedule of their own: the scheduler sends each such fire here
//! instead of to the workers (the same dispatch, on `<prefix>.after.fire.<ns>.<id>`), and it is
//! merged into the child's wait for its nominal time. The child runs once the fire and its
//! parents' runs of that nominal time are in and meet its rule; a fire whose parents' runs
//! cannot meet it any more is skipped, told as `fire.skipped`.

use anyhow::Context;
use jetsched_shared::names::task_key;
use jetsched_shared::wire::{Dispatch, Event, EventKind, Wait};
use serde::de::IgnoredAny;

use super::After;
use super::rule::Arrival;

impl After {
    /// A held fire came: merged into its wait (a fire the task no longer holds is skipped,
    /// told).
    pub(super) async fn fire(&self, fire: &Dispatch<IgnoredAny>, redelivered: bool) -> anyhow::Result<()> {
        let key = task_key(&fire.namespace, &fire.task_id);
        let nominal_ms = fire.nominal_time.timestamp_millis();
        match self.graph.child(&key) {
            Some(child) if child.spec.holds_fires_for_parents() => {
                self.offer(&child, nominal_ms, Arrival::Fire(fire.trigger), redelivered).await
            }
            Some(_) | None => {
                let reason = "the task no longer waits for parents on a schedule of its own";
                tracing::warn!(task = %key, nominal = nominal_ms, reason, "held fire skipped");
                self.tell_skipped(
                    &fire.namespace,
                    &fire.task_id,
                    &fire.execution_id,
                    fire.nominal_time,
                    reason,
                )
                .await
            }
        }
    }

    /// A held fire that will not run (its parents' runs did not meet the rule, its wait gave
    /// up or the task was paused): `fire.skipped`, named after the run so it is stored once.
    pub(super) async fn tell_fire_skipped(&self, wait: &Wait) -> anyhow::Result<()> {
        let reason =
            format!("waiting for its parents: {}", wait.reason.as_deref().unwrap_or(wait.state.as_str()));
        self.tell_skipped(&wait.namespace, &wait.task_id, &wait.execution_id, wait.nominal_time, &reason)
            .await
    }

    async fn tell_skipped(
        &self,
        namespace: &str,
        task_id: &str,
        execution_id: &str,
        nominal_time: chrono::DateTime<chrono::Utc>,
        reason: &str,
    ) -> anyhow::Result<()> {
        self.tell(Event {
            execution_id: Some(execution_id.to_string()),
            nominal_time: Some(nominal_time),
            reason: Some(reason.to_string()),
            ..Event::new(EventKind::FireSkipped, namespace, task_id)
        })
        .await
    }

    /// Stores `event` of a run, named `<kind>:<execution id>` so that telling it again (a
    /// redelivery, another replica) stores it once.
    pub(super) async fn tell(&self, event: Event) -> anyhow::Result<()> {
        let kind = event.kind.as_str();
        let id = format!("{kind}:{}", event.execution_id.as_deref().unwrap_or_default());
        let ack = self.publisher.send_with_id(&event, &id).await?;
        ack.await.with_context(|| format!("store the {kind} event"))?;
        Ok(())
    }
}
