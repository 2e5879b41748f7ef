//! The leader lease as the alerter sees it: a watch of the lease key (reopened when it ends),
//! read into who holds it since when.

use async_nats::jetstream::kv;
use chrono::{DateTime, Utc};
use jetsched_shared::admin::Readiness;
use jetsched_shared::names::Names;
use jetsched_shared::wire::LeaderRecord;

use crate::metrics::Metrics;
use crate::reopen::{Next, Reopening};

/// The lease key's state: `holder` is `None` once it was deleted, purged or expired; `since`
/// is when the entry was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Holder {
    pub(crate) holder: Option<String>,
    pub(crate) since: DateTime<Utc>,
}

/// What the lease part brings to the loop.
pub(crate) enum Seen {
    Holder(Holder),
    /// Time to reopen the watch ([`Lease::reopen`]).
    Reopen,
}

pub(crate) struct Lease {
    bucket: kv::Store,
    key: String,
    watch: Reopening<kv::Watch>,
    metrics: Metrics,
}

impl Lease {
    /// Watches the lease key; with the key's current state (`None` when the watch could not be
    /// opened, which is retried).
    pub(crate) async fn open(
        bucket: kv::Store,
        names: &Names,
        readiness: Readiness,
        metrics: Metrics,
    ) -> (Lease, Option<Holder>) {
        let key = names.leader_key().to_string();
        let (watch, current) = watch(&bucket, &key, &metrics).await;
        let watch = Reopening::new("lease_watch", watch, readiness, metrics.clone());
        (Lease { bucket, key, watch, metrics }, current)
    }

    pub(crate) fn watching(&self) -> bool {
        self.watch.is_open()
    }

    /// The next change of the lease key, or the moment to reopen the watch. Cancel-safe.
    pub(crate) async fn next(&mut self) -> Seen {
        match self.watch.next().await {
            Next::Item(entry) => Seen::Holder(holder(&entry)),
            Next::Reopen => Seen::Reopen,
        }
    }

    /// Reopens the watch; the key's current state when it could be read.
    pub(crate) async fn reopen(&mut self) -> Option<Holder> {
        let (watch, current) = watch(&self.bucket, &self.key, &self.metrics).await;
        self.watch.opened(watch);
        current
    }
}

/// Watches `key` (its current value first, then changes) and reads it once: an empty key
/// delivers nothing, and "no leader" starts counting now.
async fn watch(bucket: &kv::Store, key: &str, metrics: &Metrics) -> (Option<kv::Watch>, Option<Holder>) {
    let watch = match bucket.watch_with_history(key).await {
        Ok(watch) => watch,
        Err(error) => {
            tracing::warn!(%error, "cannot watch the leader lease; retrying");
            return (None, None);
        }
    };
    let current = match bucket.entry(key).await {
        Ok(entry) => Some(match jetsched_shared::cas::live(entry) {
            Some(entry) => holder(&entry),
            None => Holder { holder: None, since: Utc::now() },
        }),
        Err(error) => {
            metrics.errors.with_label_values(&["lease_read"]).inc();
            tracing::warn!(%error, "cannot read the leader lease");
            None
        }
    };
    (Some(watch), current)
}

fn holder(entry: &kv::Entry) -> Holder {
    let nanos = entry.created.unix_timestamp_nanos();
    let since = DateTime::from_timestamp_nanos(i64::try_from(nanos).unwrap_or(i64::MAX));
    let holder = (entry.operation == kv::Operation::Put).then(|| {
        serde_json::from_slice::<LeaderRecord>(&entry.value)
            .map(|record| record.instance)
            .unwrap_or_else(|_| "unknown".to_string())
    });
    Holder { holder, since }
}
