//! Listing tasks through the registry while they are being written: a listing of the tasks
//! bucket names a key again when the key is written during it, and the list shows each task once.

use async_nats::jetstream;
use jetsched_shared::names::Names;
use serde_json::json;

use super::{Served, nightly, served};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_names_every_task_once_while_tasks_are_being_rewritten() {
    let Served { server: _server, registry, client, api, .. } = served(|_| {}).await;
    for i in 0..20 {
        api.put(&nightly("busy", &format!("t{i:02}"))).await;
    }
    // Every task rewritten again and again, straight into the bucket (as fast as it takes them),
    // while the registry lists them: a listing sees a key's old message and then its new one.
    let stop = tokio_util::sync::CancellationToken::new();
    let writer = {
        let js = jetstream::new(client.clone());
        let stop = stop.clone();
        tokio::spawn(async move {
            let tasks = js.get_key_value(Names::default().tasks_bucket()).await.expect("tasks bucket");
            let mut writes = 0u64;
            while !stop.is_cancelled() {
                for i in 0..20 {
                    let body = serde_json::to_vec(&nightly("busy", &format!("t{i:02}"))).unwrap();
                    tasks.put(format!("busy.t{i:02}"), body.into()).await.expect("rewrite");
                    writes += 1;
                }
            }
            writes
        })
    };
    let expected: Vec<String> = (0..20).map(|i| format!("t{i:02}")).collect();
    for _ in 0..150 {
        let reply = api.task("list", json!({"namespace": "busy", "limit": 1000})).await;
        let ids: Vec<String> = reply["tasks"]
            .as_array()
            .unwrap_or_else(|| panic!("a list: {reply}"))
            .iter()
            .map(|t| t["task"]["id"].as_str().expect("id").to_string())
            .collect();
        assert_eq!(ids, expected, "each task once, in key order");
    }
    stop.cancel();
    let writes = writer.await.expect("writer");
    assert!(writes >= 150, "the tasks were rewritten while listed: {writes} writes");
    registry.stop().await;
}
