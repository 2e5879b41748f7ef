//! The events the rules read through durable consumers shared by replicas: one consumer per
//! kind that an enabled rule reads ([`Rule::reads`]), except the leader changes every replica
//! reads on its own (`leaders`); and the pull of them, paused after an error.

use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::{
    self,
    consumer::{AckPolicy, DeliverPolicy, PullConsumer, pull},
};
use futures::StreamExt;
use futures::stream::SelectAll;
use jetsched_shared::backoff::Backoff;
use jetsched_shared::names::Names;
use jetsched_shared::wire::EventKind;
use tokio::time::{Instant, sleep_until};

use crate::leaders::LEADER_KIND;
use crate::metrics::Metrics;
use crate::rules::Rule;

/// First pause after a pull error; it doubles up to [`PULL_RETRY_MAX`] while errors last and
/// starts over after a message.
const PULL_RETRY_FIRST: Duration = Duration::from_millis(200);
const PULL_RETRY_MAX: Duration = Duration::from_secs(5);

/// The kinds read through the shared consumers when `rules` are on, one consumer each.
pub(crate) fn shared_kinds(rules: &[Rule]) -> Vec<EventKind> {
    let mut kinds: Vec<EventKind> = Vec::new();
    for &kind in rules.iter().flat_map(|rule| rule.reads()) {
        if kind != LEADER_KIND && !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    kinds
}

/// The subject filter of the shared consumer of `kind`.
fn filter(names: &Names, kind: EventKind) -> String {
    names.event_subject(kind.as_str(), "*", "*")
}

/// The durable consumers on the events stream for `rules`, each filtered to its kind alone
/// (see [`Names::alerter_consumer`] for why not one consumer with several filters). A new
/// consumer starts with new events: history is not re-alerted. The earlier combined consumer,
/// if any, is removed.
pub(crate) async fn consumers(
    js: &jetstream::Context,
    names: &Names,
    rules: &[Rule],
) -> anyhow::Result<Vec<PullConsumer>> {
    let name = names.events_stream();
    let stream = js.get_stream(&name).await.with_context(|| format!("look up stream {name}"))?;
    let combined = names.alerter_combined_consumer();
    match stream.delete_consumer(combined).await {
        Ok(_) => tracing::info!(consumer = combined, "removed the earlier combined events consumer"),
        Err(error) => tracing::debug!(%error, consumer = combined, "no earlier combined events consumer"),
    }
    let kinds = shared_kinds(rules);
    let mut consumers = Vec::with_capacity(kinds.len());
    for kind in kinds {
        let durable = names.alerter_consumer(kind.as_str());
        let consumer = stream
            .create_consumer(pull::Config {
                durable_name: Some(durable.clone()),
                description: Some(format!("jetsched alerter: {} events", kind.as_str())),
                filter_subject: filter(names, kind),
                deliver_policy: DeliverPolicy::New,
                ack_policy: AckPolicy::Explicit,
                ack_wait: Duration::from_secs(30),
                max_ack_pending: 1000,
                ..Default::default()
            })
            .await
            .with_context(|| format!("ensure consumer {durable} on {name}"))?;
        consumers.push(consumer);
    }
    Ok(consumers)
}

/// The messages of every shared consumer, merged.
pub(crate) struct Feed {
    messages: SelectAll<pull::Stream>,
    pause: Backoff,
    paused_until: Option<Instant>,
    metrics: Metrics,
}

impl Feed {
    pub(crate) async fn start(consumers: &[PullConsumer], metrics: Metrics) -> anyhow::Result<Feed> {
        let mut pulls = Vec::with_capacity(consumers.len());
        for consumer in consumers {
            pulls.push(
                consumer
                    .stream()
                    .max_messages_per_batch(256)
                    .messages()
                    .await
                    .context("start pulling events")?,
            );
        }
        Ok(Feed {
            messages: futures::stream::select_all(pulls),
            pause: Backoff::new(PULL_RETRY_FIRST, PULL_RETRY_MAX),
            paused_until: None,
            metrics,
        })
    }

    /// The next message; `None` once every pull ended. After a pull error it waits out a
    /// pause first. Cancel-safe.
    pub(crate) async fn next(&mut self) -> Option<jetstream::Message> {
        loop {
            if let Some(until) = self.paused_until {
                sleep_until(until).await;
                self.paused_until = None;
            }
            match self.messages.next().await? {
                Ok(message) => {
                    self.pause.reset();
                    return Some(message);
                }
                Err(error) => {
                    self.metrics.errors.with_label_values(&["pull"]).inc();
                    tracing::warn!(%error, "pulling events failed; continuing");
                    self.paused_until = Some(Instant::now() + self.pause.next_delay());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leaders::leader_filter;

    /// Whether `subject` matches the NATS subject `filter` (`*` one token, `>` the rest).
    fn matches(filter: &str, subject: &str) -> bool {
        let (mut f, mut s) = (filter.split('.'), subject.split('.'));
        loop {
            match (f.next(), s.next()) {
                (Some(">"), Some(_)) => return true,
                (Some(a), Some(b)) if a == "*" || a == b => {}
                (None, None) => return true,
                _ => return false,
            }
        }
    }

    /// Every kind a rule reads reaches the alerter: a shared consumer's filter or the leader
    /// events' takes its events.
    #[test]
    fn every_kind_a_rule_reads_is_consumed() {
        let names = Names::default();
        for rule in Rule::ALL {
            let mut filters: Vec<String> =
                shared_kinds(&[rule]).into_iter().map(|kind| filter(&names, kind)).collect();
            filters.push(leader_filter(&names));
            for kind in rule.reads() {
                let subject = names.event_subject(kind.as_str(), "billing", "report");
                assert!(
                    filters.iter().any(|f| matches(f, &subject)),
                    "{} reads {}, which no consumer takes ({filters:?})",
                    rule.name(),
                    kind.as_str()
                );
            }
        }
    }

    #[test]
    fn only_what_enabled_rules_read_is_consumed_once() {
        let kinds =
            |rules: &[Rule]| -> Vec<&str> { shared_kinds(rules).iter().map(|k| k.as_str()).collect() };
        assert_eq!(kinds(&[Rule::RunDead, Rule::NoLeader]), ["run.dead"]);
        assert_eq!(kinds(&[Rule::LeaderChanged, Rule::LeaderFlapping]), Vec::<&str>::new());
        assert_eq!(
            kinds(&Rule::ALL),
            [
                "run.failed",
                "run.dead",
                "fire.dispatched",
                "breaker.opened",
                "breaker.closed",
                "scheduler.clock_skew",
                "after.expired"
            ]
        );
    }
}
