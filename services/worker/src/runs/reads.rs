//! Run-record reads gathered into batched direct gets: every read asked while one request is
//! in flight goes into the next one, so a worker under load reads the records of all the
//! deliveries it starts meanwhile in one request, and an idle one reads a record in one.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use jetsched_shared::direct_batch::{DirectBatch, MAX_SUBJECTS};
use jetsched_shared::names::Names;
use tokio::sync::{mpsc, oneshot};

/// A record's value and revision; `None`: no record (never written, deleted or expired).
pub(crate) type Found = Option<(Bytes, u64)>;

/// Reads waiting for the gatherer, at most.
const QUEUE: usize = 4096;

/// The longest wait for one batch's answer.
const BATCH_TIMEOUT: Duration = Duration::from_secs(2);

/// After a failed batch, reads are answered "read it alone" at once for this long (a server
/// or a permission that refuses batched gets costs one timeout, not one per batch).
const SUSPEND_FOR: Duration = Duration::from_secs(30);

/// One read asked: the key and where its answer goes.
struct Ask {
    key: String,
    answer: oneshot::Sender<Result<Found, String>>,
}

/// The handle to the gatherer task; cheap to clone. The task ends when every handle is gone.
#[derive(Clone)]
pub(crate) struct Reads {
    asks: mpsc::Sender<Ask>,
}

impl Reads {
    /// Starts the gatherer of reads of `bucket`'s keys.
    pub(crate) async fn start(client: async_nats::Client, bucket: &str) -> anyhow::Result<Reads> {
        let reader = DirectBatch::new(client, &Names::kv_stream(bucket)).await?.with_timeout(BATCH_TIMEOUT);
        let (asks, queue) = mpsc::channel(QUEUE);
        let prefix = Names::kv_subject(bucket, "");
        tokio::spawn(gather(reader, prefix, queue));
        Ok(Reads { asks })
    }

    /// The record under `key`, read in the next batch. An error means the batch failed (the
    /// caller may read the key alone).
    pub(crate) async fn read(&self, key: &str) -> Result<Found, String> {
        let (answer, answered) = oneshot::channel();
        self.asks
            .send(Ask { key: key.to_string(), answer })
            .await
            .map_err(|_| "the record reader stopped".to_string())?;
        answered.await.map_err(|_| "the record reader stopped".to_string())?
    }
}

/// Takes the reads asked, one batch per request, until every handle is dropped.
async fn gather(mut reader: DirectBatch, prefix: String, mut queue: mpsc::Receiver<Ask>) {
    let mut waiting: HashMap<String, Vec<oneshot::Sender<Result<Found, String>>>> = HashMap::new();
    let mut suspended_until: Option<tokio::time::Instant> = None;
    while let Some(first) = queue.recv().await {
        if suspended_until.is_some_and(|until| tokio::time::Instant::now() < until) {
            let _ = first.answer.send(Err("batched reads suspended after a failure".to_string()));
            continue;
        }
        // Let the deliveries started with this one ask too.
        tokio::task::yield_now().await;
        waiting.entry(first.key).or_default().push(first.answer);
        while waiting.len() < MAX_SUBJECTS {
            match queue.try_recv() {
                Ok(ask) => waiting.entry(ask.key).or_default().push(ask.answer),
                Err(_) => break,
            }
        }
        let subjects: Vec<String> = waiting.keys().map(|key| format!("{prefix}{key}")).collect();
        let result = reader.last_of(&subjects).await;
        let mut found: HashMap<String, (Bytes, u64)> = HashMap::new();
        let failure = match result {
            Ok(messages) => {
                for message in messages {
                    if message.is_kv_marker() {
                        continue;
                    }
                    if let Some(key) = message.subject.strip_prefix(&prefix) {
                        found.insert(key.to_string(), (message.payload, message.sequence));
                    }
                }
                None
            }
            Err(error) => {
                tracing::warn!(%error, "batched run-record read failed; reading records one by one for a while");
                suspended_until = Some(tokio::time::Instant::now() + SUSPEND_FOR);
                Some(error.to_string())
            }
        };
        for (key, answers) in waiting.drain() {
            let value = found.get(&key).cloned();
            for answer in answers {
                let reply = match &failure {
                    Some(error) => Err(error.clone()),
                    None => Ok(value.clone()),
                };
                let _ = answer.send(reply);
            }
        }
    }
}
