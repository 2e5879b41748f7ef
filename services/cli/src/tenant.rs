//! Events of one namespace, read the way a team in an account of its own may: the history
//! through the registry (`<prefix>.api.events.history.<namespace>`), new events on the live
//! subjects its account imports (`<prefix>.event.*.*.<namespace>.>`). No JetStream access to
//! the services' account is needed.

use std::collections::HashSet;

use anyhow::Context;
use futures::StreamExt;
use jetsched_shared::names::Names;
use serde_json::Value;

use crate::api::{Api, Failure, task_ref};

/// Prints the last `last` events of `namespace` (or of one of its tasks), then, with `follow`,
/// every new one: a line of text each, or of JSON with `json_out`.
#[allow(clippy::too_many_arguments)] // each is one setting of `jetsched events`
pub(crate) async fn events(
    api: &Api,
    client: &async_nats::Client,
    names: &Names,
    namespace: &str,
    task: Option<&str>,
    last: u64,
    follow: bool,
    json_out: bool,
) -> Result<(), Failure> {
    let task = task.map(task_ref);
    let filter = match &task {
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
    // Live first, so nothing stored between the history and the subscription is missed; an
    // event in both is printed once.
    let mut live = match follow {
        true => Some(client.subscribe(filter).await.context("subscribe to the live events")?),
        false => None,
    };
    let history = api.event_history(namespace, task.as_ref().map(|t| t.id.as_str()), last).await?;
    let mut printed: HashSet<String> = HashSet::new();
    for event in history {
        let line = event.to_string();
        crate::text::print_event(&event, json_out);
        printed.insert(line);
    }
    let Some(live) = live.as_mut() else { return Ok(()) };
    while let Some(message) = live.next().await {
        let event: Value = serde_json::from_slice(&message.payload).unwrap_or(Value::Null);
        let line = event.to_string();
        if !printed.remove(&line) {
            crate::text::print_event(&event, json_out);
        }
    }
    Ok(())
}
