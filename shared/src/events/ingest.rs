//! Events stored through fast-ingest batches (nats-server 2.14+, a stream with `allow_batched`):
//! the events asked while one batch is in flight form the next one, published as plain messages
//! whose reply subjects number them in the batch ([`Names::fast_batch_reply`]), the last one
//! committing it. The server stores each message as it comes and answers the batch once it is
//! stored (plus a flow acknowledgement now and then) instead of once per event, so a busy
//! worker's events cost the server and the worker one reply per batch.
//!
//! Every event asked is answered: stored (a flow acknowledgement or the batch's covers it) or
//! not (refused, cut off by a gap, unanswered within [`BATCH_TIMEOUT`]); the caller publishes
//! the latter again one by one. A server that refuses batches (a stream without
//! `allow_batched`, too many batches in flight) turns them off for [`SUSPEND_FOR`], during
//! which [`Ingest::accepting`] says so and events go the ordinary way.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::{Client, Message, StatusCode, Subject, Subscriber};
use bytes::Bytes;
use futures::StreamExt;
use serde::Deserialize;
use tokio::sync::{mpsc, oneshot};

use crate::names::{FastBatchOp, Names};

/// Most events in one batch.
const MAX_BATCH: usize = 256;

/// Most messages the server may leave unacknowledged within a batch (it sends a flow
/// acknowledgement at least this often; alone on a stream it starts there, beside other
/// batches at 1 and doubles up to a share of 500).
const FLOW: u16 = MAX_BATCH as u16;

/// Events waiting for the next batch, at most (`send` waits beyond).
const QUEUE: usize = 4096;

/// The longest wait for a batch's acknowledgement (that of a JetStream publish).
pub const BATCH_TIMEOUT: Duration = Duration::from_secs(5);

/// After the server refused batches, events go the ordinary way for this long.
pub const SUSPEND_FOR: Duration = Duration::from_secs(30);

/// JetStream error codes meaning "no batches here for now": the stream does not allow them
/// (10205), too many batches in flight on the stream or the server (10211).
const REFUSING_BATCHES: [u64; 2] = [10205, 10211];

/// Whether one event was stored, and if not, why.
pub type Answer = Result<(), String>;

/// One event asked to be stored.
struct Ask {
    subject: Subject,
    body: Bytes,
    answer: oneshot::Sender<Answer>,
}

/// The answer to come for one event ([`Ingest::send`]).
pub struct Pending(oneshot::Receiver<Answer>);

impl Pending {
    /// Waits for the answer.
    pub async fn stored(self) -> Answer {
        self.0.await.unwrap_or_else(|_| Err("the batch publisher stopped".to_string()))
    }
}

/// The handle to a batch publisher task; cheap to clone. The task ends when every handle is
/// gone.
#[derive(Clone)]
pub struct Ingest {
    asks: mpsc::Sender<Ask>,
    suspension: Arc<Suspension>,
}

impl Ingest {
    /// Subscribes to a fresh inbox of `client` for the server's answers and starts the task.
    pub async fn start(client: Client) -> Result<Ingest, async_nats::SubscribeError> {
        let inbox = client.new_inbox();
        let replies = client.subscribe(format!("{inbox}.>")).await?;
        // The inbox's last token is unique to this connection: batch ids of several
        // publishers on one stream never meet.
        let token = inbox.rsplit('.').next().unwrap_or("batch").to_string();
        let suspension = Arc::new(Suspension::new());
        let (asks, queue) = mpsc::channel(QUEUE);
        let batcher =
            Batcher { client, inbox, token, replies, number: 0, suspension: Arc::clone(&suspension) };
        tokio::spawn(batcher.run(queue));
        Ok(Ingest { asks, suspension })
    }

    /// False while batches are off after the server refused them.
    pub fn accepting(&self) -> bool {
        !self.suspension.active()
    }

    /// Asks for `body` to be stored under `subject` in the next batch; `None` when the task has
    /// stopped.
    pub async fn send(&self, subject: Subject, body: Bytes) -> Option<Pending> {
        let (answer, answered) = oneshot::channel();
        self.asks.send(Ask { subject, body, answer }).await.ok()?;
        Some(Pending(answered))
    }
}

/// Until when batches are off (milliseconds since `base`).
struct Suspension {
    base: Instant,
    until_ms: AtomicU64,
}

impl Suspension {
    fn new() -> Suspension {
        Suspension { base: Instant::now(), until_ms: AtomicU64::new(0) }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn active(&self) -> bool {
        self.now_ms() < self.until_ms.load(Ordering::Relaxed)
    }

    fn start(&self, length: Duration) {
        let length = u64::try_from(length.as_millis()).unwrap_or(u64::MAX);
        self.until_ms.store(self.now_ms().saturating_add(length), Ordering::Relaxed);
    }
}

/// The task: one batch in flight at a time.
struct Batcher {
    client: Client,
    /// Every reply subject starts with `<inbox>.`.
    inbox: String,
    /// A batch's id is this and its number.
    token: String,
    replies: Subscriber,
    number: u64,
    suspension: Arc<Suspension>,
}

impl Batcher {
    async fn run(mut self, mut queue: mpsc::Receiver<Ask>) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        while let Some(first) = queue.recv().await {
            // Let the deliveries ending with this one ask too.
            tokio::task::yield_now().await;
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match queue.try_recv() {
                    Ok(ask) => batch.push(ask),
                    Err(_) => break,
                }
            }
            if !self.publish(&mut batch).await {
                // No answer can come any more: the asks queued are dropped (answered "stopped")
                // and later ones go the ordinary way.
                tracing::warn!("the event batches' reply subscription closed; publishing events one by one");
                return;
            }
        }
    }

    /// Publishes `asks` as one batch and answers every one of them (leaving `asks` empty).
    /// False when the reply subscription has closed.
    async fn publish(&mut self, asks: &mut Vec<Ask>) -> bool {
        self.number += 1;
        let id = format!("{}-{}", self.token, self.number);
        let mut progress = Progress::new(asks.len() as u64);
        let last = asks.len() as u64;
        for (seq, ask) in (1..).zip(asks.iter()) {
            let op = match seq {
                _ if seq == last => FastBatchOp::Commit,
                1 => FastBatchOp::Start,
                _ => FastBatchOp::Append,
            };
            let reply = Names::fast_batch_reply(&self.inbox, &id, FLOW, seq, op);
            let sent = self.client.publish_with_reply(ask.subject.clone(), reply, ask.body.clone()).await;
            if let Err(error) = sent {
                // The client is gone: the events sent so far may still be stored, so those
                // published again one by one may be stored twice (as after any lost ack).
                progress.apply(Reply::BatchRefused { code: None, text: format!("publish event: {error}") });
                break;
            }
        }
        let deadline = tokio::time::Instant::now() + BATCH_TIMEOUT;
        let prefix = format!("{}.{id}.", self.inbox);
        let mut answered = 0;
        let mut open = true;
        while progress.end.is_none() {
            let message = match tokio::time::timeout_at(deadline, self.replies.next()).await {
                Ok(Some(message)) => message,
                Ok(None) => {
                    open = false;
                    progress.apply(Reply::BatchRefused {
                        code: None,
                        text: "the reply subscription closed".into(),
                    });
                    break;
                }
                Err(_) => {
                    progress.apply(Reply::BatchRefused {
                        code: None,
                        text: format!("the batch was not acknowledged within {BATCH_TIMEOUT:?}"),
                    });
                    break;
                }
            };
            // An answer to an earlier batch, come too late.
            if !message.subject.starts_with(&prefix) {
                continue;
            }
            let reply = Reply::of(&message);
            if let Reply::BatchRefused { code: Some(code), text } = &reply
                && REFUSING_BATCHES.contains(code)
            {
                tracing::warn!(error = %text, "the events stream refuses batches; publishing events one by one for a while");
                self.suspension.start(SUSPEND_FOR);
            }
            progress.apply(reply);
            let stored = usize::try_from(progress.stored).unwrap_or(usize::MAX);
            for ask in asks.drain(..stored - answered) {
                let _ = ask.answer.send(Ok(()));
            }
            answered = stored;
        }
        let error = progress.end.unwrap_or_default();
        for ask in asks.drain(..) {
            let _ = ask.answer.send(Err(error.clone()));
        }
        open
    }
}

/// What one answer of the server says about a batch.
#[derive(Debug, Clone, PartialEq)]
enum Reply {
    /// Messages up to `seq` are stored.
    Flow { seq: u64 },
    /// Messages from `expected` to before `current` never arrived (the batch ends there).
    Gap { expected: u64, current: u64 },
    /// Message `seq` was refused (the batch ends before it).
    MessageRefused { seq: u64, text: String },
    /// The batch ended: its first `count` messages are stored.
    Committed { count: u64 },
    /// The whole batch was refused.
    BatchRefused { code: Option<u64>, text: String },
    /// Something this publisher does not know; ignored.
    Other,
}

impl Reply {
    fn of(message: &Message) -> Reply {
        if let Some(status) = message.status {
            let text = match status {
                StatusCode::NO_RESPONDERS => "no stream stores the event's subject".to_string(),
                status => format!("status {status}"),
            };
            return Reply::BatchRefused { code: None, text };
        }
        Reply::parse(&message.payload)
    }

    fn parse(payload: &[u8]) -> Reply {
        #[derive(Deserialize)]
        struct Raw {
            #[serde(rename = "type")]
            kind: Option<String>,
            seq: Option<u64>,
            last_seq: Option<u64>,
            count: Option<u64>,
            error: Option<RawError>,
        }
        #[derive(Deserialize)]
        struct RawError {
            err_code: Option<u64>,
            description: Option<String>,
        }
        let Ok(raw) = serde_json::from_slice::<Raw>(payload) else { return Reply::Other };
        let describe = |error: Option<RawError>| {
            let error = error.unwrap_or(RawError { err_code: None, description: None });
            let text = error.description.unwrap_or_else(|| "refused".to_string());
            (error.err_code, text)
        };
        match (raw.kind.as_deref(), raw.seq) {
            (Some("ack"), Some(seq)) => Reply::Flow { seq },
            (Some("gap"), Some(current)) => Reply::Gap { expected: raw.last_seq.unwrap_or(current), current },
            (Some("err"), Some(seq)) => Reply::MessageRefused { seq, text: describe(raw.error).1 },
            (Some(_), _) => Reply::Other,
            (None, _) if raw.error.is_some() => {
                let (code, text) = describe(raw.error);
                Reply::BatchRefused { code, text }
            }
            (None, _) => match raw.count {
                Some(count) => Reply::Committed { count },
                None => Reply::Other,
            },
        }
    }
}

/// One batch's state as the server's answers tell it.
#[derive(Debug, PartialEq)]
struct Progress {
    len: u64,
    /// The first `stored` messages are stored.
    stored: u64,
    /// Why the messages after `stored` were not, once the batch ended; "" when all were.
    end: Option<String>,
    /// The reason told before the end (a refused message, a gap), for the messages after it.
    cause: Option<String>,
}

impl Progress {
    fn new(len: u64) -> Progress {
        Progress { len, stored: 0, end: None, cause: None }
    }

    fn apply(&mut self, reply: Reply) {
        if self.end.is_some() {
            return;
        }
        match reply {
            Reply::Flow { seq } => self.stored = self.stored.max(seq.min(self.len)),
            Reply::Gap { expected, current } => {
                self.cause =
                    Some(format!("batch messages {expected} to {} were lost", current.saturating_sub(1)))
            }
            Reply::MessageRefused { seq, text } => {
                self.cause = Some(format!("batch message {seq} refused: {text}"))
            }
            Reply::Committed { count } => {
                self.stored = self.stored.max(count.min(self.len));
                let cause = self.cause.take();
                self.end = Some(match self.stored == self.len {
                    true => String::new(),
                    false => {
                        cause.unwrap_or_else(|| format!("the batch ended after {} messages", self.stored))
                    }
                });
            }
            Reply::BatchRefused { text, .. } => self.end = Some(text),
            Reply::Other => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_read_as_the_server_writes_them() {
        let table: [(&str, Reply); 8] = [
            (r#"{"type":"ack","seq":0,"msgs":10}"#, Reply::Flow { seq: 0 }),
            (r#"{"type":"ack","seq":40,"msgs":20}"#, Reply::Flow { seq: 40 }),
            (r#"{"type":"gap","last_seq":3,"seq":5}"#, Reply::Gap { expected: 3, current: 5 }),
            (
                r#"{"type":"err","seq":4,"error":{"code":400,"err_code":10054,"description":"message size exceeds maximum allowed"}}"#,
                Reply::MessageRefused { seq: 4, text: "message size exceeds maximum allowed".into() },
            ),
            (r#"{"stream":"EV","seq":17,"batch":"x-1","count":5}"#, Reply::Committed { count: 5 }),
            (
                r#"{"error":{"code":400,"err_code":10205,"description":"batch publish is disabled"},"stream":"EV"}"#,
                Reply::BatchRefused { code: Some(10205), text: "batch publish is disabled".into() },
            ),
            (r#"{"type":"later","seq":1}"#, Reply::Other),
            ("not json", Reply::Other),
        ];
        for (payload, reply) in table {
            assert_eq!(Reply::parse(payload.as_bytes()), reply, "{payload}");
        }
    }

    #[test]
    fn a_batch_is_stored_as_far_as_its_acknowledgements_say() {
        let mut p = Progress::new(5);
        p.apply(Reply::Flow { seq: 0 });
        assert_eq!((p.stored, p.end.is_none()), (0, true));
        p.apply(Reply::Flow { seq: 2 });
        assert_eq!(p.stored, 2);
        p.apply(Reply::Committed { count: 5 });
        assert_eq!((p.stored, p.end.as_deref()), (5, Some("")));
        // Nothing changes a batch once it ended.
        p.apply(Reply::BatchRefused { code: None, text: "late".into() });
        assert_eq!(p.end.as_deref(), Some(""));
    }

    #[test]
    fn the_messages_after_a_refusal_or_a_gap_are_not_stored_and_say_why() {
        let mut p = Progress::new(5);
        p.apply(Reply::MessageRefused { seq: 3, text: "too big".into() });
        p.apply(Reply::Committed { count: 2 });
        assert_eq!((p.stored, p.end.as_deref()), (2, Some("batch message 3 refused: too big")));

        let mut p = Progress::new(5);
        p.apply(Reply::Gap { expected: 2, current: 4 });
        p.apply(Reply::Committed { count: 1 });
        assert_eq!((p.stored, p.end.as_deref()), (1, Some("batch messages 2 to 3 were lost")));

        let mut p = Progress::new(3);
        p.apply(Reply::Committed { count: 1 });
        assert_eq!(p.end.as_deref(), Some("the batch ended after 1 messages"));
    }

    #[test]
    fn a_refused_batch_stores_nothing_past_what_was_acknowledged() {
        let mut p = Progress::new(4);
        p.apply(Reply::Flow { seq: 1 });
        p.apply(Reply::BatchRefused { code: Some(10208), text: "batch publish ID unknown".into() });
        assert_eq!((p.stored, p.end.as_deref()), (1, Some("batch publish ID unknown")));
        // An acknowledgement never counts messages the batch does not have.
        let mut p = Progress::new(2);
        p.apply(Reply::Committed { count: 9 });
        assert_eq!((p.stored, p.end.as_deref()), (2, Some("")));
    }

    #[test]
    fn a_suspension_lasts_its_length() {
        let s = Suspension::new();
        assert!(!s.active());
        s.start(Duration::from_secs(60));
        assert!(s.active());
        s.start(Duration::ZERO);
        assert!(!s.active());
    }
}
