//! What the API reads of the dependency engine: a task's waits, a run's status.

use anyhow::Context;
use async_nats::jetstream::consumer::{self as consumer, DeliverPolicy};
use futures::StreamExt;
use jetsched_shared::names::Names;
use jetsched_shared::wire::{RunRecord, Wait};

use super::After;

impl After {
    /// The waits of the child `namespace`/`id`, newest nominal time first, at most `limit`:
    /// the latest value of each of its keys, read with an ordered consumer of its keys alone.
    pub(crate) async fn waits_of(
        &self,
        namespace: &str,
        id: &str,
        limit: usize,
    ) -> anyhow::Result<Vec<Wait>> {
        let filter = Names::kv_subject(&self.names.waits_bucket(), &Names::wait_filter(namespace, id));
        let consumer = self
            .waits
            .stream
            .create_consumer(consumer::push::OrderedConfig {
                deliver_subject: self.js.client().new_inbox(),
                filter_subject: filter,
                deliver_policy: DeliverPolicy::LastPerSubject,
                replay_policy: consumer::ReplayPolicy::Instant,
                ..Default::default()
            })
            .await
            .context("read the task's waits")?;
        let mut waits = Vec::new();
        if consumer.cached_info().num_pending > 0 {
            let mut messages = consumer.messages().await.context("read the task's waits")?;
            while let Some(message) = messages.next().await {
                let message = message.context("read the task's waits")?;
                if let Ok(wait) = serde_json::from_slice::<Wait>(&message.payload) {
                    waits.push(wait);
                }
                if message.info().map_or(true, |info| info.pending == 0) {
                    break;
                }
            }
        }
        waits.sort_by_key(|wait| std::cmp::Reverse(wait.nominal_time));
        waits.truncate(limit);
        Ok(waits)
    }

    /// The status of run `execution_id`, while its record is kept.
    pub(crate) async fn run_status(&self, execution_id: &str) -> Option<jetsched_shared::wire::RunStatus> {
        let entry = self.runs.entry(execution_id).await.ok().flatten()?;
        let entry = jetsched_shared::cas::live(Some(entry))?;
        serde_json::from_slice::<RunRecord>(&entry.value).ok().map(|record| record.status)
    }
}
