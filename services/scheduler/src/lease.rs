//! The leader lease in the leader bucket: acquire with `create`, renew with `update(revision)`
//! every lease/3, step down on any error; followers watch the key and campaign on Delete/Purge
//! (expiry arrives as Purge) and at the expected expiry.
//!
//! The lease runs in one task of its own ([`Campaign`] starts and stops it) so a slow server
//! never stalls the dispatch loop. It reports [`LeaseEvent`]s; the loop keeps the local
//! monotonic deadline ([`Timing::valid_until`]) and checks it before every publish (fencing).
//! The term is the revision of the `create` that acquired the lease: it only grows across
//! leaders, and the record keeps it (with the acquisition time) while one leader renews. The
//! record written by the `create` cannot know its own revision: the first renewal, sent at
//! once, stores it (until then a record's term of 0 means "this entry's revision").

use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::kv::{self, Operation};
use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use jetsched_shared::cas::is_already_exists;
use jetsched_shared::wire::LeaderRecord;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;

/// What the lease task tells the dispatch loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LeaseEvent {
    Acquired { term: u64, valid_until: Instant },
    Renewed { valid_until: Instant },
    Lost { reason: String },
}

/// Lease arithmetic (pure).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub(crate) lease: Duration,
    pub(crate) margin: Duration,
}

impl Timing {
    /// Renewal period: a third of the lease.
    pub(crate) fn renew_every(&self) -> Duration {
        self.lease / 3
    }

    /// Until when a lease renewed by a request sent at `sent` lets this replica dispatch: the
    /// server's clock for the key starts after `sent`, so `sent + lease` is conservative, and
    /// the margin covers the time between a check and the publish it guards.
    pub(crate) fn valid_until(&self, sent: Instant) -> Instant {
        sent + self.lease.saturating_sub(self.margin).max(self.renew_every())
    }

    /// When a follower that saw the holder renew at `seen` campaigns if no Purge arrives.
    pub(crate) fn campaign_at(&self, seen: Instant) -> Instant {
        seen + self.lease + self.lease / 10
    }

    /// Bound on one lease request: longer than that and the renewal is as good as lost.
    pub(crate) fn request_timeout(&self) -> Duration {
        self.renew_every()
    }
}

enum Role {
    Follower { campaign_at: Instant },
    Leader { revision: u64, term: u64, acquired_at: DateTime<Utc>, renew_at: Instant },
}

/// The lease task.
struct Lease {
    store: kv::Store,
    key: String,
    instance: String,
    timing: Timing,
    clock: SharedClock,
    events: mpsc::Sender<LeaseEvent>,
    /// Cancelled once the dispatch loop has stopped and flushed: a leader then deletes its key
    /// so a follower takes over at once.
    release: CancellationToken,
}

/// The lease task seen from the loop: not started until the tasks are loaded, then its
/// events, then stopped (released) after the loop.
pub(crate) struct Campaign {
    lease: Option<Lease>,
    task: Option<JoinHandle<()>>,
    events: mpsc::Receiver<LeaseEvent>,
    /// The lease task still reports (it ends only on release, or if it panicked).
    open: bool,
    release: CancellationToken,
}

impl Campaign {
    /// A campaign for `key` of the leader bucket `store`, not started yet.
    pub(crate) fn new(
        store: kv::Store,
        key: String,
        instance: String,
        timing: Timing,
        clock: SharedClock,
    ) -> Campaign {
        let (tx, events) = mpsc::channel(64);
        let release = CancellationToken::new();
        let lease = Lease { store, key, instance, timing, clock, events: tx, release: release.clone() };
        Campaign { lease: Some(lease), task: None, events, open: true, release }
    }

    /// A campaign that never runs (unit tests of the parts around it).
    #[cfg(test)]
    pub(crate) fn detached() -> Campaign {
        let (_, events) = mpsc::channel(1);
        Campaign { lease: None, task: None, events, open: false, release: CancellationToken::new() }
    }

    /// Starts the lease task; true the first time.
    pub(crate) fn start(&mut self) -> bool {
        match self.lease.take() {
            Some(lease) => {
                self.task = Some(tokio::spawn(lease.run()));
                true
            }
            None => false,
        }
    }

    /// The next lease event; `None` once the lease task has ended (then pending forever).
    pub(crate) async fn next(&mut self) -> Option<LeaseEvent> {
        if !self.open {
            return std::future::pending().await;
        }
        let event = self.events.recv().await;
        self.open = event.is_some();
        event
    }

    /// Releases the lease (a leader deletes its key) and waits, at most `grace`, for the task.
    pub(crate) async fn stop(&mut self, grace: Duration) {
        self.release.cancel();
        if let Some(task) = self.task.take() {
            // The lease task sends a final `Lost` after deleting its key; keep receiving so
            // it never blocks on a full channel.
            let events = &mut self.events;
            let drain = async { while events.recv().await.is_some() {} };
            let _ = tokio::time::timeout(grace, async { tokio::join!(task, drain) }).await;
        }
        self.open = false;
    }
}

impl Lease {
    async fn run(self) {
        let mut role = Role::Follower { campaign_at: Instant::now() };
        let mut watch = None;
        let mut rewatch_at = Instant::now();
        loop {
            let wake = match role {
                Role::Follower { campaign_at } => campaign_at,
                Role::Leader { renew_at, .. } => renew_at,
            };
            if watch.is_none() && Instant::now() >= rewatch_at {
                match self.store.watch(&self.key).await {
                    Ok(w) => watch = Some(w),
                    Err(error) => {
                        tracing::warn!(%error, "cannot watch the leader key; retrying");
                        rewatch_at = Instant::now() + self.timing.renew_every();
                    }
                }
            }
            let next_entry = async {
                match watch.as_mut() {
                    Some(w) => w.next().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = self.release.cancelled() => {
                    if let Role::Leader { revision, term, .. } = role {
                        let delete = self.store.delete_expect_revision(&self.key, Some(revision));
                        match tokio::time::timeout(self.timing.request_timeout(), delete).await {
                            Ok(Ok(())) => tracing::info!(term, "lease released"),
                            Ok(Err(error)) => tracing::warn!(%error, "lease not released (it will expire)"),
                            Err(_) => tracing::warn!("lease release timed out (it will expire)"),
                        }
                        let _ = self.events.send(LeaseEvent::Lost { reason: "released".into() }).await;
                    }
                    return;
                }
                _ = sleep_until(wake) => {
                    role = match role {
                        Role::Follower { .. } => self.campaign().await,
                        Role::Leader { revision, term, acquired_at, .. } => {
                            self.renew(revision, term, acquired_at).await
                        }
                    };
                }
                entry = next_entry => match entry {
                    Some(Ok(entry)) => {
                        if let Role::Follower { campaign_at } = &mut role {
                            match entry.operation {
                                Operation::Delete | Operation::Purge => *campaign_at = Instant::now(),
                                Operation::Put => *campaign_at = self.timing.campaign_at(Instant::now()),
                            }
                        }
                    }
                    Some(Err(error)) => tracing::debug!(%error, "leader key watch error"),
                    None => {
                        tracing::debug!("leader key watch ended; re-opening");
                        watch = None;
                        rewatch_at = Instant::now() + self.timing.renew_every();
                    }
                },
            }
        }
    }

    fn record(&self, term: u64, acquired_at: DateTime<Utc>) -> anyhow::Result<Bytes> {
        let record = LeaderRecord {
            instance: self.instance.clone(),
            term,
            acquired_at,
            lease_ms: u64::try_from(self.timing.lease.as_millis()).unwrap_or(u64::MAX),
        };
        Ok(serde_json::to_vec(&record).context("encode leader record")?.into())
    }

    async fn campaign(&self) -> Role {
        let sent = Instant::now();
        let acquired_at = crate::tasks::from_ms(self.clock.now_ms());
        let record = match self.record(0, acquired_at) {
            Ok(record) => record,
            Err(error) => {
                tracing::error!(error = format!("{error:#}"), "cannot campaign");
                return Role::Follower { campaign_at: sent + self.timing.lease };
            }
        };
        match tokio::time::timeout(self.timing.request_timeout(), self.store.create(&self.key, record)).await
        {
            Ok(Ok(revision)) => {
                tracing::info!(term = revision, instance = %self.instance, "leadership acquired");
                let valid_until = self.timing.valid_until(sent);
                if self.events.send(LeaseEvent::Acquired { term: revision, valid_until }).await.is_err() {
                    return Role::Follower { campaign_at: sent + self.timing.lease };
                }
                // Renewed at once: the renewal stores the term in the record.
                Role::Leader { revision, term: revision, acquired_at, renew_at: Instant::now() }
            }
            Ok(Err(error)) if is_already_exists(&error) => {
                Role::Follower { campaign_at: self.timing.campaign_at(sent) }
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "campaign failed");
                Role::Follower { campaign_at: sent + self.timing.renew_every() }
            }
            Err(_) => {
                tracing::warn!("campaign timed out");
                Role::Follower { campaign_at: sent + self.timing.renew_every() }
            }
        }
    }

    async fn renew(&self, revision: u64, term: u64, acquired_at: DateTime<Utc>) -> Role {
        let sent = Instant::now();
        let outcome = match self.record(term, acquired_at) {
            Ok(record) => {
                match tokio::time::timeout(
                    self.timing.request_timeout(),
                    self.store.update(&self.key, record, revision),
                )
                .await
                {
                    Ok(Ok(next)) => Ok(next),
                    Ok(Err(error)) => Err(format!("renewal failed: {error}")),
                    Err(_) => Err("renewal timed out".to_string()),
                }
            }
            Err(error) => Err(format!("{error:#}")),
        };
        match outcome {
            Ok(next) => {
                let valid_until = self.timing.valid_until(sent);
                if self.events.send(LeaseEvent::Renewed { valid_until }).await.is_err() {
                    return Role::Follower { campaign_at: sent + self.timing.lease };
                }
                Role::Leader { revision: next, term, acquired_at, renew_at: sent + self.timing.renew_every() }
            }
            Err(reason) => {
                tracing::warn!(%reason, "stepping down");
                let _ = self.events.send(LeaseEvent::Lost { reason }).await;
                Role::Follower { campaign_at: self.timing.campaign_at(sent) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_local_deadline_ends_before_the_server_can_expire_the_key() {
        let timing = Timing { lease: Duration::from_secs(3), margin: Duration::from_millis(500) };
        let sent = Instant::now();
        assert_eq!(timing.renew_every(), Duration::from_secs(1));
        assert_eq!(timing.valid_until(sent), sent + Duration::from_millis(2500));
        assert!(timing.valid_until(sent) < sent + timing.lease);
        // A follower waits for the whole lease (plus slack) after the last renewal it saw.
        assert!(timing.campaign_at(sent) > sent + timing.lease);
    }

    #[test]
    fn a_margin_larger_than_the_lease_still_leaves_one_renewal_period() {
        let timing = Timing { lease: Duration::from_secs(3), margin: Duration::from_secs(10) };
        let sent = Instant::now();
        assert_eq!(timing.valid_until(sent), sent + Duration::from_secs(1));
    }
}
