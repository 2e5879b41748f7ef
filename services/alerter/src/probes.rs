//! Reads the alerter checks periodically: pending dispatches of each queue's lanes and the
//! depth of the dead-letter stream.

use anyhow::Context;
use async_nats::jetstream;
use futures::TryStreamExt;
use jetsched_shared::names::Names;

use crate::rules::DlqState;

/// `(queue, pending)` for every queue with worker consumers on the dispatch stream, pending
/// summed over its lanes.
pub(crate) async fn queue_depths(
    js: &jetstream::Context,
    names: &Names,
) -> anyhow::Result<Vec<(String, u64)>> {
    let name = names.dispatch_stream();
    let stream = js.get_stream(&name).await.with_context(|| format!("look up {name}"))?;
    let infos: Vec<_> =
        stream.consumers().try_collect().await.with_context(|| format!("list consumers of {name}"))?;
    // A queue's backlog is the sum of its lanes (one consumer per priority).
    let mut depths = std::collections::BTreeMap::<String, u64>::new();
    for info in infos {
        if let Some((queue, _)) = names.lane_of_worker_consumer(&info.name) {
            *depths.entry(queue.to_string()).or_default() += info.num_pending;
        }
    }
    Ok(depths.into_iter().collect())
}

/// Messages and bytes in the dead-letter stream, and its byte limit.
pub(crate) async fn dlq_state(js: &jetstream::Context, names: &Names) -> anyhow::Result<DlqState> {
    let name = names.dlq_stream();
    let mut stream = js.get_stream(&name).await.with_context(|| format!("look up {name}"))?;
    let info = stream.info().await.with_context(|| format!("read {name} info"))?;
    Ok(DlqState { messages: info.state.messages, bytes: info.state.bytes, max_bytes: info.config.max_bytes })
}
