//! The alerter's own KV bucket (`<PREFIX>_ALERTER`): one key per open de-duplication window
//! (`<rule>.<namespace>.<task_id>` → until when). Replicas claim a window with
//! compare-and-set, so one alert goes out however many replicas see the condition, and a
//! restarted alerter loads the open windows instead of re-sending.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::{self, kv};
use chrono::{DateTime, Utc};
use jetsched_shared::cas::{is_already_exists, is_revision_mismatch, keys_once, live};
use jetsched_shared::names::Names;
use jetsched_shared::topology::TopologyArgs;
use jetsched_shared::wire::millis;
use serde::{Deserialize, Serialize};

use crate::rules::throttle::{DedupKey, Throttle};

/// Longest de-duplication window (and the age after which the bucket forgets a window).
pub const MAX_DEDUP_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);

#[derive(Debug, Serialize, Deserialize)]
struct StoredWindow {
    #[serde(with = "millis")]
    until: DateTime<Utc>,
    #[serde(with = "millis")]
    sent_at: DateTime<Utc>,
    instance: String,
}

/// Outcome of a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claim {
    /// This replica opened the window: send.
    Won,
    /// Another replica (or this one before a restart) holds an open window until then.
    Lost { until: DateTime<Utc> },
}

pub(crate) struct DedupStore {
    kv: kv::Store,
    instance: String,
    revisions: Revisions,
}

/// The last revision this replica saw of each window key still open, for its compare-and-set.
/// A window that has closed is forgotten: were its key claimed again, the create fails on the
/// stored key, the read finds the window closed and the update takes its revision (one round
/// trip more), so the map holds the open windows only, however many keys ever alerted.
#[derive(Debug, Default)]
struct Revisions {
    open: HashMap<String, (u64, DateTime<Utc>)>,
}

impl Revisions {
    fn get(&self, key: &str) -> Option<u64> {
        self.open.get(key).map(|&(revision, _)| revision)
    }

    fn insert(&mut self, key: String, revision: u64, until: DateTime<Utc>) {
        self.open.insert(key, (revision, until));
    }

    fn remove(&mut self, key: &str) {
        self.open.remove(key);
    }

    /// Forgets the windows closed at `now`.
    fn prune(&mut self, now: DateTime<Utc>) {
        self.open.retain(|_, &mut (_, until)| until > now);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.open.len()
    }
}

impl DedupStore {
    /// Creates the bucket when missing and opens it.
    pub(crate) async fn open(
        js: &jetstream::Context,
        names: &Names,
        topology: &TopologyArgs,
        instance: &str,
    ) -> anyhow::Result<DedupStore> {
        let bucket = names.alerter_bucket();
        let kv = match js.get_key_value(&bucket).await {
            Ok(kv) => kv,
            Err(_) => js
                .create_key_value(kv::Config {
                    bucket: bucket.clone(),
                    description: "jetsched alerter de-duplication windows".to_string(),
                    history: 1,
                    max_age: MAX_DEDUP_WINDOW,
                    storage: topology.storage.into(),
                    num_replicas: topology.replicas,
                    ..Default::default()
                })
                .await
                .with_context(|| format!("create bucket {bucket}"))?,
        };
        Ok(DedupStore { kv, instance: instance.to_string(), revisions: Revisions::default() })
    }

    /// Restores every window still open at `now` into `throttle`; returns how many.
    pub(crate) async fn load(
        &mut self,
        throttle: &mut Throttle,
        now: DateTime<Utc>,
    ) -> anyhow::Result<usize> {
        let keys = keys_once(&self.kv).await.context("list alerter windows")?;
        let mut restored = 0;
        for key in keys {
            let Some(entry) =
                live(self.kv.entry(key.as_str()).await.with_context(|| format!("read window {key}"))?)
            else {
                continue;
            };
            let (Some(dedup), Ok(stored)) =
                (DedupKey::parse(&key), serde_json::from_slice::<StoredWindow>(&entry.value))
            else {
                tracing::debug!(key = %key, "ignoring an unreadable alerter window");
                continue;
            };
            if stored.until > now {
                self.revisions.insert(key.clone(), entry.revision, stored.until);
                throttle.restore(dedup, stored.until);
                restored += 1;
            }
        }
        Ok(restored)
    }

    /// Opens the window of `key` until `until`, unless an open one exists.
    pub(crate) async fn claim(
        &mut self,
        key: &DedupKey,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> anyhow::Result<Claim> {
        let name = key.storage_key();
        let value =
            serde_json::to_vec(&StoredWindow { until, sent_at: now, instance: self.instance.clone() })
                .context("encode alerter window")?;
        self.revisions.prune(now);
        for _ in 0..3 {
            let written = match self.revisions.get(&name) {
                Some(revision) => match self.kv.update(name.as_str(), value.clone().into(), revision).await {
                    Ok(revision) => Some(revision),
                    Err(error) if is_revision_mismatch(&error) => None,
                    Err(error) => return Err(error).with_context(|| format!("update window {name}")),
                },
                None => match self.kv.create(name.as_str(), value.clone().into()).await {
                    Ok(revision) => Some(revision),
                    Err(error) if is_already_exists(&error) => None,
                    Err(error) => return Err(error).with_context(|| format!("create window {name}")),
                },
            };
            if let Some(revision) = written {
                self.revisions.insert(name, revision, until);
                return Ok(Claim::Won);
            }
            // Someone else wrote it: open or expired?
            match live(self.kv.entry(name.as_str()).await.with_context(|| format!("read window {name}"))?) {
                Some(entry) => {
                    // An unreadable window counts as closed: this replica takes it over.
                    let stored = serde_json::from_slice::<StoredWindow>(&entry.value).ok();
                    let until = stored.map_or(now, |stored| stored.until);
                    self.revisions.insert(name.clone(), entry.revision, until);
                    if until > now {
                        return Ok(Claim::Lost { until });
                    }
                }
                None => {
                    self.revisions.remove(&name);
                }
            }
        }
        anyhow::bail!("window {name} kept changing under this replica")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(s, 0).expect("in range")
    }

    #[test]
    fn revisions_keep_only_the_windows_still_open() {
        let mut revisions = Revisions::default();
        for i in 0..1_000 {
            revisions.insert(format!("run_failed.ns.task-{i}"), i, at(100 + i64::try_from(i).unwrap()));
        }
        revisions.insert("fire_lag.ns.late".into(), 7, at(2_000));
        revisions.prune(at(100));
        assert_eq!(revisions.len(), 1_000, "a window is closed at its until");
        assert_eq!(revisions.get("run_failed.ns.task-0"), None);
        revisions.prune(at(600));
        assert_eq!(revisions.len(), 1_000 - 501 + 1);
        assert_eq!(revisions.get("run_failed.ns.task-500"), None);
        assert_eq!(revisions.get("run_failed.ns.task-501"), Some(501));
        revisions.prune(at(1_999));
        assert_eq!(revisions.len(), 1);
        assert_eq!(revisions.get("fire_lag.ns.late"), Some(7));
        revisions.remove("fire_lag.ns.late");
        assert_eq!(revisions.len(), 0);
    }
}
