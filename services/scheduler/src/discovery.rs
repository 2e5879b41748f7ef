//! Discovery: one ordered watch over the tasks bucket that delivers the last value per key and
//! then every change (`watch_with_history`), so nothing is missed between load and follow.
//!
//! The initial load is over when the bucket's stream held no message when the watch was opened,
//! or when an entry arrives with `delta == 0` (the KV watch has no "load done" marker).

use std::sync::Arc;

use anyhow::Context;
use async_nats::jetstream::kv::{self, Entry, Operation, WatcherError};
use futures::StreamExt;
use futures::stream::ReadyChunks;
use jetsched_shared::spec::TaskSpec;
use tokio::sync::mpsc;

use crate::specs::{Scratch, Specs};
use crate::tasks::TaskInfo;

/// Entries handled per loop iteration at most (amortises the loop during a large load).
pub(crate) const CHUNK: usize = 1024;

pub(crate) type Watch = ReadyChunks<kv::Watch>;

/// Chunks decoded concurrently during a load.
const DECODERS: usize = 3;

/// Opens a watch over every key of `store` (last value per key, then updates); returns it and
/// how many messages the bucket held (0: the initial load is already complete).
pub(crate) async fn open(store: &kv::Store) -> anyhow::Result<(Watch, u64)> {
    let watch =
        store.watch_with_history(">").await.with_context(|| format!("watch bucket {}", store.name))?;
    // Opened after the watch: anything stored later arrives through the watch anyway.
    let mut stream = store.stream.clone();
    let info = stream.info().await.with_context(|| format!("read stream info of bucket {}", store.name))?;
    Ok((watch.ready_chunks(CHUNK), info.state.messages))
}

/// Decoded chunks of the tasks watch.
pub(crate) type Feed = mpsc::Receiver<Vec<Result<Decoded, WatcherError>>>;

/// One decoded entry of the tasks watch and its distance from the end of the bucket.
#[derive(Debug)]
pub(crate) struct Decoded {
    pub(crate) change: Change,
    pub(crate) delta: u64,
}

/// Opens the tasks watch (see [`open`]) and decodes its entries in a task of its own, so a
/// large load parses specs on another core than the dispatch loop's; their JSON is encoded
/// against `specs`. The feed closes when the watch ends.
pub(crate) async fn open_tasks(store: &kv::Store, specs: Arc<Specs>) -> anyhow::Result<(Feed, u64)> {
    let (watch, messages) = open(store).await?;
    let (tx, rx) = mpsc::channel(8);
    tokio::spawn(async move {
        // Chunks are decoded on blocking threads, a few at a time, and delivered in order.
        let mut decoded = watch
            .map(|chunk| {
                let specs = specs.clone();
                tokio::task::spawn_blocking(move || {
                    let mut scratch = Scratch::default();
                    chunk
                        .into_iter()
                        .map(|entry| {
                            entry.map(|entry| Decoded {
                                change: decode(&entry, &specs, &mut scratch),
                                delta: entry.delta,
                            })
                        })
                        .collect::<Vec<_>>()
                })
            })
            .buffered(DECODERS);
        loop {
            // Stop as soon as the loop is gone, before the connection closes under the watch.
            let chunk = tokio::select! {
                biased;
                _ = tx.closed() => return,
                chunk = decoded.next() => chunk,
            };
            let Some(chunk) = chunk else { return };
            let Ok(chunk) = chunk else {
                tracing::error!("a spec decoder panicked; re-opening the tasks watch");
                return;
            };
            if tx.send(chunk).await.is_err() {
                return;
            }
        }
    });
    Ok((rx, messages))
}

/// A change of one task, decoded from a tasks-bucket entry.
#[derive(Debug)]
pub(crate) enum Change {
    Put(TaskInfo),
    Remove {
        key: String,
    },
    /// A value that is not a valid spec: the task is dropped (and the error reported).
    Invalid {
        key: String,
        error: String,
    },
}

/// Decodes an entry of the tasks bucket, its spec JSON encoded against `specs`.
pub(crate) fn decode(entry: &Entry, specs: &Specs, scratch: &mut Scratch) -> Change {
    let key = || entry.key.clone();
    match entry.operation {
        Operation::Delete | Operation::Purge => Change::Remove { key: key() },
        Operation::Put => match TaskSpec::parse(&entry.value) {
            Ok(spec) if spec.has_key(&entry.key) => {
                // A parsed spec is JSON text: UTF-8.
                let json = match std::str::from_utf8(&entry.value) {
                    Ok(json) => json,
                    Err(error) => return Change::Invalid { key: key(), error: error.to_string() },
                };
                let created_ms = entry.created.unix_timestamp_nanos() / 1_000_000;
                let created_ms = i64::try_from(created_ms).unwrap_or(i64::MAX);
                Change::Put(TaskInfo::encoded(spec, json, entry.revision, created_ms, specs, scratch))
            }
            Ok(spec) => Change::Invalid {
                key: key(),
                error: format!("the spec's key {} differs from its bucket key", spec.key()),
            },
            Err(error) => Change::Invalid { key: key(), error: error.to_string() },
        },
    }
}
