//! The console's task page with many tasks: the real binary against a tasks bucket filled by
//! direct KV puts of valid specs; the first page and filtered searches must render within
//! 200 ms and the process stay under 100 MiB. 5,000 tasks by default (CI), as many as
//! `JETSCHED_CONSOLE_TASKS` says otherwise (the figures of docs/console.md: 100,000).

use std::time::{Duration, Instant};

use futures::StreamExt;
use jetsched_shared::names::task_key;
use jetsched_shared::topology::TopologyArgs;
use jetsched_tests::{
    ChildProcess, WithTopology, admin_get, eventually, free_addr, memory_kib, server_with_topology, spec,
};
use serde_json::json;

use super::browser::http_request;

const BUDGET: Duration = Duration::from_millis(200);
const RSS_LIMIT_KIB: u64 = 100 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_task_pages_stay_fast_and_small_with_many_tasks() {
    let tasks: usize =
        std::env::var("JETSCHED_CONSOLE_TASKS").ok().and_then(|n| n.parse().ok()).unwrap_or(5_000);
    let WithTopology { server, topology, .. } = server_with_topology(TopologyArgs::default()).await;

    // Valid specs as the registry stores them, put directly (pipelined, 256 in flight).
    let started = Instant::now();
    let store = topology.tasks;
    let mut puts = futures::stream::iter(0..tasks)
        .map(|n| {
            let store = store.clone();
            let spec = spec("bench", &format!("task-{n:06}"))
                .every(if n % 2 == 0 { "1h" } else { "10m" })
                .field(
                    "labels",
                    json!({"team": format!("t{}", n % 10), "tier": if n % 3 == 0 { "gold" } else { "std" }}),
                )
                .field("paused", n % 7 == 0)
                .task();
            async move {
                let value = serde_json::to_vec(&spec.to_json()).unwrap();
                store.put(task_key(&spec.namespace, &spec.id), value.into()).await
            }
        })
        .buffer_unordered(256);
    while let Some(put) = puts.next().await {
        put.expect("put a spec");
    }
    let loaded = started.elapsed();

    let (http, admin) = (free_addr(), free_addr());
    let console = ChildProcess::spawn(
        "jetsched-console",
        ["--nats-url", &server.url(), "--http-addr", &http.to_string(), "--admin-addr", &admin.to_string()],
    );
    let started = Instant::now();
    eventually(Duration::from_secs(60), "the console has indexed every task", || async {
        admin_get(admin, "/readyz").await.is_ok_and(|reply| reply.is_ok())
    })
    .await;
    let indexed = started.elapsed();

    let pages = [
        ("first page", "/tasks".to_string()),
        ("search by id", "/tasks?q=task-00012".to_string()),
        ("labels, state and id", "/tasks?q=9&label=team%3Dt3%2Ctier%3Dgold&state=active".to_string()),
        ("last page", format!("/tasks?page={}", tasks / 50)),
    ];
    let mut report = Vec::new();
    for (what, path) in &pages {
        let mut times = Vec::new();
        for _ in 0..5 {
            let start = Instant::now();
            let reply = http_request(http, "GET", path, &[], "").await;
            times.push(start.elapsed());
            assert_eq!(reply.status, 200, "{path}: {}", reply.body);
            assert!(reply.body.contains("task-"), "{path} lists tasks");
        }
        times.sort();
        let median = times[times.len() / 2];
        report.push(format!("{what} ({path}): median {median:?}, max {:?}", times[times.len() - 1]));
        assert!(median < BUDGET, "{what} took {median:?} (median of 5), over {BUDGET:?}");
    }
    let first = http_request(http, "GET", "/tasks", &[], "").await;
    assert!(first.body.contains(&format!("{tasks} of {tasks} tasks")), "every task is indexed");
    let (rss, peak) = memory_kib(console.pid());
    println!(
        "console with {tasks} tasks: KV puts {loaded:?}, indexed in {indexed:?}, RSS {} MiB (peak {} MiB)\n  {}",
        rss / 1024,
        peak / 1024,
        report.join("\n  ")
    );
    assert!(rss < RSS_LIMIT_KIB, "console RSS {rss} KiB");
}
