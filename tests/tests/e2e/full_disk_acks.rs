//! What a full disk does to writes a 3-node cluster has acknowledged: a publisher stores
//! numbered messages on an R3 stream (each awaited) while every node's store fills up; the
//! disks are freed, the nodes restarted, and every acknowledged message must be there. Run
//! with the nemesis nodes' settings (the server's default `sync_interval`) and with
//! `sync_interval: always` (the shipped deployments'). Needs root (network namespaces,
//! tmpfs); a long fault: runs with `JETSCHED_CHAOS=nemesis`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use jetsched_tests::{CLUSTER_SIZE, NetLab, NsCluster, eventually, read_stream};

/// Store size of each node, as in the nemesis full-disk test.
const DISK_MB: u64 = 128;
const STREAM: &str = "FULL_DISK_ACKS";

/// Publishes numbered messages until `stop`, each awaited, counting the acknowledged ones in
/// `count`; returns the numbers acknowledged.
async fn publish_until(
    js: jetstream::Context,
    stop: Arc<AtomicBool>,
    count: Arc<AtomicUsize>,
) -> BTreeSet<u64> {
    let mut acked = BTreeSet::new();
    let mut n = 0u64;
    let body = vec![b'x'; 512];
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let sent = tokio::time::timeout(Duration::from_secs(2), async {
            js.publish(format!("acks.{n}"), body.clone().into()).await?.await
        })
        .await;
        if let Ok(Ok(_)) = sent {
            acked.insert(n);
            count.fetch_add(1, Ordering::Relaxed);
        } else {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    acked
}

/// One run: returns (acknowledged, acknowledged and missing after the restart).
async fn acknowledged_and_lost(limits: &str) -> (usize, Vec<u64>) {
    let mut cluster = NsCluster::start(Some(DISK_MB), limits).await.unwrap_or_else(|e| panic!("{e:#}"));
    let js = jetstream::new(cluster.client().await);
    js.create_stream(stream::Config {
        name: STREAM.into(),
        subjects: vec!["acks.>".into()],
        num_replicas: 3,
        max_bytes: 64 << 20,
        ..Default::default()
    })
    .await
    .expect("create the stream");
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicUsize::new(0));
    let publisher = tokio::spawn(publish_until(js.clone(), stop.clone(), count.clone()));
    eventually(Duration::from_secs(20), "writes acknowledged before the disks fill", || async {
        count.load(Ordering::Relaxed) >= 200
    })
    .await;
    for i in 0..CLUSTER_SIZE {
        cluster.disk(i).expect("small disk").fill().expect("fill the disk");
    }
    // The publisher goes on against full disks for a while: the passing of time is the point
    // (the server notices at its next write and refuses from then on).
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(true, Ordering::Relaxed);
    let acked = publisher.await.expect("publisher");
    for i in 0..CLUSTER_SIZE {
        cluster.disk(i).expect("small disk").free().expect("free the disk");
    }
    cluster.restart_all().await.unwrap_or_else(|e| panic!("{e:#}"));
    let js = jetstream::new(cluster.client().await);
    let stored: BTreeSet<u64> = read_stream(&js, STREAM, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e:#}"))
        .iter()
        .filter_map(|m| m.subject.strip_prefix("acks.").and_then(|n| n.parse().ok()))
        .collect();
    let lost: Vec<u64> = acked.difference(&stored).copied().collect();
    (acked.len(), lost)
}

#[tokio::test]
async fn writes_acknowledged_before_a_full_disk_survive_the_restart() {
    if NetLab::skip("full disk acks") {
        return;
    }
    if std::env::var("JETSCHED_CHAOS").as_deref() != Ok("nemesis") {
        eprintln!("SKIPPED full disk acks: a long fault, run with JETSCHED_CHAOS=nemesis");
        return;
    }
    for limits in ["max_file_store: 100MB", "max_file_store: 100MB\n  sync_interval: always"] {
        let (acked, lost) = acknowledged_and_lost(limits).await;
        eprintln!("full disk, {limits:?}: {acked} acknowledged, {} missing after the restart", lost.len());
        assert!(acked > 0, "nothing was acknowledged before the disks filled ({limits:?})");
        assert!(lost.is_empty(), "acknowledged writes missing after the restart ({limits:?}): {lost:?}");
    }
}
