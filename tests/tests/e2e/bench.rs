//! Smoke test of the benchmark command: `jetsched-bench all --size tiny` as a process, and a
//! JSON report with every scenario and sane numbers (figures, not timing assertions).

use std::time::Duration;

use jetsched_tests::{init_test_logging, workspace_bin};
use serde_json::Value;

fn number(report: &Value, pointer: &str) -> f64 {
    report
        .pointer(pointer)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("report has no number at {pointer}"))
}

#[tokio::test]
async fn bench_all_tiny_reports_every_scenario() {
    init_test_logging();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("report.json");
    let mut command = tokio::process::Command::new(workspace_bin("jetsched-bench"));
    command.args(["all", "--size", "tiny", "--json"]).arg(&path).kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .expect("jetsched-bench all --size tiny finishes within 120 s")
        .expect("run jetsched-bench");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "jetsched-bench failed: {stderr}");
    eprintln!("{stderr}");
    let report: Value =
        serde_json::from_slice(&std::fs::read(&path).expect("report written")).expect("report is JSON");
    let stdout: Value = serde_json::from_slice(&output.stdout).expect("stdout is the JSON report");
    assert_eq!(report, stdout);
    let scenarios = report["scenarios"].as_object().expect("scenarios");
    for name in ["raw", "registry", "burst", "steady", "e2e", "failover", "scale"] {
        assert!(scenarios.contains_key(name), "report lacks scenario {name}");
    }
    assert!(number(&report, "/scenarios/raw/publish_with_ids_per_second") > 100.0);
    assert!(number(&report, "/scenarios/raw/pull_ack_per_second") > 100.0);
    assert!(number(&report, "/scenarios/registry/phases/1/per_second") > 10.0);
    assert_eq!(number(&report, "/scenarios/burst/dispatched"), number(&report, "/scenarios/burst/tasks"));
    let burst_p99 = number(&report, "/scenarios/burst/lag/p99_ms");
    assert!((0.0..60_000.0).contains(&burst_p99), "burst lag p99 {burst_p99} ms");
    assert!(number(&report, "/scenarios/burst/ratio_to_raw") > 0.0);
    assert!(number(&report, "/scenarios/steady/lag/samples") > 0.0);
    assert!(number(&report, "/scenarios/steady/fires_per_second") > 0.0);
    let replicas = report["scenarios"]["e2e"]["replicas"].as_array().expect("e2e replicas");
    assert!(!replicas.is_empty());
    for r in replicas {
        assert!(r["runs_per_second"].as_f64().expect("rate") > 10.0, "{r}");
    }
    let gaps = report["scenarios"]["failover"]["gaps_ms"].as_array().expect("failover gaps");
    assert!(!gaps.is_empty());
    let p99 = number(&report, "/scenarios/failover/gap/p99_ms");
    let lease = number(&report, "/scenarios/failover/lease_ms");
    assert!(p99 > 0.0 && p99 < lease + 10_000.0, "failover p99 {p99} ms");
    assert!(number(&report, "/scenarios/scale/load_ms") > 0.0);
    assert!(number(&report, "/scenarios/scale/rss_mib") > 0.0);
    assert_eq!(number(&report, "/scenarios/scale/raw_watch_keys"), number(&report, "/scenarios/scale/tasks"));
}
