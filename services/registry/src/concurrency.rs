//! The limits API, `jetsched.api.limits.{list,set,clear}`: every concurrency key with its
//! limit, slots in use and runs waiting, every rate-limit key with its limit and whether it
//! throttles, and operators' overrides of a concurrency key's limit. The state lives in
//! `JETSCHED_LIMITS` (one key per concurrency key) and `JETSCHED_RATES` (one per rate-limit
//! key, read only here), written by the workers; an
//! override is one more field of the entry, set with compare-and-set. Workers follow the
//! bucket: a raised limit hands free slots to waiting runs at once, a lowered one lets the
//! runs holding slots finish and starts no new one above it.
//!
//! Requests (JSON):
//! - `list`: `{}` → `{"limits": [<key>...], "rates": [<key>...]}` by key (`<namespace>.<key>`).
//! - `set`: `{"key": "<namespace>.<key>", "limit": 3}` → the key as `list` shows it.
//! - `clear`: `{"key": "<namespace>.<key>"}` → the same, the spec's limit in force again.
//!
//! A key may be shared by tasks of one namespace; these endpoints exist only un-namespaced,
//! for operators, like the queue endpoints.

use async_nats::jetstream::{self, kv};
use chrono::Utc;
use jetsched_shared::cas::{is_already_exists, is_revision_mismatch};
use jetsched_shared::error::{ApiError, ApiErrors, ErrorCode};
use jetsched_shared::names::{concurrency_key, limit_name};
use jetsched_shared::spec::limit_key::valid_key;
use jetsched_shared::spec::validate_id;
use jetsched_shared::wire::{LimitInfo, LimitListReply, LimitRecord, LimitRequest, RateInfo, RateRecord};

use crate::breakers::latest;
use crate::codec::{Detail, Empty, decode, encode};
use crate::failure::Failure;

/// The limits endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitEndpoint {
    List,
    Set,
    Clear,
}

/// How many times a set or clear retries a lost compare-and-set race (workers write the entry
/// for every run of the key).
const CAS_ATTEMPTS: usize = 32;

/// The largest override.
const MAX_OVERRIDE: u32 = 10_000;

/// Reads the limits bucket and writes overrides.
#[derive(Clone)]
pub struct ConcurrencyApi {
    js: jetstream::Context,
    limits: kv::Store,
    rates: kv::Store,
}

impl ConcurrencyApi {
    pub fn new(js: jetstream::Context, limits: kv::Store, rates: kv::Store) -> ConcurrencyApi {
        ConcurrencyApi { js, limits, rates }
    }

    /// Handles one request; returns the reply body.
    pub(crate) async fn handle(&self, endpoint: LimitEndpoint, payload: &[u8]) -> Result<Vec<u8>, Failure> {
        match endpoint {
            LimitEndpoint::List => {
                let _: NoFields = decode(payload, Empty::Object, Detail::UnknownField)?;
                encode(&self.list().await?)
            }
            LimitEndpoint::Set => encode(&self.set(checked(payload, true)?).await?),
            LimitEndpoint::Clear => encode(&self.set(checked(payload, false)?).await?),
        }
    }

    /// Every concurrency key and every rate-limit key, by name.
    pub async fn list(&self) -> Result<LimitListReply, Failure> {
        let now = Utc::now();
        let limits = latest(&self.js, &self.limits)
            .await?
            .into_iter()
            .filter_map(|(key, (_, value))| {
                let name = limit_name(&key)?;
                let record = serde_json::from_slice::<LimitRecord>(&value).ok()?;
                Some(LimitInfo::of(name, &record, now))
            })
            .collect();
        let rates = latest(&self.js, &self.rates)
            .await?
            .into_iter()
            .filter_map(|(key, (_, value))| {
                let record = serde_json::from_slice::<RateRecord>(&value).ok()?;
                Some(RateInfo::of(&key, &record, now))
            })
            .collect();
        Ok(LimitListReply { limits, rates })
    }

    /// Sets (`limit`) or clears the override of a key with compare-and-set.
    async fn set(&self, request: LimitRequest) -> Result<LimitInfo, Failure> {
        let (namespace, key) = request.key.split_once('.').expect("checked");
        let bucket_key = concurrency_key(namespace, key);
        for _ in 0..CAS_ATTEMPTS {
            let entry = self
                .limits
                .entry(&bucket_key)
                .await
                .map_err(|e| Failure::unavailable("read limits bucket", e))?;
            let current = entry.as_ref().filter(|e| e.operation == kv::Operation::Put);
            let mut record = current
                .and_then(|e| serde_json::from_slice::<LimitRecord>(&e.value).ok())
                .unwrap_or_default();
            record.override_limit = request.limit;
            let body = serde_json::to_vec(&record).expect("a limit record serializes");
            let written = match &entry {
                Some(entry) => {
                    self.limits.update(&bucket_key, body.into(), entry.revision).await.map_err(|e| {
                        if is_revision_mismatch(&e) {
                            None
                        } else {
                            Some(Failure::unavailable("write limits bucket", e))
                        }
                    })
                }
                None => self.limits.create(&bucket_key, body.into()).await.map_err(|e| {
                    if is_already_exists(&e) {
                        None
                    } else {
                        Some(Failure::unavailable("write limits bucket", e))
                    }
                }),
            };
            match written {
                Ok(_) => {
                    tracing::info!(key = %request.key, limit = ?request.limit, "concurrency limit override set");
                    return Ok(LimitInfo::of(&request.key, &record, Utc::now()));
                }
                Err(None) => continue,
                Err(Some(failure)) => return Err(failure),
            }
        }
        Err(ApiError::new(
            ErrorCode::Unavailable,
            format!("limit {} is being changed concurrently; retry", request.key),
        )
        .into())
    }
}

/// `list` takes no fields.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NoFields {}

/// A set or clear request, every problem named.
fn checked(payload: &[u8], set: bool) -> Result<LimitRequest, Failure> {
    let request: LimitRequest = decode(payload, Empty::Refused, Detail::Fields)?;
    let mut problems = Vec::new();
    match request.key.split_once('.') {
        Some((namespace, key)) => {
            problems.extend(validate_id("key", namespace).err());
            if !valid_key(key) {
                let message = format!("{key:?} must match [A-Za-z0-9_-]{{1,128}}");
                problems.push(ApiError::at(ErrorCode::InvalidValue, "key", message));
            }
        }
        None => problems.push(ApiError::at(ErrorCode::InvalidValue, "key", "give <namespace>.<key>")),
    }
    match (set, request.limit) {
        (true, None) => {
            problems.push(ApiError::at(ErrorCode::MissingField, "limit", "give the limit to set"))
        }
        (true, Some(n)) if n == 0 || n > MAX_OVERRIDE => {
            problems.push(ApiError::at(
                ErrorCode::InvalidValue,
                "limit",
                format!("must be 1 to {MAX_OVERRIDE}"),
            ));
        }
        (false, Some(_)) => {
            problems.push(ApiError::at(ErrorCode::InvalidValue, "limit", "a clear takes no limit"))
        }
        _ => {}
    }
    match ApiErrors::from_vec(problems) {
        Some(errors) => Err(errors.into()),
        None => Ok(request),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(body: &str, set: bool) -> Vec<Option<String>> {
        match checked(body.as_bytes(), set) {
            Ok(_) => Vec::new(),
            Err(failure) => failure.wire().as_slice().iter().map(|e| e.field.clone()).collect(),
        }
    }

    #[test]
    fn a_request_names_every_problem() {
        assert!(fields(r#"{"key": "shop.payments-api", "limit": 3}"#, true).is_empty());
        assert!(fields(r#"{"key": "shop.payments-api"}"#, false).is_empty());
        let both = fields(r#"{"key": "nokey", "limit": 0}"#, true);
        assert_eq!(both, [Some("key".to_string()), Some("limit".to_string())]);
        assert_eq!(fields(r#"{"key": "shop.a b"}"#, true).len(), 2);
        assert_eq!(fields(r#"{"key": "shop.k", "limit": 2}"#, false), [Some("limit".to_string())]);
    }
}
