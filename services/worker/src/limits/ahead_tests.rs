//! Two workers' limits on one key of a real server, neither following the bucket: each knows
//! the key only through its own writes and its reads, as a worker whose watch is behind.

use std::sync::Arc;
use std::time::{Duration, Instant};

use jetsched_shared::priority::Priority;
use jetsched_tests::{WithTopology, server_with_topology};
use prometheus::Registry;

use super::super::Limits;
use super::super::rules::{Claim, Decision};
use crate::metrics::Metrics;

const KEY: &str = "concurrency.ns.shared";

async fn limits(with: &WithTopology, worker: &str) -> Arc<Limits> {
    let dispatch = with.js.get_stream(with.names.dispatch_stream()).await.expect("dispatch stream");
    let metrics = Metrics::register(&Registry::new()).expect("metrics");
    Arc::new(Limits::new(
        with.topology.limits.clone(),
        dispatch,
        with.js.clone(),
        worker.to_string(),
        Duration::from_secs(30),
        8,
        metrics,
    ))
}

fn claim<'a>(id: &'a str, seq: u64, worker: &'a str, priority: Priority) -> Claim<'a> {
    Claim {
        execution_id: id,
        seq,
        delivered: 1,
        worker,
        priority,
        namespace: "ns",
        task_id: id,
        parked_subject: "parked",
        limit: 3,
    }
}

/// Limit 3. Worker b's runs take a block of two slots and use one; worker a's critical run takes
/// the last free slot, and its second critical run waits. A low run arriving at b then, b's
/// copy of the key still showing no run waiting, does not take b's free block slot: it asks
/// with a write and waits behind the critical run.
#[tokio::test]
async fn a_run_waiting_on_another_worker_is_not_passed_by_a_block_whose_worker_has_not_seen_it() {
    let with = server_with_topology(Default::default()).await;
    let (a, b) = (limits(&with, "a").await, limits(&with, "b").await);

    // Two low runs arrive at b: the first's write takes a block of two slots.
    assert!(!b.take_from_block(KEY, "low-1", true, Instant::now()).await, "no block yet");
    assert!(!b.take_from_block(KEY, "low-2", true, Instant::now()).await, "no block yet");
    let decision = b.acquire(KEY, &claim("low-1", 1, "b", Priority::Low), true).await.expect("claim");
    assert!(matches!(decision, Decision::Block { granted } if granted >= 1), "{decision:?}");
    let free_in_block = b.block(KEY, |block| block.cap - block.used).expect("b's block");
    assert_eq!(free_in_block, 1, "b's block has a free slot");

    // a's critical runs: one takes the key's last free slot, the next waits.
    let first = a.acquire(KEY, &claim("critical-1", 3, "a", Priority::Critical), true).await.expect("claim");
    assert!(matches!(first, Decision::Hold | Decision::Block { .. }), "{first:?}");
    let second =
        a.acquire(KEY, &claim("critical-2", 4, "a", Priority::Critical), false).await.expect("claim");
    assert!(matches!(second, Decision::Wait { .. }), "{second:?}");

    // b has not seen the waiter by a watch; its low run still does not pass it.
    assert!(
        !b.take_from_block(KEY, "low-3", true, Instant::now()).await,
        "the low run took b's block slot past a waiting critical run"
    );
    let third = b.acquire(KEY, &claim("low-3", 5, "b", Priority::Low), true).await.expect("claim");
    assert!(matches!(third, Decision::Wait { .. }), "{third:?}");
    let record = b.read(KEY).await.expect("read").record;
    let waiting: Vec<&str> = record.waiters.iter().map(|w| w.execution_id.as_str()).collect();
    assert_eq!(waiting, ["critical-2", "low-3"], "{record:?}");
}
