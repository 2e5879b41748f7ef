//! The periodic checks and when the next is due: whether JetStream answers, the pending
//! dispatches of each queue's lanes and the dead-letter stream's depth and limit. Each check
//! updates the gauges and says what it saw; the rules decide.

use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream;
use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use jetsched_shared::follow;
use jetsched_shared::names::{Names, limit_name};
use jetsched_shared::wire::LimitRecord;
use tokio::time::Instant;

use crate::metrics::Metrics;
use crate::rules::{DlqState, LimitWait};

/// How long JetStream has to answer a check.
const ANSWER_WITHIN: Duration = Duration::from_secs(2);

/// What one check saw; a probe that could not be read is `None` (counted and logged).
pub(crate) struct Seen {
    pub(crate) at: DateTime<Utc>,
    /// Why JetStream did not answer; the other probes are skipped then.
    pub(crate) unavailable: Option<String>,
    pub(crate) depths: Option<Vec<(String, u64)>>,
    pub(crate) dlq: Option<DlqState>,
    /// The concurrency keys with waiting runs.
    pub(crate) limit_waits: Option<Vec<LimitWait>>,
}

pub(crate) struct Checks {
    interval: Duration,
    next_at: Instant,
    metrics: Metrics,
}

impl Checks {
    /// Checks every `interval`, the first at once.
    pub(crate) fn new(interval: Duration, metrics: Metrics) -> Checks {
        Checks { interval, next_at: Instant::now(), metrics }
    }

    /// When the next check is due.
    pub(crate) fn next_at(&self) -> Instant {
        self.next_at
    }

    /// Runs a check; the next is due an interval after this one started. The dead-letter
    /// stream is read last: its gauges moving mean every other probe of the check ran.
    pub(crate) async fn run(&mut self, js: &jetstream::Context, names: &Names) -> Seen {
        self.next_at = Instant::now() + self.interval;
        let at = Utc::now();
        let unavailable = match tokio::time::timeout(ANSWER_WITHIN, js.query_account()).await {
            Ok(Ok(_)) => None,
            Ok(Err(error)) => Some(error.to_string()),
            Err(_) => Some(format!("no answer within {ANSWER_WITHIN:?}")),
        };
        if unavailable.is_some() {
            // Every probe below would only wait out its timeout.
            return Seen { at, unavailable, depths: None, dlq: None, limit_waits: None };
        }
        let depths = match within(queue_depths(js, names)).await {
            Ok(depths) => {
                for (queue, depth) in &depths {
                    self.metrics.queue_depth.with_label_values(&[queue]).set(gauge(*depth));
                }
                Some(depths)
            }
            Err(error) => {
                self.metrics.errors.with_label_values(&["queue_depth"]).inc();
                tracing::warn!(error = format!("{error:#}"), "cannot read queue depths");
                None
            }
        };
        // Boxed: the bucket's watch makes a large future, and the check runs inline in the
        // alerter's loop.
        let limit_waits = match within(Box::pin(limit_waits(js, names, at))).await {
            Ok(waits) => Some(waits),
            Err(error) => {
                self.metrics.errors.with_label_values(&["limit_waits"]).inc();
                tracing::warn!(error = format!("{error:#}"), "cannot read the concurrency keys");
                None
            }
        };
        let dlq = match within(dlq_state(js, names)).await {
            Ok(dlq) => {
                self.metrics.dlq_depth.set(gauge(dlq.messages));
                self.metrics.dlq_bytes.set(gauge(dlq.bytes));
                self.metrics.dlq_max_bytes.set(dlq.max_bytes);
                Some(dlq)
            }
            Err(error) => {
                self.metrics.errors.with_label_values(&["dlq_depth"]).inc();
                tracing::warn!(error = format!("{error:#}"), "cannot read the dead-letter stream");
                None
            }
        };
        Seen { at, unavailable, depths, dlq, limit_waits }
    }
}

/// A probe bounded like the check's first question: a server that goes away during a check
/// costs each remaining probe [`ANSWER_WITHIN`], not a request timeout per request it makes,
/// so the next check finds it gone soon.
async fn within<T>(probe: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::time::timeout(ANSWER_WITHIN, probe)
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {ANSWER_WITHIN:?}"))?
}

fn gauge(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// `(queue, pending)` for every queue with worker consumers on the dispatch stream, pending
/// summed over its lanes (one consumer per priority).
async fn queue_depths(js: &jetstream::Context, names: &Names) -> anyhow::Result<Vec<(String, u64)>> {
    let name = names.dispatch_stream();
    let stream = js.get_stream(&name).await.with_context(|| format!("look up {name}"))?;
    let infos: Vec<_> =
        stream.consumers().try_collect().await.with_context(|| format!("list consumers of {name}"))?;
    let mut depths = std::collections::BTreeMap::<String, u64>::new();
    for info in infos {
        if let Some((queue, _)) = names.lane_of_worker_consumer(&info.name) {
            *depths.entry(queue.to_string()).or_default() += info.num_pending;
        }
    }
    Ok(depths.into_iter().collect())
}

/// Every concurrency key with waiting runs, from one read of the limits bucket (the latest
/// record of each key).
async fn limit_waits(
    js: &jetstream::Context,
    names: &Names,
    now: DateTime<Utc>,
) -> anyhow::Result<Vec<LimitWait>> {
    let bucket = names.limits_bucket();
    let kv = js.get_key_value(&bucket).await.with_context(|| format!("look up bucket {bucket}"))?;
    let mut waits = Vec::new();
    let mut undecodable = 0;
    let load = follow::load(&kv, |entry| {
        if !matches!(entry.operation, jetstream::kv::Operation::Put) {
            return;
        }
        let Ok(record) = serde_json::from_slice::<LimitRecord>(&entry.value) else {
            undecodable += 1;
            return;
        };
        let Some(oldest) = record.waiters.iter().min_by_key(|w| w.since) else { return };
        waits.push(LimitWait {
            key: limit_name(&entry.key).unwrap_or(&entry.key).to_string(),
            waiting: record.waiters.len(),
            limit: record.effective_limit(),
            in_use: record.in_use(now),
            since: oldest.since,
            namespace: oldest.namespace.clone(),
            task_id: oldest.task_id.clone(),
            execution_id: oldest.execution_id.clone(),
        });
    });
    // The watch ends with this read: each check reads the bucket afresh.
    load.await?;
    if undecodable > 0 {
        tracing::warn!(bucket, undecodable, "limit records that do not decode are not checked");
    }
    Ok(waits)
}

/// Messages and bytes in the dead-letter stream, and its byte limit.
async fn dlq_state(js: &jetstream::Context, names: &Names) -> anyhow::Result<DlqState> {
    let name = names.dlq_stream();
    let mut stream = js.get_stream(&name).await.with_context(|| format!("look up {name}"))?;
    let info = stream.info().await.with_context(|| format!("read {name} info"))?;
    Ok(DlqState { messages: info.state.messages, bytes: info.state.bytes, max_bytes: info.config.max_bytes })
}
