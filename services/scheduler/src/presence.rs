//! The leader presence probe: every replica answers `<prefix>.scheduler.leader.<instance>` on
//! its own connection, in a task of its own (never behind the dispatch loop); followers ask
//! the lease holder's subject every [`PROBE_EVERY`].
//!
//! The server answers "no responders" at once when it has no subscription for a subject, so
//! once the holder's connection is gone (its process killed, its socket closed) the followers
//! know within a probe or two instead of a whole lease. Only that answer counts against the
//! holder: a timeout (a holder alive but slow, frozen, or cut off while the server still keeps
//! its connection) changes nothing, and the lease stays the bound. A "no responders" from a
//! server that has not yet learned of the holder's subscription (a cluster propagates interest
//! between servers) must not depose it either: a holder counts as gone only after it has
//! answered this replica at least once and then "no responders" came [`GONE_IN_A_ROW`] times in
//! a row, all while the lease entry kept the revision the takeover then compares and sets.

use std::time::Duration;

use async_nats::{Client, RequestErrorKind};
use bytes::Bytes;
use futures::StreamExt;
use tokio::task::JoinHandle;

/// How often a follower asks the lease holder whether its connection lives.
pub(crate) const PROBE_EVERY: Duration = Duration::from_millis(100);
/// How long one probe waits for its answer (a late answer is no evidence either way).
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_millis(250);
/// "No responders" answers in a row that make a holder gone.
pub(crate) const GONE_IN_A_ROW: u32 = 2;

/// This replica's answering subscription; aborted on drop.
pub(crate) struct Responder {
    task: JoinHandle<()>,
}

impl Responder {
    /// Subscribes to `subject` and answers every request with an empty reply; returns once the
    /// server has the subscription.
    pub(crate) async fn start(client: &Client, subject: String) -> anyhow::Result<Responder> {
        let mut requests = client
            .subscribe(subject.clone())
            .await
            .map_err(|e| anyhow::anyhow!("subscribe to the presence subject {subject}: {e}"))?;
        client.flush().await.map_err(|e| anyhow::anyhow!("flush the presence subscription: {e}"))?;
        let client = client.clone();
        let task = tokio::spawn(async move {
            while let Some(request) = requests.next().await {
                if let Some(reply) = request.reply
                    && let Err(error) = client.publish(reply, Bytes::new()).await
                {
                    tracing::debug!(%error, "presence answer not sent");
                }
            }
        });
        Ok(Responder { task })
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What one probe learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The holder answered.
    Alive,
    /// The server has no subscriber for the holder's subject.
    NoResponders,
    /// No answer in time, or an error of this replica's own connection: no evidence.
    Unknown,
}

/// Asks `subject` once.
pub(crate) async fn ask(client: &Client, subject: String) -> Answer {
    match tokio::time::timeout(PROBE_TIMEOUT, client.request(subject, Bytes::new())).await {
        Ok(Ok(_)) => Answer::Alive,
        Ok(Err(error)) if error.kind() == RequestErrorKind::NoResponders => Answer::NoResponders,
        Ok(Err(_)) | Err(_) => Answer::Unknown,
    }
}

/// The lease holder as a follower watches it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Holder {
    instance: String,
    /// The lease entry's revision last seen (a takeover compares and sets exactly this one).
    revision: u64,
    /// It answered this replica at least once.
    answered: bool,
    /// "No responders" in a row since.
    gone: u32,
}

/// The follower's view of the holder, from the lease key's watch and the probes (pure).
#[derive(Debug, Default)]
pub(crate) struct Probe {
    holder: Option<Holder>,
}

impl Probe {
    /// The lease entry `revision` names `instance` as holder.
    pub(crate) fn held(&mut self, instance: &str, revision: u64) {
        match &mut self.holder {
            Some(holder) if holder.instance == instance => {
                // A renewal: the holder lives; what it answered before still counts.
                holder.revision = revision;
                holder.gone = 0;
            }
            _ => {
                self.holder =
                    Some(Holder { instance: instance.to_string(), revision, answered: false, gone: 0 })
            }
        }
    }

    /// The lease was released or expired: nobody to probe.
    pub(crate) fn released(&mut self) {
        self.holder = None;
    }

    /// The instance to probe, if any.
    pub(crate) fn target(&self) -> Option<&str> {
        self.holder.as_ref().map(|h| h.instance.as_str())
    }

    /// Takes a probe's answer; `Some(revision)` when the holder is gone and the lease entry at
    /// `revision` may be taken over.
    pub(crate) fn answered(&mut self, answer: Answer) -> Option<u64> {
        let holder = self.holder.as_mut()?;
        match answer {
            Answer::Alive => {
                holder.answered = true;
                holder.gone = 0;
            }
            Answer::NoResponders if holder.answered => holder.gone += 1,
            Answer::NoResponders | Answer::Unknown => holder.gone = 0,
        }
        (holder.gone >= GONE_IN_A_ROW).then_some(holder.revision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Answer::*;

    fn run(answers: &[Answer]) -> Vec<Option<u64>> {
        let mut probe = Probe::default();
        probe.held("a", 7);
        answers.iter().map(|&a| probe.answered(a)).collect()
    }

    #[test]
    fn only_no_responders_in_a_row_after_an_answer_make_the_holder_gone() {
        let cases: &[(&[Answer], Option<u64>)] = &[
            // Never answered this replica (its server may not know the subscription yet).
            (&[NoResponders, NoResponders, NoResponders], None),
            (&[Alive, NoResponders, NoResponders], Some(7)),
            (&[Alive, NoResponders], None),
            // A timeout between breaks the run: a slow holder is not gone.
            (&[Alive, NoResponders, Unknown, NoResponders], None),
            (&[Alive, Unknown, Unknown, Unknown, Unknown], None),
            (&[Alive, NoResponders, Alive, NoResponders], None),
        ];
        for (answers, last) in cases {
            assert_eq!(run(answers).last().copied().flatten(), *last, "{answers:?}");
        }
    }

    #[test]
    fn a_renewal_restarts_the_count_and_a_new_holder_must_answer_first() {
        let mut probe = Probe::default();
        assert_eq!(probe.answered(NoResponders), None, "no holder, nothing to take");
        probe.held("a", 7);
        probe.answered(Alive);
        probe.answered(NoResponders);
        probe.held("a", 8);
        assert_eq!(probe.answered(NoResponders), None);
        assert_eq!(probe.answered(NoResponders), Some(8), "the revision last seen");
        probe.held("b", 9);
        assert_eq!(probe.target(), Some("b"));
        assert_eq!(probe.answered(NoResponders), None);
        assert_eq!(probe.answered(NoResponders), None);
        probe.released();
        assert_eq!(probe.target(), None);
    }
}
