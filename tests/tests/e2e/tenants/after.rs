//! Dependencies stay inside a team, on the shipped secured config: a team's own chain runs, a
//! task of it cannot wait for another team's task, and verdicts, held fires and deadlines
//! forged from its account start nothing of the other team's.

use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt;
use jetsched_tests::{always, eventually};
use serde_json::{Value, json};

use super::{Deployment, TENANT, mismatch, probe, unanswered};
use crate::deploy::WAIT;

/// Dependencies stay inside a team: as `tenant-demo`, a chain of demo's own tasks runs, but a
/// task waiting for billing's task is refused at `put` (nothing stored), billing's graph is not
/// reachable, and forged parents' verdicts and held fires sent from demo's account start
/// nothing of billing's and write no wait of it.
#[tokio::test]
async fn a_team_cannot_wait_for_another_teams_tasks_nor_forge_their_verdicts() {
    let deployment = Deployment::start(&[], Default::default()).await;
    let (server, names) = (&deployment.server, &deployment.names);
    let billing = server.connect("tenant-billing").await;
    let billing_put = |spec: Value| billing.api.call(names.task_api_namespaced("put", "billing"), spec);
    let stored = billing_put(probe("payroll").every("1h").field("keep_result", true).json()).await;
    assert!(stored.get("error").is_none(), "{stored}");
    let report = probe("payroll-report")
        .every("1h")
        .field("after", json!({"tasks": ["payroll"], "within": "1h"}))
        .json();
    let stored = billing_put(report).await;
    assert!(stored.get("error").is_none(), "billing's own child: {stored}");

    // Demo's own chain works through demo's account.
    let tenant = server.connect(TENANT).await;
    let demo = |endpoint: &str| names.task_api_namespaced(endpoint, "demo");
    tenant.api.call(demo("put"), probe("extract").every("1h").json()).await;
    let load = probe("load").without("schedule").field("after", json!({"tasks": ["extract"]}));
    let stored = tenant.api.call(demo("put"), load.json()).await;
    assert!(stored.get("error").is_none(), "demo's own child: {stored}");
    let triggered = tenant.api.call(demo("trigger"), json!({"id": "extract"})).await;
    assert!(triggered.get("error").is_none(), "{triggered}");
    eventually(WAIT, "demo's child runs after its parent", || async { deployment.runs_of("demo/load") == 1 })
        .await;

    // Waiting for billing's task: refused, nothing stored.
    let spy = probe("spy").without("schedule").field("after", json!({"tasks": ["billing/payroll"]}));
    let reply = tenant.api.call(demo("put"), spy.json()).await;
    assert_eq!(reply["error"]["code"], "namespace_mismatch", "{reply}");
    assert_eq!(reply["error"]["field"], "after.tasks[0]", "{reply}");
    let scheduled_spy = probe("spy").every("1h").field("after", json!({"tasks": ["billing/payroll"]}));
    mismatch(
        &tenant.api.call(demo("put"), scheduled_spy.json()).await,
        "a scheduled child of billing's task",
    );
    let got = tenant.api.call(demo("get"), json!({"id": "spy"})).await;
    assert_eq!(got["error"]["code"], "not_found", "nothing stored: {got}");
    // Billing's graph: not through demo's subject, and billing's subject is not imported.
    let graph = tenant.api.call(demo("graph"), json!({"namespace": "billing", "id": "payroll"})).await;
    mismatch(&graph, "graph of billing's task");
    unanswered(&tenant.client, names.task_api_namespaced("graph", "billing")).await;

    // Forged from demo's account: a verdict of billing's parent, a held fire of billing's
    // child, a wait's deadline. None reaches the services' account.
    let verdict = json!({
        "execution_id": "forged-verdict", "namespace": "billing", "task_id": "payroll", "queue": "default",
        "nominal_time": "2026-01-01T00:00:00.000Z", "trigger": "schedule", "status": "succeeded", "attempt": 1,
        "worker": "w1", "started": "2026-01-01T00:00:00.000Z", "first_started": "2026-01-01T00:00:00.000Z",
        "finished": "2026-01-01T00:00:01.000Z", "attempts": [], "result": {"salary": "forged"}
    });
    let fire = json!({
        "execution_id": "forged-fire", "namespace": "billing", "task_id": "payroll-report",
        "nominal_time": "2026-01-01T00:00:00.000Z", "trigger": "schedule", "term": 0, "revision": 1,
        "spec": probe("payroll-report").field("namespace", "billing").every("1h").json()
    });
    for _ in 0..5 {
        for (subject, body) in [
            (format!("$KV.{}.forged-verdict", names.runs_bucket()), &verdict),
            (names.after_fire_subject("billing", "payroll-report"), &fire),
            (names.after_due_subject("billing", "payroll-report", 1_767_225_600_000), &fire),
        ] {
            tenant.client.publish(subject, body.to_string().into()).await.expect("send");
        }
        tenant.client.flush().await.expect("flush");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    always(Duration::from_secs(2), "no run of billing's child", || async {
        deployment.runs_of("billing/payroll-report") == 0
    })
    .await;
    let operator = server.connect("operator").await;
    let operator_js = jetstream::new(operator.client.clone());
    // (the operator lists the waits as `nats kv ls JETSCHED_WAITS` does)
    let waits = operator_js.get_key_value(names.waits_bucket()).await.expect("waits bucket");
    let mut keys = waits.keys().await.expect("keys");
    let mut billing_waits = Vec::new();
    while let Some(key) = keys.next().await {
        let key = key.expect("a key");
        if key.starts_with("billing.") {
            billing_waits.push(key);
        }
    }
    assert!(billing_waits.is_empty(), "no wait of billing's written: {billing_waits:?}");
    let runs = operator_js.get_key_value(names.runs_bucket()).await.expect("runs bucket");
    assert!(runs.get("forged-verdict").await.expect("read").is_none(), "no forged record stored");
    deployment.stop().await;
}
