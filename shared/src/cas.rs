//! Compare-and-set on KV buckets: recognising a lost race, whatever form the server gives it;
//! and reading a bucket so that a concurrent write cannot mislead the reader.

use async_nats::jetstream::stream::{LastRawMessageError, LastRawMessageErrorKind};

use crate::direct_batch::LastMessage;
use crate::names::Names;
use async_nats::jetstream::kv::{
    CreateError, CreateErrorKind, Entry, Operation, UpdateError, UpdateErrorKind,
};

/// True when an `update` failed because the stored revision is not the expected one.
///
/// Single-node servers answer with "wrong last sequence" (10071, mapped to
/// `WrongLastRevision`); replicated (R3) buckets often answer `Other` with server error 10164.
pub fn is_revision_mismatch(error: &UpdateError) -> bool {
    error.kind() == UpdateErrorKind::WrongLastRevision
        || (error.kind() == UpdateErrorKind::Other && chain_mentions_mismatch(error))
}

/// True when a `create` failed because the key already holds a value.
pub fn is_already_exists(error: &CreateError) -> bool {
    error.kind() == CreateErrorKind::AlreadyExists
        || (error.kind() == CreateErrorKind::Other && chain_mentions_mismatch(error))
}

/// True when a publish with `Nats-Expected-Last-Subject-Sequence` failed because the subject's
/// last message is not the expected one (the same forms as [`is_revision_mismatch`]).
pub fn is_wrong_last_sequence(error: &async_nats::jetstream::context::PublishError) -> bool {
    use async_nats::jetstream::context::PublishErrorKind;
    error.kind() == PublishErrorKind::WrongLastSequence
        || (error.kind() == PublishErrorKind::Other && chain_mentions_mismatch(error))
}

fn chain_mentions_mismatch(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = current {
        let text = e.to_string();
        if text.contains("10071") || text.contains("10164") || text.contains("wrong last sequence") {
            return true;
        }
        current = e.source();
    }
    false
}

/// An entry that holds a value (not a delete or purge marker).
pub fn live(entry: Option<Entry>) -> Option<Entry> {
    entry.filter(|e| e.operation == Operation::Put)
}

/// Every key of `kv` holding a value, in key order, each once. A listing of a bucket's keys
/// names a key twice when the key is written again while the listing runs (its old message,
/// then its new one).
pub async fn keys_once(kv: &async_nats::jetstream::kv::Store) -> anyhow::Result<Vec<String>> {
    use futures::TryStreamExt;
    let mut keys: Vec<String> = kv.keys().await?.try_collect().await?;
    keys.sort_unstable();
    keys.dedup();
    Ok(keys)
}

/// The latest message of `key` in `bucket` (delete and purge markers included, see
/// [`LastMessage::is_kv_marker`]), read from the bucket stream's leader rather than with a
/// direct get: on a replicated bucket a direct get may be answered by a replica that has not
/// applied the last write yet, which a compare-and-set that just conflicted must not see.
pub async fn read_leader<I>(
    stream: &async_nats::jetstream::stream::Stream<I>,
    bucket: &str,
    key: &str,
) -> Result<Option<LastMessage>, LastRawMessageError> {
    let subject = Names::kv_subject(bucket, key);
    match stream.get_last_raw_message_by_subject(&subject).await {
        Ok(message) => Ok(Some(LastMessage {
            subject,
            sequence: message.sequence,
            headers: message.headers,
            payload: message.payload,
        })),
        Err(error) if error.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(error) => Err(error),
    }
}

/// How many keys of `bucket` under `prefix` (`<prefix>.<rest>`) hold a value (delete and purge
/// markers are not counted), read from the bucket's stream: the last message of each key,
/// headers only. Costs one message per key under the prefix, so callers keep the prefix's
/// key count bounded (a quota).
pub async fn count_live_keys<I>(
    stream: &async_nats::jetstream::stream::Stream<I>,
    client: &async_nats::Client,
    bucket: &str,
    prefix: &str,
) -> anyhow::Result<u64> {
    use async_nats::jetstream::consumer::{DeliverPolicy, ReplayPolicy, push};
    use futures::StreamExt;

    let consumer = stream
        .create_consumer(push::OrderedConfig {
            deliver_subject: client.new_inbox(),
            filter_subject: Names::kv_subject(bucket, &format!("{prefix}.>")),
            headers_only: true,
            replay_policy: ReplayPolicy::Instant,
            deliver_policy: DeliverPolicy::LastPerSubject,
            ..Default::default()
        })
        .await?;
    let mut pending = consumer.cached_info().num_pending;
    let mut live = 0;
    if pending == 0 {
        return Ok(0);
    }
    let mut messages = consumer.messages().await?;
    while pending > 0 {
        let message = tokio::time::timeout(std::time::Duration::from_secs(5), messages.next())
            .await
            .map_err(|_| anyhow::anyhow!("the keys of {bucket} under {prefix} stopped arriving"))?
            .ok_or_else(|| anyhow::anyhow!("the keys of {bucket} under {prefix} ended early"))??;
        pending = message.info().map_err(|e| anyhow::anyhow!("key metadata: {e}"))?.pending;
        if !crate::direct_batch::is_kv_marker(message.headers.as_ref()) {
            live += 1;
        }
    }
    Ok(live)
}
