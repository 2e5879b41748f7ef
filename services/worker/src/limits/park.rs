//! A run parked while it waits for a slot: its dispatch published again on its held-run subject
//! (`<prefix>.delayed.<queue>.<namespace>.<task>.<execution>`, no worker consumer's filter)
//! as a message the server holds, aimed at the subject it came on. It keeps its headers and
//! carries the attempts executed so far ([`HDR_ATTEMPTS_SPENT`]), so waiting spends none. Its
//! message id is `<execution_id>:wait:<sequence>` (the delivery's stream sequence: a
//! redelivery parks it once). A hand-over publishes it back early; otherwise the server
//! releases it after [`comeback`], and the run asks for its slot again, keeping its place.

use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::{self, Message};
use async_nats::{HeaderMap, HeaderValue};
use chrono::{DateTime, Utc};
use jetsched_shared::wire::{HDR_ATTEMPTS_SPENT, HDR_SCHEDULE, HDR_SCHEDULE_TARGET, format_time};

/// When a parked run comes back by itself unless a hand-over wakes it earlier: two leases.
pub(crate) fn comeback(now: DateTime<Utc>, lease: Duration) -> DateTime<Utc> {
    now + chrono::Duration::from_std(lease * 2).unwrap_or(chrono::Duration::seconds(60))
}

/// Parks `message` (stream sequence `sequence`, attempt `attempt`) on `subject` until `until`;
/// awaits the stream's ack.
pub(crate) async fn park(
    js: &jetstream::Context,
    message: &Message,
    sequence: u64,
    execution_id: &str,
    attempt: u32,
    subject: &str,
    until: DateTime<Utc>,
) -> anyhow::Result<()> {
    let mut headers = HeaderMap::new();
    if let Some(original) = message.headers.as_ref() {
        for (name, values) in original.iter() {
            let name: &str = name.as_ref();
            if name.starts_with("Nats-") || name == HDR_ATTEMPTS_SPENT {
                continue;
            }
            for value in values {
                headers.append(name, value.clone());
            }
        }
    }
    let id = format!("{execution_id}:wait:{sequence}");
    headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
    headers.insert(HDR_ATTEMPTS_SPENT, HeaderValue::from(attempt.saturating_sub(1).to_string()));
    headers.insert(HDR_SCHEDULE, HeaderValue::from(format!("@at {}", format_time(until))));
    headers.insert(HDR_SCHEDULE_TARGET, HeaderValue::from(message.subject.to_string()));
    let ack = js
        .publish_with_headers(subject.to_string(), headers, message.payload.clone())
        .await
        .with_context(|| format!("publish parked run on {subject}"))?;
    ack.await.with_context(|| format!("store parked run on {subject}"))?;
    Ok(())
}
