//! De-duplication claims: the first trigger or submission carrying a key stores its claim in
//! the de-duplication bucket with the key's time to live, atomically (a publish expecting the
//! key's last message, so two registries racing store one); a later one finds it.
//!
//! The claim is written by publishing to the bucket's subject with `Nats-Expected-Last-Subject-Sequence`
//! and `Nats-TTL`, not with the client's `create_with_ttl`, which falls back to an update without
//! the time to live when the key holds an expiry marker.

use async_nats::HeaderMap;
use async_nats::header::{NATS_EXPECTED_LAST_SUBJECT_SEQUENCE, NATS_MESSAGE_TTL};
use chrono::{DateTime, Utc};
use jetsched_shared::cas;
use jetsched_shared::names::{DedupeScope, Names, dedupe_key};
use jetsched_shared::wire::{DedupeClaim, Event, EventKind};

use super::{CAS_ATTEMPTS, TaskStore, concurrently};
use crate::failure::Failure;

/// What a claim found.
pub(super) enum Claim {
    /// This claim is stored, at this sequence of the bucket's stream.
    Claimed { sequence: u64 },
    /// An earlier claim holds the key (not expired), stored at `sequence`.
    Held { claim: DedupeClaim, sequence: u64 },
}

impl TaskStore {
    /// Claims the de-duplication `key` of an intake submission (stored at `intake_sequence` of
    /// the intake stream) for `ttl`: `true` when the submission is the key's first (or that
    /// first one delivered again), `false` when an earlier submission holds the key, told by a
    /// `trigger.deduplicated` event.
    pub async fn claim_submission(
        &self,
        namespace: &str,
        id: &str,
        key: &str,
        ttl: std::time::Duration,
        intake_sequence: u64,
    ) -> Result<bool, Failure> {
        let claim = DedupeClaim {
            at: Utc::now(),
            ttl_s: ttl.as_secs(),
            execution_id: None,
            done: true,
            payload: None,
            priority: None,
            intake_sequence: Some(intake_sequence),
        };
        let bucket_key = dedupe_key(namespace, id, DedupeScope::Submit, key);
        match self.claim(&bucket_key, &claim).await? {
            Claim::Claimed { .. } => Ok(true),
            Claim::Held { claim: held, .. } if held.intake_sequence == Some(intake_sequence) => Ok(true),
            Claim::Held { .. } => {
                self.emit(Event {
                    key: Some(key.to_string()),
                    ..Event::new(EventKind::TriggerDeduplicated, namespace, id)
                })
                .await;
                Ok(false)
            }
        }
    }

    /// Stores `claim` under the bucket key `key` unless a live claim holds it.
    pub(super) async fn claim(&self, key: &str, claim: &DedupeClaim) -> Result<Claim, Failure> {
        let body = bytes::Bytes::from(serde_json::to_vec(claim).expect("a claim serializes"));
        // A key never used before is the common case: expect no message first.
        let mut expected = 0;
        for _ in 0..CAS_ATTEMPTS {
            match self.write_claim(key, body.clone(), expected, claim.ttl_s).await {
                Ok(sequence) => return Ok(Claim::Claimed { sequence }),
                Err(ClaimWrite::Lost) => {}
                Err(ClaimWrite::Failed(failure)) => return Err(failure),
            }
            match self.read_claim(key, claim.at).await? {
                Found::Nothing => expected = 0,
                Found::Gone(sequence) => expected = sequence,
                Found::Live(held, sequence) => return Ok(Claim::Held { claim: held, sequence }),
            }
        }
        Err(concurrently(key))
    }

    /// Replaces the claim stored at `sequence` with `claim` (a trigger's, now done), keeping
    /// what is left of its time to live. A claim replaced meanwhile is left as it is.
    pub(super) async fn settle_claim(
        &self,
        key: &str,
        sequence: u64,
        claim: &DedupeClaim,
        now: DateTime<Utc>,
    ) {
        let body = bytes::Bytes::from(serde_json::to_vec(claim).expect("a claim serializes"));
        match self.write_claim(key, body, sequence, claim.ttl_left(now)).await {
            Ok(_) | Err(ClaimWrite::Lost) => {}
            Err(ClaimWrite::Failed(failure)) => {
                tracing::warn!(error = %failure, key, "de-duplication claim not marked done");
            }
        }
    }

    async fn write_claim(
        &self,
        key: &str,
        body: bytes::Bytes,
        expected: u64,
        ttl_s: u64,
    ) -> Result<u64, ClaimWrite> {
        let mut headers = HeaderMap::new();
        headers.insert(NATS_EXPECTED_LAST_SUBJECT_SEQUENCE, expected.to_string());
        headers.insert(NATS_MESSAGE_TTL, ttl_s.to_string());
        let subject = Names::kv_subject(&self.flow.dedupe_bucket, key);
        let published = self.js.publish_with_headers(subject, headers, body).await;
        let acked = match published {
            Ok(ack) => ack.await,
            Err(error) => Err(error),
        };
        match acked {
            Ok(ack) => Ok(ack.sequence),
            Err(error) if cas::is_wrong_last_sequence(&error) => Err(ClaimWrite::Lost),
            Err(error) => Err(ClaimWrite::Failed(Failure::unavailable("write de-duplication claim", error))),
        }
    }

    async fn read_claim(&self, key: &str, now: DateTime<Utc>) -> Result<Found, Failure> {
        let latest = cas::read_leader(&self.flow.dedupe_stream, &self.flow.dedupe_bucket, key)
            .await
            .map_err(|e| Failure::unavailable("read de-duplication claim", e))?;
        let Some(message) = latest else { return Ok(Found::Nothing) };
        if message.is_kv_marker() {
            return Ok(Found::Gone(message.sequence));
        }
        // A claim that cannot be read, or outlived its time to live (the server removes it
        // soon), holds nothing.
        match serde_json::from_slice::<DedupeClaim>(&message.payload) {
            Ok(claim) if !claim.expired(now) => Ok(Found::Live(claim, message.sequence)),
            _ => Ok(Found::Gone(message.sequence)),
        }
    }
}

enum ClaimWrite {
    /// The key's last message is not the one expected.
    Lost,
    Failed(Failure),
}

enum Found {
    Nothing,
    /// A marker, an expired or unreadable claim, at this sequence.
    Gone(u64),
    Live(DedupeClaim, u64),
}
