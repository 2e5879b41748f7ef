//! Reading a stored task spec (`TaskSpec::parse`), what the scheduler does for every task while
//! it loads the tasks bucket and the registry for every put.
//!
//! `cargo bench -p jetsched-shared --bench spec` (about a minute).

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use jetsched_shared::spec::TaskSpec;
use serde_json::json;

/// The specs of `jetsched-bench scale` (an interval with an anchor, a NATS executor) and of
/// `jetsched-bench registry` (cron in a zone, HTTP with a body, retry, labels), and one with an
/// escaped string.
fn documents() -> Vec<(&'static str, Vec<u8>)> {
    let doc = |value: serde_json::Value| serde_json::to_vec(&value).expect("spec serializes");
    vec![
        (
            "interval",
            doc(json!({
                "id": "t123456", "namespace": "bench",
                "schedule": {"every": "1h", "anchor": "1970-01-01T00:12:20.148Z"},
                "executor": {"kind": "nats", "subject": "bench.run"}, "misfire": "fire_all",
            })),
        ),
        (
            "cron_http",
            doc(json!({
                "id": "r123456", "namespace": "bench",
                "schedule": {"cron": "0 */5 * * * *", "timezone": "Europe/Berlin"},
                "executor": {"kind": "http", "method": "POST", "url": "http://reports.internal/run", "body": {"day": "yesterday"}},
                "retry": {"max_attempts": 4, "initial": "1s"},
                "labels": {"team": "bench", "generation": "3"}
            })),
        ),
        (
            "escaped",
            doc(json!({
                "id": "e1", "schedule": {"every": "30s"}, "paused": true, "paused_reason": "said \"wait\"\n",
                "executor": {"kind": "handler", "name": "report"},
            })),
        ),
    ]
}

fn parse(c: &mut Criterion) {
    let mut group = c.benchmark_group("spec_parse");
    group.throughput(Throughput::Elements(1));
    for (name, bytes) in documents() {
        assert!(TaskSpec::parse(&bytes).is_ok(), "{name} is a valid spec");
        group.bench_function(name, |b| b.iter(|| TaskSpec::parse(black_box(&bytes))));
    }
    group.finish();
}

criterion_group!(benches, parse);
criterion_main!(benches);
