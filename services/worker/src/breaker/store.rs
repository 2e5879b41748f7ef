//! Reads and compare-and-set writes of breaker records in `JETSCHED_BREAKERS`.
//!
//! Every write is `change` applied to the latest record and stored at its revision; a lost
//! race re-reads and applies `change` again, so concurrent workers' changes all land.

use anyhow::Context;
use async_nats::jetstream::kv;
use chrono::Utc;
use jetsched_shared::cas::{is_already_exists, is_revision_mismatch};
use jetsched_shared::wire::BreakerRecord;

/// Compare-and-set rounds before giving up on a write (many workers merging into one hot
/// record at once lose a few rounds each).
const CAS_ROUNDS: usize = 32;

/// A record as stored: `revision` 0 when the key holds nothing yet (create it).
#[derive(Debug, Clone, Default)]
pub(crate) struct Versioned {
    pub(crate) record: BreakerRecord,
    pub(crate) revision: u64,
}

/// The breakers bucket.
#[derive(Clone)]
pub(crate) struct Store {
    kv: kv::Store,
    worker: String,
}

impl Store {
    pub(crate) fn new(kv: kv::Store, worker: String) -> Store {
        Store { kv, worker }
    }

    pub(crate) fn kv(&self) -> &kv::Store {
        &self.kv
    }

    pub(crate) fn worker(&self) -> &str {
        &self.worker
    }

    /// The record of `key` (a closed breaker when the key holds nothing, was deleted, or
    /// cannot be decoded) and the revision to write it back at.
    pub(crate) async fn read(&self, key: &str) -> anyhow::Result<Versioned> {
        let entry = self.kv.entry(key).await.with_context(|| format!("read breaker {key}"))?;
        Ok(match entry {
            None => Versioned::default(),
            Some(entry) => Versioned { record: decode(key, &entry), revision: entry.revision },
        })
    }

    /// Applies `change` to the latest record of `key` and stores it with compare-and-set,
    /// starting from `known` when given (the watch's copy: one read less when it is current).
    /// `change` returns its result and whether it changed the record (nothing is written
    /// otherwise). Returns the result and the record as stored.
    pub(crate) async fn modify<T>(
        &self,
        key: &str,
        known: Option<Versioned>,
        mut change: impl FnMut(&mut BreakerRecord) -> (T, bool),
    ) -> anyhow::Result<(T, Versioned)> {
        let mut current = match known {
            Some(known) => known,
            None => self.read(key).await?,
        };
        for _ in 0..CAS_ROUNDS {
            let mut record = current.record.clone();
            let (out, changed) = change(&mut record);
            if !changed {
                return Ok((out, current));
            }
            record.updated_at = Some(Utc::now());
            record.updated_by.clone_from(&self.worker);
            let body: bytes::Bytes = serde_json::to_vec(&record).context("encode breaker record")?.into();
            let written = if current.revision == 0 {
                match self.kv.create(key, body).await {
                    Ok(revision) => Some(revision),
                    Err(error) if is_already_exists(&error) => None,
                    Err(error) => return Err(error).with_context(|| format!("create breaker {key}")),
                }
            } else {
                match self.kv.update(key, body, current.revision).await {
                    Ok(revision) => Some(revision),
                    Err(error) if is_revision_mismatch(&error) => None,
                    Err(error) => return Err(error).with_context(|| format!("update breaker {key}")),
                }
            };
            match written {
                Some(revision) => return Ok((out, Versioned { record, revision })),
                None => current = self.read(key).await?,
            }
        }
        anyhow::bail!("breaker {key}: compare-and-set kept failing")
    }
}

/// The record an entry holds: a closed breaker for a delete or purge marker, or for a value
/// that cannot be decoded (logged; the next write replaces it).
pub(crate) fn decode(key: &str, entry: &kv::Entry) -> BreakerRecord {
    if entry.operation != kv::Operation::Put {
        return BreakerRecord::default();
    }
    serde_json::from_slice(&entry.value).unwrap_or_else(|error| {
        tracing::warn!(%error, key, "undecodable breaker record: read as closed");
        BreakerRecord::default()
    })
}
