//! Events of one namespace, read the way a team confined to it by NATS permissions may: an
//! ordered push consumer whose create subject carries the namespace filter
//! (`$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>`, which the server checks against the
//! body) delivering to the caller's own inbox. No stream information, no pull requests (a pull
//! names a consumer, and could name another's).

use std::collections::VecDeque;
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::{self, consumer::push};
use bytes::Bytes;
use futures::StreamExt;
use jetsched_shared::names::Names;
use serde_json::Value;

use crate::api::{Failure, task_ref};
use crate::output::outln;

/// How long the history may stay silent before it is taken as complete.
const QUIET: Duration = Duration::from_secs(2);

/// Events of `filter` (within `namespace`) through an ordered push consumer to the caller's
/// inbox: the last `last` stored ones, oldest first, and the stream of what follows.
pub(crate) struct NamespaceEvents {
    pub(crate) recent: Vec<Bytes>,
    messages: push::Ordered,
}

impl NamespaceEvents {
    /// Opens the consumer and reads the history: everything stored for the filter, of which
    /// the last `last` are kept.
    pub(crate) async fn open(
        client: &async_nats::Client,
        names: &Names,
        namespace: &str,
        filter: String,
        last: u64,
    ) -> anyhow::Result<NamespaceEvents> {
        let js = jetstream::new(client.clone());
        // A name puts the filter in the create subject; the random part keeps concurrent readers
        // apart.
        let inbox = client.new_inbox();
        let name = format!("{namespace}-events-{}", inbox.rsplit('.').next().unwrap_or_default());
        let consumer = js
            .create_consumer_on_stream(
                push::OrderedConfig {
                    name: Some(name),
                    filter_subject: filter,
                    deliver_subject: inbox.clone(),
                    ..Default::default()
                },
                names.events_stream(),
            )
            .await
            .context("create an ordered consumer of the namespace's events")?;
        let pending = consumer.cached_info().num_pending;
        let mut messages = consumer.messages().await.context("read events")?;
        let mut recent: VecDeque<Bytes> = VecDeque::new();
        let mut seen = 0;
        while seen < pending {
            let Ok(Some(message)) = tokio::time::timeout(QUIET, messages.next()).await else { break };
            let message = message.context("read event")?;
            seen += 1;
            recent.push_back(message.payload.clone());
            if recent.len() as u64 > last {
                recent.pop_front();
            }
            if message.info().map(|i| i.pending).unwrap_or(0) == 0 {
                break;
            }
        }
        Ok(NamespaceEvents { recent: recent.into(), messages })
    }
}

/// Prints the last `last` events of `namespace` (or of one of its tasks), then, with `follow`,
/// every new one.
pub(crate) async fn events(
    client: &async_nats::Client,
    names: &Names,
    namespace: &str,
    task: Option<&str>,
    last: u64,
    follow: bool,
) -> Result<(), Failure> {
    let filter = match task.map(task_ref) {
        Some(task) if task.namespace != namespace => {
            return Err(anyhow::anyhow!(
                "--task {}/{} is not in --namespace {namespace}",
                task.namespace,
                task.id
            )
            .into());
        }
        Some(task) => names.event_subject("*.*", namespace, &task.id),
        None => names.namespace_events_filter(namespace),
    };
    let NamespaceEvents { recent, mut messages } =
        NamespaceEvents::open(client, names, namespace, filter, last).await?;
    for event in recent {
        outln!("{}", serde_json::from_slice::<Value>(&event).unwrap_or(Value::Null));
    }
    if !follow {
        return Ok(());
    }
    while let Some(message) = messages.next().await {
        let message = message.context("read event")?;
        let event: Value = serde_json::from_slice(&message.payload).unwrap_or(Value::Null);
        outln!("{event}");
    }
    Ok(())
}
