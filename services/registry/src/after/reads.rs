//! What the dependency engine reads and writes: a wait (compare-and-set), a task's waits, a
//! run's status, the backfills of a parent that ask not to chain.

use anyhow::Context;
use async_nats::jetstream::consumer::{self as consumer, DeliverPolicy};
use async_nats::jetstream::kv;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use jetsched_shared::backfill::progress::BackfillProgress;
use jetsched_shared::cas::{is_already_exists, is_revision_mismatch};
use jetsched_shared::names::Names;
use jetsched_shared::wire::{RunRecord, Wait};
use serde::de::DeserializeOwned;

use super::{After, Held};

impl After {
    /// A wait with its revision, if stored.
    pub(super) async fn read(&self, key: &str) -> anyhow::Result<Option<Held>> {
        let entry = self.waits.entry(key).await.with_context(|| format!("read wait {key}"))?;
        let Some(entry) = jetsched_shared::cas::live(entry) else { return Ok(None) };
        let wait: Wait =
            serde_json::from_slice(&entry.value).with_context(|| format!("decode wait {key}"))?;
        Ok(Some(Held { wait, revision: entry.revision }))
    }

    /// Writes `wait` over `revision` (0: creates it); `None` when someone wrote it meanwhile.
    pub(super) async fn write(&self, key: &str, wait: &Wait, revision: u64) -> anyhow::Result<Option<u64>> {
        let body = bytes::Bytes::from(serde_json::to_vec(wait).context("encode wait")?);
        if revision == 0 {
            return match self.waits.create(key, body).await {
                Ok(revision) => Ok(Some(revision)),
                Err(error) if is_already_exists(&error) => Ok(None),
                Err(error) => Err(anyhow::Error::new(error).context(format!("create wait {key}"))),
            };
        }
        match self.waits.update(key, body, revision).await {
            Ok(revision) => Ok(Some(revision)),
            Err(error) if is_revision_mismatch(&error) => Ok(None),
            Err(error) => Err(anyhow::Error::new(error).context(format!("write wait {key}"))),
        }
    }

    /// The waits of the child `namespace`/`id`, newest nominal time first, at most `limit`.
    pub(crate) async fn waits_of(
        &self,
        namespace: &str,
        id: &str,
        limit: usize,
    ) -> anyhow::Result<Vec<Wait>> {
        let filter = Names::wait_filter(namespace, id);
        let mut waits: Vec<Wait> = self.latest(&self.waits, &self.names.waits_bucket(), &filter).await?;
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

    /// Whether a backfill of the task `namespace`/`id` whose range (`to` excluded) holds `nominal` asked that its runs
    /// not start the task's children (`chain: false`).
    pub(crate) async fn unchained(
        &self,
        namespace: &str,
        id: &str,
        nominal: DateTime<Utc>,
    ) -> anyhow::Result<bool> {
        let filter = Names::backfill_filter(namespace, Some(id));
        let backfills: Vec<BackfillProgress> =
            self.latest(&self.backfills, &self.names.backfills_bucket(), &filter).await?;
        Ok(backfills.iter().any(|b| !b.request.chain && b.request.from <= nominal && nominal < b.request.to))
    }

    /// The latest value of each key of `bucket` under `key_filter` that decodes, read with an
    /// ordered consumer of those keys alone.
    async fn latest<T: DeserializeOwned>(
        &self,
        store: &kv::Store,
        bucket: &str,
        key_filter: &str,
    ) -> anyhow::Result<Vec<T>> {
        let consumer = store
            .stream
            .create_consumer(consumer::push::OrderedConfig {
                deliver_subject: self.js.client().new_inbox(),
                filter_subject: Names::kv_subject(bucket, key_filter),
                deliver_policy: DeliverPolicy::LastPerSubject,
                replay_policy: consumer::ReplayPolicy::Instant,
                ..Default::default()
            })
            .await
            .with_context(|| format!("read {key_filter} of {bucket}"))?;
        let mut values = Vec::new();
        if consumer.cached_info().num_pending > 0 {
            let mut messages =
                consumer.messages().await.with_context(|| format!("read {key_filter} of {bucket}"))?;
            while let Some(message) = messages.next().await {
                let message = message.with_context(|| format!("read {key_filter} of {bucket}"))?;
                if let Ok(value) = serde_json::from_slice::<T>(&message.payload) {
                    values.push(value);
                }
                if message.info().map_or(true, |info| info.pending == 0) {
                    break;
                }
            }
        }
        Ok(values)
    }
}
