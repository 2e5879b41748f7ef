//! The leader lease in the leader bucket: acquire with `create`, renew with `update(revision)`
//! every lease/3, step down on any error; followers watch the key and campaign on Delete/Purge
//! (expiry arrives as Purge) and at the expected expiry.
//!
//! Followers also ask the holder's presence subject every 100 ms ([`crate::presence`]): once
//! the server answers "no responders" (the holder's connection is gone) they take over with a
//! compare-and-set on the lease revision they last saw, without waiting for the lease to run
//! out. A leader that sees another replica's record written after its own term on the watch
//! steps down at once. A replica whose clock is skewed ([`crate::skew`]) takes over only at
//! expiry, one lease later than the others.
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
use jetsched_shared::cas::{is_already_exists, is_revision_mismatch};
use jetsched_shared::wire::LeaderRecord;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::presence::{self, Probe, Responder};
use crate::skew::Guard;

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

/// How a replica claims the lease.
#[derive(Debug, Clone, Copy)]
enum Claim {
    /// Nobody holds it: `create`.
    Free,
    /// Its holder is gone: `update` expecting the revision last seen.
    Takeover { revision: u64 },
}

/// The lease task.
struct Lease {
    store: kv::Store,
    client: async_nats::Client,
    names: jetsched_shared::names::Names,
    guard: Guard,
    _responder: Responder,
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
    /// A campaign for `key` of the leader bucket `store`, not started yet; this replica
    /// answers its presence subject from now on.
    #[allow(clippy::too_many_arguments)] // the lease's handles and settings, each used
    pub(crate) async fn new(
        client: async_nats::Client,
        names: jetsched_shared::names::Names,
        store: kv::Store,
        instance: String,
        timing: Timing,
        clock: SharedClock,
        guard: Guard,
    ) -> anyhow::Result<Campaign> {
        let responder = Responder::start(&client, names.scheduler_presence_subject(&instance)).await?;
        let (tx, events) = mpsc::channel(64);
        let release = CancellationToken::new();
        let key = names.leader_key().to_string();
        let lease = Lease {
            store,
            client,
            names,
            guard,
            _responder: responder,
            key,
            instance,
            timing,
            clock,
            events: tx,
            release: release.clone(),
        };
        Ok(Campaign { lease: Some(lease), task: None, events, open: true, release })
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
        // A first clock measurement decides whether this replica may campaign at once.
        self.guard.measured(self.timing.lease).await;
        let mut role = Role::Follower { campaign_at: Instant::now() };
        let mut watch = None;
        let mut rewatch_at = Instant::now();
        let mut probe = Probe::default();
        let mut probe_at = Instant::now();
        // A skewed replica has already waited its extra lease for this campaign.
        let mut delayed = false;
        loop {
            let wake = match role {
                Role::Follower { campaign_at } => campaign_at,
                Role::Leader { renew_at, .. } => renew_at,
            };
            if watch.is_none() && Instant::now() >= rewatch_at {
                // With history: the current holder at once, then every change.
                match self.store.watch_with_history(&self.key).await {
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
            let probing =
                matches!(role, Role::Follower { .. }) && probe.target().is_some() && !self.guard.skewed();
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
                        Role::Follower { .. } if self.guard.skewed() && !delayed => {
                            delayed = true;
                            tracing::warn!("clock skewed: campaigning one lease later");
                            Role::Follower { campaign_at: Instant::now() + self.timing.lease }
                        }
                        Role::Follower { .. } => {
                            delayed = false;
                            self.claim(Claim::Free).await
                        }
                        Role::Leader { revision, term, acquired_at, .. } => {
                            self.renew(revision, term, acquired_at).await
                        }
                    };
                }
                _ = sleep_until(probe_at), if probing => {
                    let holder = probe.target().unwrap_or_default().to_string();
                    let answer = presence::ask(&self.client, self.names.scheduler_presence_subject(&holder)).await;
                    probe_at = Instant::now() + presence::PROBE_EVERY;
                    if let Some(revision) = probe.answered(answer) {
                        tracing::info!(%holder, revision, "the lease holder's connection is gone; taking over");
                        probe.released();
                        role = self.claim(Claim::Takeover { revision }).await;
                    }
                }
                entry = next_entry => match entry {
                    Some(Ok(entry)) => match (&mut role, entry.operation) {
                        (Role::Follower { campaign_at }, Operation::Delete | Operation::Purge) => {
                            probe.released();
                            *campaign_at = Instant::now();
                        }
                        (Role::Follower { campaign_at }, Operation::Put) => {
                            delayed = false;
                            if let Ok(record) = serde_json::from_slice::<LeaderRecord>(&entry.value) {
                                probe.held(&record.instance, entry.revision);
                            }
                            *campaign_at = self.timing.campaign_at(Instant::now());
                        }
                        (Role::Leader { term, .. }, Operation::Put) if entry.revision > *term => {
                            // Another replica wrote the lease after this term began: it took
                            // over (this replica's connection was gone for a while).
                            let foreign = serde_json::from_slice::<LeaderRecord>(&entry.value)
                                .map_or(true, |record| record.instance != self.instance);
                            if foreign {
                                let reason = "another replica took the lease over".to_string();
                                tracing::warn!(revision = entry.revision, "stepping down: {reason}");
                                let _ = self.events.send(LeaseEvent::Lost { reason }).await;
                                role = Role::Follower { campaign_at: self.timing.campaign_at(Instant::now()) };
                            }
                        }
                        (Role::Leader { .. }, _) => {}
                    },
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

    /// Claims the lease: `create` when free, `update` on the revision last seen when its holder
    /// is gone. The record's term 0 means "this entry's revision" until the first renewal.
    async fn claim(&self, claim: Claim) -> Role {
        let sent = Instant::now();
        let acquired_at = crate::tasks::from_ms(self.clock.now_ms());
        let record = match self.record(0, acquired_at) {
            Ok(record) => record,
            Err(error) => {
                tracing::error!(error = format!("{error:#}"), "cannot campaign");
                return Role::Follower { campaign_at: sent + self.timing.lease };
            }
        };
        let request = async {
            match claim {
                Claim::Free => self.store.create(&self.key, record).await.map_err(ClaimError::Create),
                Claim::Takeover { revision } => {
                    self.store.update(&self.key, record, revision).await.map_err(ClaimError::Update)
                }
            }
        };
        match tokio::time::timeout(self.timing.request_timeout(), request).await {
            Ok(Ok(revision)) => {
                tracing::info!(term = revision, instance = %self.instance, "leadership acquired");
                let valid_until = self.timing.valid_until(sent);
                if self.events.send(LeaseEvent::Acquired { term: revision, valid_until }).await.is_err() {
                    return Role::Follower { campaign_at: sent + self.timing.lease };
                }
                // Renewed at once: the renewal stores the term in the record.
                Role::Leader { revision, term: revision, acquired_at, renew_at: Instant::now() }
            }
            Ok(Err(error)) if error.lost() => Role::Follower { campaign_at: self.timing.campaign_at(sent) },
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

/// A claim's failure.
#[derive(Debug)]
enum ClaimError {
    Create(kv::CreateError),
    Update(kv::UpdateError),
}

impl std::fmt::Display for ClaimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClaimError::Create(error) => write!(f, "create: {error}"),
            ClaimError::Update(error) => write!(f, "takeover: {error}"),
        }
    }
}

impl ClaimError {
    /// Another replica claimed first (the key exists, or its revision moved on).
    fn lost(&self) -> bool {
        match self {
            ClaimError::Create(error) => is_already_exists(error),
            ClaimError::Update(error) => is_revision_mismatch(error),
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
