//! The overview's live facts, read when the page is asked for: the leader lease, the dispatch
//! consumers' depths and the dead-letter count; the live replicas come from the last presence
//! ping (see `replicas`), the rest from the recent activity kept in memory. Also the state of
//! the tasks a list page shows.

use anyhow::Context;
use async_nats::jetstream::{self, kv::Operation};
use chrono::Utc;
use futures::{StreamExt, TryStreamExt};
use jetsched_shared::direct_batch::latest_values;
use jetsched_shared::names::{Names, task_key};
use jetsched_shared::wire::{FireState, LeaderRecord, TaskState};

use crate::activity::{HORIZON, SharedActivity};
use crate::index::TaskSummary;
use crate::pages::overview::{Leader, Overview, QueueDepth};
use crate::replicas::Replicas;

/// Recent failures listed.
const FAILURES: usize = 10;

/// The state of each of `tasks` by the shared rule. Only a one-shot's depends on its fire state
/// (a fired one is completed): those are read in one batched request; one that cannot be read
/// shows what its spec alone tells.
pub(crate) async fn task_states(
    client: &async_nats::Client,
    names: &Names,
    tasks: &[TaskSummary],
) -> Vec<TaskState> {
    let keys: Vec<String> =
        tasks.iter().filter(|t| t.one_shot_at.is_some()).map(|t| task_key(t.namespace(), t.id())).collect();
    let fires = latest_values(client, &names.state_bucket(), &keys).await.unwrap_or_else(|error| {
        tracing::warn!(%error, "cannot read the fire states of one-shots");
        Default::default()
    });
    let fire_of = |t: &TaskSummary| fires.get(&task_key(t.namespace(), t.id())).cloned();
    let decoded = |t: &TaskSummary| fire_of(t).and_then(|v| serde_json::from_slice::<FireState>(&v).ok());
    tasks.iter().map(|t| TaskState::derive(t.one_shot_at, t.paused, decoded(t).as_ref())).collect()
}

/// Reads everything the overview shows; what cannot be read is named in `problems`.
pub(crate) async fn overview(
    client: &async_nats::Client,
    js: &jetstream::Context,
    names: &Names,
    activity: &SharedActivity,
    replicas: &Replicas,
    tasks: usize,
) -> Overview {
    let mut overview = Overview { tasks, ..Overview::default() };
    let (found, leader, queues, dead_letters) = tokio::join!(
        replicas.found(client, names),
        leader(js, names),
        queues(js, names),
        dead_letters(js, names)
    );
    for (role, found) in found {
        match found {
            Ok(instances) => overview.replicas.push((role.to_string(), instances)),
            Err(error) => overview.problems.push(format!("{role} presence: {error}")),
        }
    }
    match leader {
        Ok(leader) => overview.leader = leader,
        Err(error) => overview.problems.push(format!("leader: {error:#}")),
    }
    match queues {
        Ok(queues) => overview.queues = queues,
        Err(error) => overview.problems.push(format!("queues: {error:#}")),
    }
    match dead_letters {
        Ok(count) => overview.dead_letters = Some(count),
        Err(error) => overview.problems.push(format!("dead letters: {error:#}")),
    }
    let now = Utc::now();
    let activity = activity.read().expect("activity lock");
    (overview.fires_per_second, overview.runs_per_second) = activity.rates(now);
    overview.minutes = activity.per_minute(now, 60);
    overview.failures = crate::activity::failed_runs(activity.events()).take(FAILURES).cloned().collect();
    overview.alerts = activity.alerts_since(now - chrono::Duration::from_std(HORIZON).expect("an hour"));
    overview
}

async fn leader(js: &jetstream::Context, names: &Names) -> anyhow::Result<Option<Leader>> {
    let kv = js.get_key_value(names.leader_bucket()).await.context("open the leader bucket")?;
    let Some(entry) = kv.entry(names.leader_key()).await.context("read the leader lease")? else {
        return Ok(None);
    };
    if entry.operation != Operation::Put {
        return Ok(None);
    }
    let record: LeaderRecord = serde_json::from_slice(&entry.value).context("decode the lease")?;
    Ok(Some(Leader {
        instance: record.instance,
        term: if record.term == 0 { entry.revision } else { record.term },
        since: record.acquired_at,
    }))
}

async fn queues(js: &jetstream::Context, names: &Names) -> anyhow::Result<Vec<QueueDepth>> {
    let stream = js.get_stream(names.dispatch_stream()).await.context("open the dispatch stream")?;
    let held = held_by_queue(&stream, names).await;
    let mut consumers = stream.consumers();
    let mut out = Vec::new();
    while let Some(consumer) = consumers.next().await {
        let consumer = consumer.context("list dispatch consumers")?;
        // The held runs of a queue are shown once, on its `normal` lane's row.
        let of_queue = names.queue_of_worker_consumer(&consumer.name);
        let queue = of_queue.unwrap_or(&consumer.name).to_string();
        let held = match (&held, of_queue) {
            (Ok(held), Some(queue)) => Some(held.get(queue).copied().unwrap_or(0)),
            (Ok(_), None) => Some(0),
            (Err(_), _) => None,
        };
        out.push(QueueDepth {
            queue,
            pending: consumer.num_pending,
            in_flight: consumer.num_ack_pending as u64,
            held,
        });
    }
    out.sort_by(|a, b| a.queue.cmp(&b.queue));
    Ok(out)
}

/// Held runs per queue: one listing of the held subjects of the dispatch stream
/// (`<prefix>.delayed.<queue>.<namespace>.<task>.<execution>`).
async fn held_by_queue(
    stream: &jetstream::stream::Stream,
    names: &Names,
) -> anyhow::Result<std::collections::HashMap<String, u64>> {
    let subjects = stream.info_with_subjects(names.delayed_wildcard()).await.context("list held runs")?;
    let listed: Vec<(String, usize)> = subjects.try_collect().await.context("list held runs")?;
    let mut held = std::collections::HashMap::new();
    for (subject, count) in listed {
        if let Some(queue) = names.parse_delayed_queue(&subject) {
            *held.entry(queue.to_string()).or_default() += count as u64;
        }
    }
    Ok(held)
}

async fn dead_letters(js: &jetstream::Context, names: &Names) -> anyhow::Result<u64> {
    let mut stream = js.get_stream(names.dlq_stream()).await.context("open the dead-letter stream")?;
    Ok(stream.info().await.context("dead-letter stream info")?.state.messages)
}
