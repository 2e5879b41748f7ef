//! The live replicas of every service, as the last presence ping found them. Pings go out in
//! the background every [`PERIOD`] (each collects answers for [`PING_WAIT`]), so a page shows
//! them at once instead of waiting for the answers: a replica that stopped leaves the overview
//! within `PERIOD + PING_WAIT`.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use jetsched_shared::names::Names;
use jetsched_shared::presence;
use tokio_util::sync::CancellationToken;

/// The roles whose replicas the overview counts.
const ROLES: [&str; 5] = ["registry", "scheduler", "worker", "alerter", "console"];
/// How long presence pings collect answers.
const PING_WAIT: Duration = Duration::from_millis(250);
/// How often the replicas are pinged.
const PERIOD: Duration = Duration::from_secs(2);

/// Each role with the instances that answered its ping, or why the ping failed.
pub(crate) type Found = Vec<(&'static str, Result<Vec<String>, String>)>;

/// The last ping's answers, shared by the pinging task and the pages.
#[derive(Clone, Default)]
pub(crate) struct Replicas {
    last: Arc<RwLock<Option<Found>>>,
}

impl Replicas {
    /// The last ping's answers; the first request before any ping has ended pings itself.
    pub(crate) async fn found(&self, client: &async_nats::Client, names: &Names) -> Found {
        if let Some(found) = self.last.read().expect("replicas lock").clone() {
            return found;
        }
        ping(client, names).await
    }

    /// Pings every role every [`PERIOD`] until `shutdown`.
    pub(crate) async fn follow(self, client: async_nats::Client, names: Names, shutdown: CancellationToken) {
        loop {
            let found = tokio::select! {
                _ = shutdown.cancelled() => return,
                found = ping(&client, &names) => found,
            };
            *self.last.write().expect("replicas lock") = Some(found);
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(PERIOD) => {}
            }
        }
    }
}

/// Pings every role at once; each answer's instance name (its id when it has none), sorted.
async fn ping(client: &async_nats::Client, names: &Names) -> Found {
    let pings = futures::future::join_all(ROLES.iter().map(|role| {
        let service = names.presence_service(role);
        async move { presence::ping(client, &service, PING_WAIT).await }
    }))
    .await;
    ROLES
        .iter()
        .zip(pings)
        .map(|(role, found)| {
            let found = found
                .map(|found| {
                    let mut instances: Vec<String> = found
                        .iter()
                        .map(|r| r.metadata.get("instance").cloned().unwrap_or_else(|| r.id.clone()))
                        .collect();
                    instances.sort();
                    instances
                })
                .map_err(|error| format!("{error:#}"));
            (*role, found)
        })
        .collect()
}
