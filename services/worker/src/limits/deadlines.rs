//! The deadline loop: every worker sleeps until the earliest time a key with waiting runs
//! needs a hand-over (a lease end, or an override that raised a limit) or its block of slots
//! taken ahead needs a write, and does it then.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio_util::sync::CancellationToken;

use super::{Limits, RETRY_AFTER, micros, rules};

impl Limits {
    /// Sleeps until the earliest time a key with waiting runs needs a hand-over (a lease end,
    /// or now after an override raised its limit), then drops expired holders and hands their
    /// slots over; re-plans on every change of the bucket. Until `stop`.
    pub(crate) async fn deadlines(self: Arc<Self>, stop: CancellationToken) {
        let mut retry_at: HashMap<String, chrono::DateTime<Utc>> = HashMap::new();
        loop {
            let now = Utc::now();
            let due: Vec<(String, chrono::DateTime<Utc>)> = {
                let known = self.known.lock().unwrap_or_else(|p| p.into_inner());
                known
                    .iter()
                    .filter_map(|(key, v)| rules::next_due(&v.record, now).map(|at| (key.clone(), at)))
                    .map(|(key, at)| {
                        let at = retry_at.get(&key).map_or(at, |retry| at.max(*retry));
                        (key, at)
                    })
                    .collect()
            };
            let lease_us = self.lease.as_micros() as i64;
            let blocks_due: Vec<(String, i64)> = {
                let mut blocks = self.blocks.lock().unwrap_or_else(|p| p.into_inner());
                let now_us = micros(now);
                blocks.retain(|_, b| !b.forgotten(now_us));
                blocks
                    .iter()
                    .filter_map(|(key, b)| b.due(lease_us).map(|at| (key.clone(), at)))
                    .map(|(key, at)| {
                        let at = retry_at.get(&key).map_or(at, |retry| at.max(micros(*retry)));
                        (key, at)
                    })
                    .collect()
            };
            let next_block = blocks_due.iter().map(|(_, at)| *at).min();
            let next_block = next_block.and_then(|at| chrono::DateTime::from_timestamp_micros(at.max(0)));
            let next = due.iter().map(|(_, at)| *at).chain(next_block).min();
            let wait = next.map(|at| (at - now).to_std().unwrap_or_default());
            let changed = self.changed.notified();
            tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                () = changed => continue,
                () = sleep_for(wait) => {}
            }
            let now = Utc::now();
            retry_at.retain(|_, at| *at > now);
            for (key, at) in due.into_iter().filter(|(_, at)| *at <= now) {
                let _ = at;
                if let Err(error) = self.reclaim(&key).await {
                    self.metrics.errors.with_label_values(&["limit"]).inc();
                    tracing::warn!(error = format!("{error:#}"), key, "cannot hand a concurrency slot over");
                    retry_at.insert(key, now + chrono::Duration::from_std(RETRY_AFTER).unwrap_or_default());
                }
            }
            let now_us = micros(Utc::now());
            for (key, _) in blocks_due.into_iter().filter(|(_, at)| *at <= now_us) {
                let write = self.block(&key, |b| {
                    let write = !b.writing && b.tick(now_us, lease_us, self.most);
                    if write {
                        b.writing = true;
                    }
                    write
                });
                if write == Some(true)
                    && let Err(error) = self.give_back(&key).await
                {
                    self.metrics.errors.with_label_values(&["limit"]).inc();
                    tracing::warn!(
                        error = format!("{error:#}"),
                        key,
                        "cannot write the block of slots taken ahead"
                    );
                    retry_at.insert(key, now + chrono::Duration::from_std(RETRY_AFTER).unwrap_or_default());
                }
            }
        }
    }

    /// Drops the expired holders of `key` and hands free slots over.
    async fn reclaim(self: &Arc<Self>, key: &str) -> anyhow::Result<()> {
        let lease = self.lease_chrono();
        let worker = self.worker.clone();
        let name = key.to_string();
        let handed = self
            .modify(key, move |record| {
                let expired = rules::expire(record, Utc::now());
                let handed = rules::hand_over(record, &worker, Utc::now(), lease);
                if expired > 0 {
                    tracing::info!(
                        key = name.as_str(),
                        expired,
                        "concurrency slots whose lease ran out reclaimed"
                    );
                }
                let changed = expired > 0 || !handed.is_empty();
                (handed, changed)
            })
            .await?;
        self.deliver_handed(key, handed).await;
        Ok(())
    }
}

/// Sleeps `wait`, or forever without one.
async fn sleep_for(wait: Option<Duration>) {
    match wait {
        Some(wait) => tokio::time::sleep(wait).await,
        None => std::future::pending().await,
    }
}
