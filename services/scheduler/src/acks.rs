//! The acknowledgements of a leader's dispatch publishes, all on one subscription: each
//! dispatch is published with the reply subject `<inbox>.<n>` (`n` counts this replica's
//! publishes), and the stream's answer (stored, duplicate, refused) or the server's "no
//! responders" status comes back on `<inbox>.*`. A publish not answered within
//! [`ACK_TIMEOUT`] has failed: the loop publishes the fire again with the same message id,
//! which the stream stores at most once.
//!
//! One subscription instead of a JetStream request per publish: no inbox, channel, timer or
//! permit per dispatch, which is most of what a dispatch costs the scheduler's process beyond
//! building it.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use async_nats::{Message, StatusCode, Subject};
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use serde::Deserialize;
use tokio::time::{Instant, sleep_until};

use crate::fire::Fire;

/// How long a publish waits for its acknowledgement (as a JetStream request by default).
pub(crate) const ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// The stream stored the dispatch, or had stored it already (`duplicate`: same message id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) duplicate: bool,
}

/// Why a publish is not known to be stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AckError {
    /// No answer within [`ACK_TIMEOUT`] (lost with a connection, or a server too slow).
    TimedOut,
    /// No stream listens on the subject: the server's 503 status.
    NoResponders,
    /// The stream refused the message: its error code and description.
    Refused { code: u16, description: String },
    /// An answer that is not a publish acknowledgement.
    Unreadable(String),
}

impl fmt::Display for AckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AckError::TimedOut => write!(f, "no acknowledgement within {ACK_TIMEOUT:?}"),
            AckError::NoResponders => write!(f, "no stream answers on the subject (no responders)"),
            AckError::Refused { code, description } => {
                write!(f, "refused by the stream ({code}): {description}")
            }
            AckError::Unreadable(what) => write!(f, "unreadable acknowledgement: {what}"),
        }
    }
}

/// A publish and its outcome.
pub(crate) type Acked = (Fire, Result<Stored, AckError>);

/// A JetStream publish acknowledgement, or its error.
#[derive(Deserialize)]
struct Reply {
    #[serde(default)]
    duplicate: bool,
    error: Option<ReplyError>,
    stream: Option<String>,
}

#[derive(Deserialize)]
struct ReplyError {
    #[serde(default)]
    code: u16,
    #[serde(default)]
    description: String,
}

/// Publishes awaiting their acknowledgement, by the number in their reply subject.
pub(crate) struct Acks {
    /// `<inbox>.`: a reply subject is this and the publish's number.
    prefix: String,
    replies: BoxStream<'static, Message>,
    /// The subscription ended (the client closed): only deadlines are left.
    closed: bool,
    last: u64,
    /// Number -> the fire and the instant its acknowledgement is due by. Numbers grow with time,
    /// so the first entry is always the earliest deadline.
    pending: BTreeMap<u64, (Fire, Instant)>,
}

impl Acks {
    /// Acknowledgements arriving on `replies`, the subscription to `<inbox>.*`.
    pub(crate) fn new(inbox: &str, replies: BoxStream<'static, Message>) -> Acks {
        Acks { prefix: format!("{inbox}."), replies, closed: false, last: 0, pending: BTreeMap::new() }
    }

    /// Subscribes to a fresh inbox of `client` for the acknowledgements.
    pub(crate) async fn subscribe(client: &async_nats::Client) -> anyhow::Result<Acks> {
        let inbox = client.new_inbox();
        let replies = client.subscribe(format!("{inbox}.*")).await?;
        Ok(Acks::new(&inbox, replies.boxed()))
    }

    /// The number and reply subject of `fire`'s publish, sent at `now`.
    pub(crate) fn reply_to(&mut self, fire: Fire, now: Instant) -> (u64, Subject) {
        self.last += 1;
        self.pending.insert(self.last, (fire, now + ACK_TIMEOUT));
        (self.last, Subject::from(format!("{}{}", self.prefix, self.last)))
    }

    /// Publish `number` was not sent after all: no acknowledgement is awaited for it.
    pub(crate) fn unsent(&mut self, number: u64) -> Option<Fire> {
        self.pending.remove(&number).map(|(fire, _)| fire)
    }

    pub(crate) fn len(&self) -> usize {
        self.pending.len()
    }

    /// Forgets every publish awaited; their answers, if they come, are ignored.
    pub(crate) fn clear(&mut self) {
        self.pending.clear();
    }

    /// The next acknowledged or timed-out publish (pending while none is awaited).
    pub(crate) async fn next(&mut self) -> Acked {
        loop {
            let Some(&(_, deadline)) = self.pending.values().next() else {
                return std::future::pending().await;
            };
            tokio::select! {
                biased;
                reply = self.replies.next(), if !self.closed => match reply {
                    Some(reply) => {
                        if let Some(acked) = self.answer(&reply) {
                            return acked;
                        }
                    }
                    None => self.closed = true,
                },
                () = sleep_until(deadline) => {
                    if let Some(acked) = self.expired(Instant::now()) {
                        return acked;
                    }
                }
            }
        }
    }

    /// An answer already arrived or a deadline already passed, if any: never waits.
    pub(crate) fn ready(&mut self) -> Option<Acked> {
        while !self.closed {
            match self.replies.next().now_or_never() {
                Some(Some(reply)) => {
                    if let Some(acked) = self.answer(&reply) {
                        return Some(acked);
                    }
                }
                Some(None) => self.closed = true,
                None => break,
            }
        }
        self.expired(Instant::now())
    }

    /// The oldest publish, if its deadline is past.
    fn expired(&mut self, now: Instant) -> Option<Acked> {
        let entry = self.pending.first_entry().filter(|entry| entry.get().1 <= now)?;
        let (fire, _) = entry.remove();
        Some((fire, Err(AckError::TimedOut)))
    }

    /// The publish `reply` answers and its outcome; `None` for one not awaited (forgotten by
    /// [`Acks::clear`], or timed out already).
    fn answer(&mut self, reply: &Message) -> Option<Acked> {
        let number = reply.subject.as_str().strip_prefix(self.prefix.as_str())?.parse::<u64>().ok()?;
        let (fire, _) = self.pending.remove(&number)?;
        Some((fire, outcome(reply)))
    }
}

/// What an answer says.
fn outcome(reply: &Message) -> Result<Stored, AckError> {
    match reply.status {
        None | Some(StatusCode::OK) => {}
        Some(StatusCode::NO_RESPONDERS) => return Err(AckError::NoResponders),
        Some(status) => {
            let description = reply.description.clone().unwrap_or_default();
            return Err(AckError::Unreadable(format!("status {status} {description}")));
        }
    }
    match serde_json::from_slice::<Reply>(&reply.payload) {
        Ok(Reply { error: Some(error), .. }) => {
            Err(AckError::Refused { code: error.code, description: error.description })
        }
        Ok(Reply { stream: Some(_), duplicate, .. }) => Ok(Stored { duplicate }),
        Ok(Reply { .. }) => Err(AckError::Unreadable("neither a stream nor an error".to_string())),
        Err(error) => Err(AckError::Unreadable(error.to_string())),
    }
}

/// An answer on `subject` as the subscription delivers it (for tests).
#[cfg(test)]
pub(crate) fn answer_on(subject: &Subject, status: Option<StatusCode>, payload: &str) -> Message {
    Message {
        subject: subject.clone(),
        reply: None,
        payload: payload.to_string().into(),
        headers: None,
        status,
        description: None,
        length: payload.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::channel::mpsc;
    use jetsched_shared::wire::Trigger;

    fn fire(nominal_ms: i64) -> Fire {
        Fire { idx: 0, generation: 1, nominal_ms, trigger: Trigger::Schedule }
    }

    fn acks() -> (Acks, mpsc::UnboundedSender<Message>) {
        let (sender, receiver) = mpsc::unbounded();
        (Acks::new("_INBOX.test", receiver.boxed()), sender)
    }

    #[test]
    fn each_answer_settles_its_own_publish_whatever_the_order() {
        let (mut acks, replies) = acks();
        let now = Instant::now();
        let subjects: Vec<Subject> = (1..=5).map(|ms| acks.reply_to(fire(ms), now).1).collect();
        assert_eq!(subjects[0].as_str(), "_INBOX.test.1");
        let answers = [
            (4, None, r#"{"stream":"D","seq":7}"#),
            (1, None, r#"{"stream":"D","seq":8,"duplicate":true}"#),
            (2, Some(StatusCode::NO_RESPONDERS), ""),
            (3, None, r#"{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"}}"#),
            (5, None, "not json"),
        ];
        for (index, status, payload) in answers {
            replies.unbounded_send(answer_on(&subjects[index - 1], status, payload)).unwrap();
        }
        let taken: Vec<(i64, Result<Stored, AckError>)> =
            std::iter::from_fn(|| acks.ready()).map(|(fire, result)| (fire.nominal_ms, result)).collect();
        assert_eq!(taken.len(), 5, "{taken:?}");
        assert_eq!(taken[0], (4, Ok(Stored { duplicate: false })));
        assert_eq!(taken[1], (1, Ok(Stored { duplicate: true })));
        assert_eq!(taken[2], (2, Err(AckError::NoResponders)));
        assert_eq!(
            taken[3],
            (3, Err(AckError::Refused { code: 503, description: "maximum messages exceeded".to_string() }))
        );
        assert!(matches!(taken[4], (5, Err(AckError::Unreadable(_)))), "{:?}", taken[4]);
        assert_eq!(acks.len(), 0);
    }

    #[test]
    fn answers_of_forgotten_or_unknown_publishes_are_ignored() {
        let (mut acks, replies) = acks();
        let now = Instant::now();
        let (_, first) = acks.reply_to(fire(1), now);
        let (number, second) = acks.reply_to(fire(2), now);
        assert_eq!(acks.unsent(number).map(|f| f.nominal_ms), Some(2));
        acks.clear();
        let (_, third) = acks.reply_to(fire(3), now);
        assert_ne!(third, first, "numbers are never reused");
        let ok = r#"{"stream":"D","seq":1}"#;
        for subject in
            [&first, &second, &Subject::from("_INBOX.other.3"), &Subject::from("_INBOX.test.x"), &third]
        {
            replies.unbounded_send(answer_on(subject, None, ok)).unwrap();
        }
        let taken: Vec<i64> = std::iter::from_fn(|| acks.ready()).map(|(fire, _)| fire.nominal_ms).collect();
        assert_eq!(taken, [3]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unanswered_publish_times_out_oldest_first() {
        let (mut acks, replies) = acks();
        let start = Instant::now();
        acks.reply_to(fire(1), start);
        tokio::time::advance(Duration::from_secs(1)).await;
        let (_, second) = acks.reply_to(fire(2), Instant::now());
        assert!(acks.ready().is_none(), "nothing answered or due yet");
        tokio::time::advance(Duration::from_secs(4)).await;
        let (fire_1, result) = acks.next().await;
        assert_eq!((fire_1.nominal_ms, result), (1, Err(AckError::TimedOut)));
        assert_eq!(Instant::now(), start + Duration::from_secs(5));
        // The second is answered before its deadline.
        replies.unbounded_send(answer_on(&second, None, r#"{"stream":"D","seq":2}"#)).unwrap();
        let (fire_2, result) = acks.next().await;
        assert_eq!((fire_2.nominal_ms, result), (2, Ok(Stored { duplicate: false })));
        // Nothing awaited: `next` waits for good.
        assert!(acks.next().now_or_never().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_subscription_leaves_the_deadlines() {
        let (mut acks, replies) = acks();
        acks.reply_to(fire(1), Instant::now());
        drop(replies);
        assert!(acks.ready().is_none());
        let (fire, result) = acks.next().await;
        assert_eq!((fire.nominal_ms, result), (1, Err(AckError::TimedOut)));
    }
}
