//! Reads the alerter checks periodically: pending dispatches of each queue's consumer and the
//! depth of the dead-letter stream.

use anyhow::Context;
use async_nats::jetstream;
use futures::TryStreamExt;
use jetsched_shared::names::Names;

use crate::rules::DlqState;

/// `(queue, pending)` for every worker queue consumer on the dispatch stream.
pub(crate) async fn queue_depths(
    js: &jetstream::Context,
    names: &Names,
) -> anyhow::Result<Vec<(String, u64)>> {
    let name = names.dispatch_stream();
    let stream = js.get_stream(&name).await.with_context(|| format!("look up {name}"))?;
    let infos: Vec<_> =
        stream.consumers().try_collect().await.with_context(|| format!("list consumers of {name}"))?;
    let mut depths: Vec<(String, u64)> = infos
        .into_iter()
        .filter_map(|info| {
            let queue = names.queue_of_worker_consumer(&info.name)?.to_string();
            Some((queue, info.num_pending))
        })
        .collect();
    depths.sort();
    Ok(depths)
}

/// Messages and bytes in the dead-letter stream, and its byte limit.
pub(crate) async fn dlq_state(js: &jetstream::Context, names: &Names) -> anyhow::Result<DlqState> {
    let name = names.dlq_stream();
    let mut stream = js.get_stream(&name).await.with_context(|| format!("look up {name}"))?;
    let info = stream.info().await.with_context(|| format!("read {name} info"))?;
    Ok(DlqState { messages: info.state.messages, bytes: info.state.bytes, max_bytes: info.config.max_bytes })
}
