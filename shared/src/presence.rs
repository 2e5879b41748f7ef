//! Presence: every long-running service registers a NATS micro service named
//! `<prefix>-<role>` (e.g. `jetsched-scheduler`) carrying its instance id, so `nats micro ls`,
//! `$SRV.PING.<name>` and `jetsched status` can count live replicas without any registry of
//! their own.

use std::collections::HashMap;
use std::time::Duration;

use async_nats::service::{Service, ServiceExt};
use futures::StreamExt;

use crate::names::Names;

/// Registers this process as a replica of `role` (`scheduler`, `worker`, `alerter`); keep the
/// returned service alive for as long as the process serves, and `stop` it on shutdown.
pub async fn announce(
    client: &async_nats::Client,
    names: &Names,
    role: &str,
    instance: &str,
    metadata: impl IntoIterator<Item = (String, String)>,
) -> anyhow::Result<Service> {
    let mut all: HashMap<String, String> = metadata.into_iter().collect();
    all.insert("instance".to_string(), instance.to_string());
    client
        .service_builder()
        .description(format!("jetsched {role} replica"))
        .metadata(all)
        .start(names.presence_service(role), env!("CARGO_PKG_VERSION"))
        .await
        .map_err(|e| anyhow::anyhow!("announce {role} presence: {e}"))
}

/// One live replica, as answered to `$SRV.PING.<name>`.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Replica {
    pub name: String,
    pub id: String,
    #[serde(default)]
    pub metadata: HashMap<String, String>,
}

/// Pings every replica of `service_name` and collects the answers that arrive within `wait`.
pub async fn ping(
    client: &async_nats::Client,
    service_name: &str,
    wait: Duration,
) -> anyhow::Result<Vec<Replica>> {
    let inbox = client.new_inbox();
    let mut replies = client.subscribe(inbox.clone()).await?;
    client.publish_with_reply(format!("$SRV.PING.{service_name}"), inbox, "".into()).await?;
    client.flush().await?;
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + wait;
    while let Ok(Some(message)) = tokio::time::timeout_at(deadline, replies.next()).await {
        if let Ok(replica) = serde_json::from_slice::<Replica>(&message.payload) {
            out.push(replica);
        }
    }
    Ok(out)
}
