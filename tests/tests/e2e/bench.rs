//! Smoke tests of the benchmark command: `jetsched-bench all --size tiny` and `jetsched-bench
//! soak --size tiny` as processes, and JSON reports with every scenario and numbers in the
//! range any working system reaches (generous bounds, not timing targets).

use std::time::Duration;

use jetsched_tests::{init_test_logging, workspace_bin};
use serde_json::Value;

fn number(report: &Value, pointer: &str) -> f64 {
    report
        .pointer(pointer)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("report has no number at {pointer}"))
}

/// Runs `jetsched-bench args --json <report>` (within 120 s) with a report file of its own;
/// its output and the report.
async fn run_bench(args: &[&str]) -> (std::process::Output, Value) {
    init_test_logging();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("report.json");
    let mut command = tokio::process::Command::new(workspace_bin("jetsched-bench"));
    command.args(args).arg("--json").arg(&path).kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .expect("jetsched-bench finishes within 120 s")
        .expect("run jetsched-bench");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "jetsched-bench failed: {stderr}");
    eprintln!("{stderr}");
    let report =
        serde_json::from_slice(&std::fs::read(&path).expect("report written")).expect("report is JSON");
    (output, report)
}

#[tokio::test]
async fn bench_all_tiny_reports_every_scenario() {
    let (output, report) = run_bench(&["all", "--size", "tiny"]).await;
    let stdout: Value = serde_json::from_slice(&output.stdout).expect("stdout is the JSON report");
    assert_eq!(report, stdout);
    let scenarios = report["scenarios"].as_object().expect("scenarios");
    for name in ["raw", "registry", "burst", "steady", "e2e", "failover", "handover", "scale"] {
        assert!(scenarios.contains_key(name), "report lacks scenario {name}");
    }
    assert!(number(&report, "/scenarios/raw/publish_with_ids_per_second") > 100.0);
    assert!(number(&report, "/scenarios/raw/pull_ack_per_second") > 100.0);
    assert!(number(&report, "/scenarios/registry/phases/1/per_second") > 10.0);
    assert_eq!(number(&report, "/scenarios/burst/dispatched"), number(&report, "/scenarios/burst/tasks"));
    let burst_p99 = number(&report, "/scenarios/burst/lag/p99_ms");
    assert!((0.0..60_000.0).contains(&burst_p99), "burst lag p99 {burst_p99} ms");
    assert!(number(&report, "/scenarios/burst/ratio_to_raw") > 0.0);
    // The server's own message schedules of the same count: every generated copy measured.
    let scheduled = number(&report, "/scenarios/burst/schedules/lag/samples");
    assert_eq!(scheduled, number(&report, "/scenarios/burst/tasks"));
    assert!(number(&report, "/scenarios/burst/ratio_to_schedules") > 0.0);
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
    assert!(number(&report, "/scenarios/handover/lag/samples") > 0.0);
    assert!(number(&report, "/scenarios/e2e/floor_per_second") > 10.0);
    assert!(number(&report, "/scenarios/e2e/ceiling_per_second") > 10.0);
    assert!(number(&report, "/scenarios/e2e/event_ceiling_per_second") > 10.0);
    assert!(number(&report, "/scenarios/scale/load_ms") > 0.0);
    assert!(number(&report, "/scenarios/scale/rss_mib") > 0.0);
    assert!(number(&report, "/scenarios/scale/floor_ms") > 0.0);
    assert!(number(&report, "/scenarios/scale/ratio_to_floor") > 0.0);
    let rounds = report.pointer("/scenarios/scale/rounds").and_then(Value::as_array).expect("scale rounds");
    assert!(!rounds.is_empty());
    for round in rounds {
        assert_eq!(number(round, "/raw_watch_keys"), number(&report, "/scenarios/scale/tasks"));
        assert!(number(round, "/load_ms") > 0.0);
        // The floor read every key too, and parsed each (a bad spec would have failed it).
        assert!(number(round, "/floor_ms") > 0.0);
    }
}

/// `jetsched-bench soak` at the tiny size (20 s at 200 runs/s, 1 worker): every service as a
/// real process and every run a real request/reply; checks that it ran, not the verdicts.
#[tokio::test]
async fn bench_soak_tiny_runs_every_service() {
    // tiny: 20 s at 200 runs/s, a sample every 2 s.
    let (_, report) = run_bench(&["soak", "--size", "tiny", "--workers", "1"]).await;
    assert_eq!(report["scenario"], "soak");
    assert_eq!(number(&report, "/target_runs_per_second"), 200.0);
    assert!(number(&report, "/runs_succeeded") > 0.0);
    assert!(number(&report, "/handler_requests") > 0.0);
    let achieved = number(&report, "/achieved_runs_per_second");
    assert!(achieved >= 0.8 * 200.0, "achieved {achieved} runs/s of 200");
    let samples = report["samples"].as_array().expect("samples");
    assert!(samples.len() >= 5, "{} samples", samples.len());
    for service in ["registry", "scheduler", "worker-1", "alerter"] {
        for s in samples {
            let rss = s.pointer(&format!("/rss_mib/{service}")).and_then(Value::as_f64);
            assert!(rss.is_some_and(|mib| mib > 0.0), "no RSS of {service} in {s}");
        }
        assert!(number(&report, &format!("/memory/{service}/growth_pct")).is_finite());
    }
    // The server's own view: the runs bucket holds records by the last sample.
    let last = samples.last().expect("a sample");
    assert!(number(last, "/server/runs/messages") > 0.0, "no runs bucket size in {last}");
    assert!(number(last, "/server/events/mib") > 0.0, "no events stream size in {last}");
    assert_eq!(report["server_at_end"], last["server"]);
    for verdict in ["memory_flat", "lag_not_growing", "flat", "rate_sustained", "pass"] {
        assert!(report["verdicts"][verdict].is_boolean(), "verdict {verdict} missing");
    }
    // Fire lag early and late in the run: measured (finite), ordered, and far below a minute
    // (a tiny soak that fell behind by that much did not keep up).
    for at in ["first_after_warmup", "last"] {
        let p50 = number(&report, &format!("/lag/{at}/p50_ms"));
        let p99 = number(&report, &format!("/lag/{at}/p99_ms"));
        assert!(p99.is_finite() && (0.0..60_000.0).contains(&p99), "lag p99 {at}: {p99} ms");
        assert!((0.0..=p99).contains(&p50), "lag {at}: p50 {p50} ms outside 0..=p99 {p99} ms");
    }
}

/// `jetsched-bench chain`, small: every figure measured, the child of each verdict dispatched.
#[tokio::test]
async fn bench_chain_tiny_measures_the_chain_the_fan_in_and_the_fan_out() {
    let args = [
        "chain",
        "--samples",
        "50",
        "--fan-in",
        "50",
        "--fan-out",
        "200",
        "--ordinary-runs",
        "500",
        "--seconds",
        "2",
        "--tasks",
        "500",
        "--rate",
        "100",
    ];
    let (_, report) = run_bench(&args).await;
    assert_eq!(number(&report, "/chain/samples"), 50.0);
    let p99 = number(&report, "/chain/lag/p99_ms");
    assert!(p99 > 0.0 && p99 < 10_000.0, "chain p99 {p99} ms");
    assert!(number(&report, "/chain/steady_lag/p99_ms").is_finite());
    assert!(number(&report, "/fan_in/seconds") > 0.0);
    assert!(number(&report, "/fan_out/seconds") > 0.0);
    assert!(number(&report, "/fan_out/registry_rss_mib_after") > 0.0);
    for phase in ["without_child", "with_child"] {
        assert!(number(&report, &format!("/ordinary/{phase}/runs_per_second")) > 0.0, "{phase}");
    }
    assert!(number(&report, "/ordinary/ratio_with_to_without") > 0.0);
    assert_eq!(number(&report, "/graph/children_total"), 200.0, "every child counted");
    assert_eq!(number(&report, "/graph/children_described"), 100.0, "the first hundred described");
}
