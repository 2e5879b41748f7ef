//! The latest message of many subjects of one stream in a single request: a JetStream direct
//! get with `multi_last` (for example the run records of every delivery a worker holds). The
//! server answers with one message per subject that has one, then an end-of-batch status
//! (`204 EOB`), or `404 No Results` alone when none has.

use std::time::Duration;

use async_nats::{Client, HeaderMap, Subscriber};
use bytes::Bytes;
use futures::StreamExt;

use crate::names::Names;

/// Most subjects one request may name (the server refuses more than 1,024 results).
pub const MAX_SUBJECTS: usize = 256;

/// How long the whole answer to one request may take.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// The header a KV delete or purge marker carries (`DEL` or `PURGE`).
pub const KV_OPERATION: &str = "KV-Operation";

/// Whether a message's `KV-Operation` header marks it as a delete or purge.
pub fn is_kv_marker(headers: Option<&HeaderMap>) -> bool {
    headers.and_then(|h| h.get(KV_OPERATION)).is_some_and(|op| matches!(op.as_str(), "DEL" | "PURGE"))
}

/// The latest message of one subject, as the stream stored it.
#[derive(Debug, Clone, PartialEq)]
pub struct LastMessage {
    pub subject: String,
    /// Its stream sequence (a KV entry's revision).
    pub sequence: u64,
    /// Its own headers, with the server's `Nats-*` additions.
    pub headers: HeaderMap,
    pub payload: Bytes,
}

impl LastMessage {
    /// True when the message is a KV delete or purge marker.
    pub fn is_kv_marker(&self) -> bool {
        is_kv_marker(Some(&self.headers))
    }
}

/// Why a batched read failed.
#[derive(Debug, thiserror::Error)]
pub enum DirectBatchError {
    #[error("subscribe to the reply inbox: {0}")]
    Subscribe(#[source] async_nats::SubscribeError),
    #[error("send the direct get request: {0}")]
    Publish(#[source] async_nats::PublishError),
    #[error("encode the request: {0}")]
    Encode(#[source] serde_json::Error),
    #[error("too many subjects in one request: {0} (at most {MAX_SUBJECTS})")]
    TooMany(usize),
    #[error("the server answered {code}: {description}")]
    Status { code: u16, description: String },
    #[error("a reply without {0}")]
    Malformed(&'static str),
    #[error("no end of batch within {0:?}")]
    Timeout(Duration),
    #[error("the reply inbox closed")]
    Closed,
}

/// A reader of one stream's latest messages by subject, one request at a time, over one
/// long-lived reply subscription (`<inbox>.*`, each request on its own token).
pub struct DirectBatch {
    client: Client,
    request_subject: String,
    inbox: String,
    replies: Subscriber,
    next: u64,
    timeout: Duration,
}

impl DirectBatch {
    /// A reader of `stream` (which must have `allow_direct`, as every KV bucket has).
    pub async fn new(client: Client, stream: &str) -> Result<DirectBatch, DirectBatchError> {
        let inbox = client.new_inbox();
        let replies = client.subscribe(format!("{inbox}.*")).await.map_err(DirectBatchError::Subscribe)?;
        Ok(DirectBatch {
            client,
            request_subject: Names::direct_get_subject(stream),
            inbox,
            replies,
            next: 0,
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// Bounds the wait for a whole answer (default [`DEFAULT_TIMEOUT`]).
    pub fn with_timeout(mut self, timeout: Duration) -> DirectBatch {
        self.timeout = timeout;
        self
    }

    /// The latest message of each of `subjects` that has one (subjects without one are left
    /// out), in one request.
    pub async fn last_of(&mut self, subjects: &[String]) -> Result<Vec<LastMessage>, DirectBatchError> {
        self.request(subjects, serde_json::json!({ "multi_last": subjects })).await
    }

    /// The latest message stored before sequence `before` of each of `subjects` that has one,
    /// in one request (the server walks back from `before` to each subject's last message
    /// there, block by block: keep to subjects known to have a message before it).
    pub async fn last_before(
        &mut self,
        subjects: &[String],
        before: u64,
    ) -> Result<Vec<LastMessage>, DirectBatchError> {
        if before <= 1 {
            return Ok(Vec::new());
        }
        self.request(subjects, serde_json::json!({ "multi_last": subjects, "up_to_seq": before - 1 })).await
    }

    async fn request(
        &mut self,
        subjects: &[String],
        body: serde_json::Value,
    ) -> Result<Vec<LastMessage>, DirectBatchError> {
        if subjects.is_empty() {
            return Ok(Vec::new());
        }
        if subjects.len() > MAX_SUBJECTS {
            return Err(DirectBatchError::TooMany(subjects.len()));
        }
        self.next += 1;
        let reply = format!("{}.{}", self.inbox, self.next);
        let body = serde_json::to_vec(&body).map_err(DirectBatchError::Encode)?;
        self.client
            .publish_with_reply(self.request_subject.clone(), reply.clone(), body.into())
            .await
            .map_err(DirectBatchError::Publish)?;
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut found = Vec::with_capacity(subjects.len());
        loop {
            let message = match tokio::time::timeout_at(deadline, self.replies.next()).await {
                Ok(Some(message)) => message,
                Ok(None) => return Err(DirectBatchError::Closed),
                Err(_) => return Err(DirectBatchError::Timeout(self.timeout)),
            };
            // An answer to an earlier request that timed out.
            if message.subject.as_str() != reply {
                continue;
            }
            match message.status.map(|status| status.as_u16()) {
                None | Some(200) => found.push(decode(message)?),
                Some(204) => return Ok(found),
                Some(404) => return Ok(found),
                Some(code) => {
                    let description = message.description.unwrap_or_default();
                    return Err(DirectBatchError::Status { code, description });
                }
            }
        }
    }
}

/// The latest live value of each of `keys` in KV bucket `bucket` that has one (deleted keys
/// and keys never written are left out), by key: one request per [`MAX_SUBJECTS`] keys.
pub async fn latest_values(
    client: &Client,
    bucket: &str,
    keys: &[String],
) -> Result<std::collections::HashMap<String, Bytes>, DirectBatchError> {
    let mut found = std::collections::HashMap::with_capacity(keys.len());
    if keys.is_empty() {
        return Ok(found);
    }
    let mut reader = DirectBatch::new(client.clone(), &Names::kv_stream(bucket)).await?;
    let prefix = Names::kv_subject(bucket, "");
    for chunk in keys.chunks(MAX_SUBJECTS) {
        let subjects: Vec<String> = chunk.iter().map(|key| Names::kv_subject(bucket, key)).collect();
        for message in reader.last_of(&subjects).await? {
            if message.is_kv_marker() {
                continue;
            }
            if let Some(key) = message.subject.strip_prefix(&prefix) {
                found.insert(key.to_string(), message.payload);
            }
        }
    }
    Ok(found)
}

fn decode(message: async_nats::Message) -> Result<LastMessage, DirectBatchError> {
    let headers = message.headers.ok_or(DirectBatchError::Malformed("headers"))?;
    let subject =
        headers.get("Nats-Subject").ok_or(DirectBatchError::Malformed("Nats-Subject"))?.as_str().to_string();
    let sequence = headers
        .get("Nats-Sequence")
        .and_then(|value| value.as_str().parse().ok())
        .ok_or(DirectBatchError::Malformed("Nats-Sequence"))?;
    Ok(LastMessage { subject, sequence, headers, payload: message.payload })
}
