//! A concurrency key's state in the limits bucket (`concurrency.<namespace>.<key>`): the runs
//! holding its slots, each with a lease, the blocks of slots workers took ahead for their next
//! runs, the runs waiting for one in arrival order, and an operator's override of the limit.
//! Every change is a compare-and-set on the entry.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::millis;
use crate::priority::Priority;

/// The value of one key in the limits bucket.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitRecord {
    /// The limit the task specs declare (the one of the last run that came).
    pub limit: u32,
    /// An operator's limit, in force instead of `limit` until cleared.
    #[serde(rename = "override", default, skip_serializing_if = "Option::is_none")]
    pub override_limit: Option<u32>,
    /// The runs holding a slot, by execution id.
    #[serde(default)]
    pub holders: BTreeMap<String, Holder>,
    /// Slots workers took ahead while no run waited, by worker: their next runs of the key
    /// take them without a write. Every slot of a block counts against the limit.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub blocks: BTreeMap<String, SlotBlock>,
    /// The runs waiting for a slot, in arrival order.
    #[serde(default)]
    pub waiters: Vec<Waiter>,
    /// Set when the key reached its limit with runs waiting (told once by `limit.saturated`),
    /// cleared when no run waits any more.
    #[serde(default)]
    pub saturated: bool,
}

/// A run holding a slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// The worker holding it (or that handed it over).
    pub worker: String,
    /// The slot is free again after this, unless renewed.
    #[serde(with = "millis")]
    pub lease_until: DateTime<Utc>,
    /// The dispatch message holding the slot (stream sequence); absent while the slot is
    /// handed over to a waiting run not delivered yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// The delivery count of that message when it took the slot.
    #[serde(default)]
    pub delivered: u64,
    pub namespace: String,
    pub task_id: String,
}

/// Slots one worker holds ahead under one lease, while no run waits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotBlock {
    /// Slots held: every one counts against the limit, used or not.
    pub slots: u32,
    /// Of them, used by the worker's runs when it last wrote the block (for operators only).
    #[serde(default)]
    pub used: u32,
    /// The block is free again after this, unless renewed.
    #[serde(with = "millis")]
    pub lease_until: DateTime<Utc>,
}

/// A run waiting for a slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waiter {
    pub execution_id: String,
    pub priority: Priority,
    /// When it first waited.
    #[serde(with = "millis")]
    pub since: DateTime<Utc>,
    /// Where it is parked in the dispatch stream (its held-run subject).
    pub subject: String,
    pub namespace: String,
    pub task_id: String,
}

impl LimitRecord {
    /// The limit in force: the override, else the declared one.
    pub fn effective_limit(&self) -> u32 {
        self.override_limit.unwrap_or(self.limit)
    }

    /// Slots counted against the limit at `now`: held by runs and held in blocks, leases
    /// still running.
    pub fn taken(&self, now: DateTime<Utc>) -> usize {
        let blocks: usize =
            self.blocks.values().filter(|b| b.lease_until >= now).map(|b| b.slots as usize).sum();
        self.held(now) + blocks
    }

    /// Slots held by runs of their own, leases still running at `now`.
    pub fn held(&self, now: DateTime<Utc>) -> usize {
        self.holders.values().filter(|h| h.lease_until >= now).count()
    }

    /// Slots in use at `now`: held by runs, and of the blocks those their workers' runs used
    /// when each last wrote its block.
    pub fn in_use(&self, now: DateTime<Utc>) -> usize {
        let used: usize =
            self.blocks.values().filter(|b| b.lease_until >= now).map(|b| b.used.min(b.slots) as usize).sum();
        self.held(now) + used
    }

    /// Slots of blocks no run used when their workers last wrote them: taken ahead, free for
    /// those workers' next runs.
    pub fn reserved_ahead(&self, now: DateTime<Utc>) -> usize {
        self.taken(now) - self.in_use(now)
    }

    /// Runs waiting, per priority (most urgent first).
    pub fn waiting_by_priority(&self) -> [usize; 4] {
        let mut counts = [0; 4];
        for waiter in &self.waiters {
            counts[waiter.priority.index()] += 1;
        }
        counts
    }

    /// When the longest-waiting run first waited.
    pub fn oldest_wait(&self) -> Option<DateTime<Utc>> {
        self.waiters.iter().map(|w| w.since).min()
    }
}

/// One key as the limits API lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitInfo {
    /// `<namespace>.<key>`.
    pub key: String,
    /// The limit in force.
    pub limit: u32,
    /// The limit the specs declare.
    pub declared: u32,
    #[serde(rename = "override", default, skip_serializing_if = "Option::is_none")]
    pub override_limit: Option<u32>,
    /// Slots in use: held by runs, and those of workers' blocks their runs used.
    pub in_use: u64,
    /// Slots workers took ahead for their next runs and did not use (counted against the limit).
    #[serde(default)]
    pub reserved_ahead: u64,
    pub waiting: u64,
    /// Waiting runs per priority: `critical`, `high`, `normal`, `low`.
    pub waiting_by_priority: BTreeMap<String, u64>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "millis::option")]
    pub oldest_wait: Option<DateTime<Utc>>,
}

impl LimitInfo {
    /// What `record` (stored under `key`, without the `concurrency.` prefix) shows at `now`.
    pub fn of(key: &str, record: &LimitRecord, now: DateTime<Utc>) -> LimitInfo {
        let by = record.waiting_by_priority();
        LimitInfo {
            key: key.to_string(),
            limit: record.effective_limit(),
            declared: record.limit,
            override_limit: record.override_limit,
            in_use: record.in_use(now) as u64,
            reserved_ahead: record.reserved_ahead(now) as u64,
            waiting: record.waiters.len() as u64,
            waiting_by_priority: Priority::ALL
                .into_iter()
                .filter(|p| by[p.index()] > 0)
                .map(|p| (p.as_str().to_string(), by[p.index()] as u64))
                .collect(),
            oldest_wait: record.oldest_wait(),
        }
    }
}

/// `limits.list` reply: every key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitListReply {
    /// Concurrency keys.
    pub limits: Vec<LimitInfo>,
    /// Rate-limit keys.
    #[serde(default)]
    pub rates: Vec<super::RateInfo>,
}

/// `limits.set` (with `limit`) and `limits.clear` (without): `{"key": "<namespace>.<key>",
/// "limit": 3}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitRequest {
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}
