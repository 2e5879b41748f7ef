//! Tracing end to end: the scheduler, worker and registry as real processes (the exporter is
//! process-wide) with their own OTEL_* environment, an OTLP/HTTP receiver, an HTTP downstream
//! and NATS handlers that record the trace context they get.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::HeaderMap;
use futures::StreamExt;
use jetsched_shared::names::Names;
use jetsched_shared::wire::{RunStatus, scheduled_execution_id};
use jetsched_tests::fixtures::{dead_letter_entry, store_dead_letter, wait_run_status};
use jetsched_tests::otlp::{
    Downstream, KIND_CLIENT, KIND_CONSUMER, KIND_PRODUCER, KIND_SERVER, OtlpReceiver, ReceivedSpan,
};
use jetsched_tests::{
    Api, App, ChildProcess, NatsServer, admin_get, always, eventually, free_addr, metric_value, spec,
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

/// A service process with the trace export of `otel` (variable, value) pairs.
fn service(
    binary: &str,
    server: &NatsServer,
    instance: &str,
    admin: SocketAddr,
    otel: &[(&str, &str)],
) -> ChildProcess {
    let mut command = ChildProcess::command(binary);
    command
        .args(["--nats-url", &server.url(), "--instance-id", instance])
        .args(["--admin-addr", &admin.to_string()])
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("JETSCHED_LOG_FORMAT", "json")
        .env("RUST_LOG", "info");
    if binary == "jetsched-worker" {
        // The downstreams listen on 127.0.0.1, which the http executor refuses by default.
        command.args(["--pull-expires", "500ms", "--http-allow", "*=127.0.0.0/8"]);
    }
    command.envs(otel.iter().copied());
    ChildProcess::spawn_command(instance, command)
}

/// Scheduler and worker processes exporting to `endpoint` with the extra variables `otel`.
fn scheduler_and_worker(
    server: &NatsServer,
    endpoint: &str,
    otel: &[(&str, &str)],
) -> (ChildProcess, ChildProcess, SocketAddr, SocketAddr) {
    let mut vars = vec![("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)];
    vars.extend_from_slice(otel);
    let (scheduler_admin, worker_admin) = (free_addr(), free_addr());
    let scheduler = service("jetsched-scheduler", server, "sched-traced", scheduler_admin, &vars);
    let worker = service("jetsched-worker", server, "worker-traced", worker_admin, &vars);
    (scheduler, worker, scheduler_admin, worker_admin)
}

/// Stores `spec` through an in-process registry (no export in the test process) and returns the
/// execution id of its one-shot fire at `at_ms`.
async fn put_one_shot(
    server: &NatsServer,
    builder: jetsched_tests::SpecBuilder,
    at_ms: i64,
) -> (App, String) {
    let registry = App::registry(jetsched_registry::Config::for_tests(&server.url())).await;
    let at = chrono::DateTime::from_timestamp_millis(at_ms).expect("valid time").to_rfc3339();
    let spec = builder.schedule(json!({"at": at})).json();
    let reply = Api::new(&server.client().await).put(&spec).await;
    assert!(reply.get("error").is_none(), "stored: {reply}");
    let execution_id = scheduled_execution_id(
        spec["namespace"].as_str().expect("namespace"),
        spec["id"].as_str().expect("id"),
        at_ms,
    );
    (registry, execution_id)
}

/// The spans of trace `trace_id` once the fire, the run and its HTTP request are all there.
async fn run_spans(receiver: &OtlpReceiver, trace_id: &str, what: &str) -> Vec<ReceivedSpan> {
    eventually(WAIT, what, || async {
        let spans = receiver.trace(trace_id);
        let kinds: Vec<i32> = spans.iter().map(|s| s.kind).collect();
        [KIND_PRODUCER, KIND_CONSUMER, KIND_CLIENT].iter().all(|k| kinds.contains(k)).then_some(spans)
    })
    .await
}

/// A whole-second instant a few seconds ahead, in Unix milliseconds.
fn soon_ms(seconds: i64) -> i64 {
    (chrono::Utc::now().timestamp() + seconds) * 1000
}

/// The execution id as a trace id: its 32 hex digits.
fn trace_id_of(execution_id: &str) -> String {
    execution_id.replace('-', "")
}

/// The trace id in a `traceparent`.
fn trace_id_in(traceparent: &str) -> &str {
    traceparent.split('-').nth(1).expect("a traceparent has a trace id")
}

/// The parent span id in a `traceparent`.
fn parent_in(traceparent: &str) -> &str {
    traceparent.split('-').nth(2).expect("a traceparent has a parent id")
}

fn one<'a>(spans: &'a [ReceivedSpan], what: &str, test: impl Fn(&ReceivedSpan) -> bool) -> &'a ReceivedSpan {
    let found: Vec<&ReceivedSpan> = spans.iter().filter(|s| test(s)).collect();
    assert_eq!(found.len(), 1, "one {what} span in {spans:#?}");
    found[0]
}

#[tokio::test]
async fn a_scheduled_execution_is_one_trace_from_the_fire_to_the_downstream() {
    let server = NatsServer::start().await;
    let receiver = OtlpReceiver::start().await;
    let downstream = Downstream::start().await;
    let (_scheduler, _worker, _, _) = scheduler_and_worker(&server, &receiver.endpoint(), &[]);
    let at_ms = soon_ms(3);
    let builder =
        spec("traced", "one").executor(json!({"kind": "http", "method": "POST", "url": downstream.url()}));
    let (_registry, execution_id) = put_one_shot(&server, builder, at_ms).await;
    let trace_id = trace_id_of(&execution_id);

    let headers =
        eventually(WAIT, "the downstream is called", || async { downstream.requests().into_iter().next() })
            .await;
    let traceparent = headers.get("traceparent").expect("the downstream gets a traceparent").clone();
    assert_eq!(trace_id_in(&traceparent), trace_id, "the trace id is the execution id's");

    let spans = run_spans(&receiver, &trace_id, "fire, run and http spans exported").await;
    let fire = one(&spans, "fire", |s| s.kind == KIND_PRODUCER);
    assert_eq!(fire.name, "fire traced/one");
    assert_eq!(fire.service, "jetsched-scheduler");
    assert_eq!(fire.resource.get("service.instance.id").map(String::as_str), Some("sched-traced"));
    assert!(fire.parent_span_id.is_empty(), "the fire is the root: {fire:?}");
    assert_eq!(fire.attr("jetsched.task"), Some("traced/one"));
    assert_eq!(fire.attr("jetsched.execution_id"), Some(execution_id.as_str()));
    assert_eq!(fire.attr("jetsched.trigger"), Some("schedule"));
    let nominal = chrono::DateTime::from_timestamp_millis(at_ms).unwrap();
    assert_eq!(
        fire.attr("jetsched.nominal_time"),
        Some(jetsched_shared::wire::format_time(nominal).as_str())
    );
    assert!(fire.attr("jetsched.leader_term").is_some_and(|t| t != "0"), "{fire:?}");
    assert!(fire.attr("jetsched.fire_lag_ms").is_some(), "{fire:?}");

    let run = one(&spans, "run", |s| s.kind == KIND_CONSUMER);
    assert_eq!(run.service, "jetsched-worker");
    assert_eq!(run.parent_span_id, fire.span_id, "the run is the fire's child");
    assert_eq!(run.attr("jetsched.execution_id"), Some(execution_id.as_str()));
    assert_eq!(run.attr("jetsched.attempt"), Some("1"));
    assert_eq!(run.attr("jetsched.outcome"), Some("succeeded"));
    assert_eq!(run.attr("messaging.system"), Some("nats"));

    let http = one(&spans, "http", |s| s.kind == KIND_CLIENT);
    assert_eq!(http.parent_span_id, run.span_id, "the HTTP call is the run's child");
    assert_eq!(http.attr("http.request.method"), Some("POST"));
    assert_eq!(http.attr("url.full"), Some(downstream.url().as_str()));
    assert_eq!(http.attr("http.response.status_code"), Some("200"));
    assert_eq!(parent_in(&traceparent), http.span_id, "the downstream's parent is the HTTP span");

    let js = async_nats::jetstream::new(server.client().await);
    let record = wait_run_status(&js, &Names::default(), &execution_id, RunStatus::Succeeded, WAIT).await;
    assert_eq!(record.trace_id.as_deref(), Some(trace_id.as_str()), "the run record carries the trace id");
}

#[tokio::test]
async fn every_attempt_of_a_retried_execution_is_in_the_same_trace() {
    let server = NatsServer::start().await;
    let receiver = OtlpReceiver::start().await;
    let downstream = Downstream::failing_first(&[500, 503]).await;
    let (_scheduler, worker, _, _) = scheduler_and_worker(&server, &receiver.endpoint(), &[]);
    let builder = spec("traced", "retried")
        .executor(json!({"kind": "http", "method": "GET", "url": downstream.url()}))
        .fast_retry(3);
    let (_registry, execution_id) = put_one_shot(&server, builder, soon_ms(3)).await;
    let trace_id = trace_id_of(&execution_id);

    let runs = eventually(WAIT, "three run spans exported", || async {
        let runs: Vec<ReceivedSpan> =
            receiver.trace(&trace_id).into_iter().filter(|s| s.kind == KIND_CONSUMER).collect();
        (runs.len() >= 3).then_some(runs)
    })
    .await;
    let mut attempts: Vec<(String, String)> = runs
        .iter()
        .map(|s| {
            (
                s.attr("jetsched.attempt").unwrap_or("?").to_string(),
                s.attr("jetsched.outcome").unwrap_or("?").to_string(),
            )
        })
        .collect();
    attempts.sort();
    assert_eq!(
        attempts,
        [("1".into(), "retrying".into()), ("2".into(), "retrying".into()), ("3".into(), "succeeded".into())]
    );
    let requests = downstream.requests();
    assert_eq!(requests.len(), 3);
    for headers in requests {
        assert_eq!(trace_id_in(&headers["traceparent"]), trace_id, "every attempt joins the trace");
    }
    // The JSON log lines written inside a run span carry its trace and span ids.
    let logged = worker.output();
    let retrying = logged
        .lines()
        .find(|line| line.contains("attempt failed; retrying"))
        .unwrap_or_else(|| panic!("a retry is logged: {logged}"));
    let line: Value = serde_json::from_str(retrying).expect("a JSON log line");
    assert_eq!(line["span"]["trace_id"], trace_id.as_str(), "{line}");
    let span_ids: Vec<&str> = runs.iter().map(|s| s.span_id.as_str()).collect();
    assert!(span_ids.contains(&line["span"]["span_id"].as_str().unwrap_or_default()), "{line}");
}

/// A NATS responder on `subject` recording the headers of every request and answering ok.
async fn recording_handler(
    client: async_nats::Client,
    subject: &str,
) -> Arc<Mutex<Vec<HashMap<String, String>>>> {
    let mut sub = client.subscribe(subject.to_string()).await.expect("subscribe");
    client.flush().await.expect("flush");
    let seen: Arc<Mutex<Vec<HashMap<String, String>>>> = Arc::default();
    let record = seen.clone();
    tokio::spawn(async move {
        while let Some(request) = sub.next().await {
            let headers = request
                .headers
                .iter()
                .flat_map(|h| h.iter())
                .filter_map(|(name, values)| Some((name.to_string(), values.first()?.to_string())))
                .collect();
            record.lock().expect("seen").push(headers);
            if let Some(reply) = request.reply {
                let _ = client.publish(reply, "ok".into()).await;
            }
        }
    });
    seen
}

#[tokio::test]
async fn a_nats_handler_gets_the_trace_context() {
    let server = NatsServer::start().await;
    let receiver = OtlpReceiver::start().await;
    let seen = recording_handler(server.client().await, "traced.handler").await;
    let (_scheduler, _worker, _, _) = scheduler_and_worker(&server, &receiver.endpoint(), &[]);
    let (_registry, execution_id) =
        put_one_shot(&server, spec("traced", "nats").nats("traced.handler"), soon_ms(3)).await;
    let trace_id = trace_id_of(&execution_id);
    let headers =
        eventually(WAIT, "the handler is called", || async { seen.lock().unwrap().first().cloned() }).await;
    let traceparent = headers.get("traceparent").expect("the handler gets a traceparent");
    assert_eq!(trace_id_in(traceparent), trace_id);
    let spans = eventually(WAIT, "the NATS request span exported", || async {
        let spans = receiver.trace(&trace_id);
        spans
            .iter()
            .any(|s| s.attr("messaging.destination.name") == Some("traced.handler") && s.kind == KIND_CLIENT)
            .then_some(spans)
    })
    .await;
    let request = one(&spans, "request", |s| s.kind == KIND_CLIENT);
    assert_eq!(request.attr("messaging.system"), Some("nats"));
    assert_eq!(parent_in(traceparent), request.span_id, "the handler's parent is the request span");
}

#[tokio::test]
async fn with_sampling_off_nothing_is_exported_but_the_context_still_travels() {
    let server = NatsServer::start().await;
    let receiver = OtlpReceiver::start().await;
    let seen = recording_handler(server.client().await, "untraced.handler").await;
    let otel = [("OTEL_TRACES_SAMPLER", "always_off")];
    let (_scheduler, _worker, _, _) = scheduler_and_worker(&server, &receiver.endpoint(), &otel);
    let (_registry, execution_id) =
        put_one_shot(&server, spec("traced", "unsampled").nats("untraced.handler"), soon_ms(3)).await;
    let headers =
        eventually(WAIT, "the handler is called", || async { seen.lock().unwrap().first().cloned() }).await;
    let traceparent = headers.get("traceparent").expect("the handler gets a traceparent");
    assert_eq!(trace_id_in(traceparent), trace_id_of(&execution_id));
    assert!(traceparent.ends_with("-00"), "not sampled: {traceparent}");
    let js = async_nats::jetstream::new(server.client().await);
    wait_run_status(&js, &Names::default(), &execution_id, RunStatus::Succeeded, WAIT).await;
    // Several export periods (100 ms each) pass: still nothing.
    always(Duration::from_millis(1500), "no span exported", || async {
        let spans = receiver.spans();
        if spans.is_empty() { Ok(()) } else { Err(format!("{spans:#?}")) }
    })
    .await;
}

#[tokio::test]
async fn a_collector_that_is_down_costs_dropped_spans_and_export_resumes_when_it_is_back() {
    let server = NatsServer::start().await;
    let port = free_addr().port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let downstream = Downstream::start().await;
    let (_scheduler, _worker, _, worker_admin) = scheduler_and_worker(&server, &endpoint, &[]);
    let registry = App::registry(jetsched_registry::Config::for_tests(&server.url())).await;
    let every = spec("traced", "steady")
        .every("1s")
        .executor(json!({"kind": "http", "method": "POST", "url": downstream.url()}))
        .json();
    let reply = Api::new(&server.client().await).put(&every).await;
    assert!(reply.get("error").is_none(), "stored: {reply}");

    eventually(WAIT, "the worker counts dropped spans", || async {
        let metrics = admin_get(worker_admin, "/metrics").await.ok()?.body;
        metric_value(&metrics, "jetsched_trace_spans_dropped_total").filter(|dropped| *dropped > 0.0)
    })
    .await;
    let before = downstream.requests().len();
    eventually(WAIT, "runs go on while the collector is down", || async {
        (downstream.requests().len() >= before + 2).then_some(())
    })
    .await;

    let receiver = OtlpReceiver::start_on(port).await;
    eventually(WAIT, "export resumes once the collector is back", || async {
        let spans = receiver.spans();
        (spans.iter().any(|s| s.kind == KIND_PRODUCER) && spans.iter().any(|s| s.kind == KIND_CONSUMER))
            .then_some(())
    })
    .await;
    drop(registry);
}

#[tokio::test]
async fn a_registry_request_with_a_traceparent_continues_the_callers_trace() {
    let server = NatsServer::start().await;
    let receiver = OtlpReceiver::start().await;
    let otel = [("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint())];
    let otel: Vec<(&str, &str)> = otel.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let _registry = service("jetsched-registry", &server, "registry-traced", free_addr(), &otel);
    let client = server.client().await;
    let caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let put_spec = spec("traced", "put").json();
    let api = Api::new(&client);
    let reply = eventually(WAIT, "the registry answers", || async {
        let mut headers = HeaderMap::new();
        headers.insert("traceparent", format!("00-{caller_trace}-{caller_span}-01").as_str());
        let body = serde_json::to_vec(&put_spec).expect("JSON");
        api.reply(api.names().task_api_subject("put"), headers, body).await
    })
    .await;
    assert!(reply.get("error").is_none(), "stored: {reply}");
    let spans = eventually(WAIT, "the put span exported", || async {
        let spans = receiver.trace(caller_trace);
        spans.iter().any(|s| s.kind == KIND_SERVER).then_some(spans)
    })
    .await;
    let put = one(&spans, "put", |s| s.kind == KIND_SERVER);
    assert_eq!(put.service, "jetsched-registry");
    assert_eq!(put.parent_span_id, caller_span, "the caller's span is the parent");
    assert_eq!(put.attr("jetsched.task"), Some("traced/put"));

    // A submission through the intake stream continues its publisher's trace too.
    let publisher_span = "00f067aa0ba902b8";
    let mut headers = HeaderMap::new();
    headers.insert("traceparent", format!("00-{caller_trace}-{publisher_span}-01").as_str());
    let submitted = spec("traced", "submitted").json();
    let js = async_nats::jetstream::new(client.clone());
    let subject = Names::default().submit_subject("traced", "submitted");
    js.publish_with_headers(subject, headers, serde_json::to_vec(&submitted).expect("JSON").into())
        .await
        .expect("publish")
        .await
        .expect("stored");
    let spans = eventually(WAIT, "the intake span exported", || async {
        let spans = receiver.trace(caller_trace);
        spans.iter().any(|s| s.kind == KIND_CONSUMER).then_some(spans)
    })
    .await;
    let intake = one(&spans, "intake", |s| s.kind == KIND_CONSUMER);
    assert_eq!(intake.parent_span_id, publisher_span, "the publisher's span is the parent");
    assert_eq!(intake.attr("jetsched.task"), Some("traced/submitted"));
}

/// The trace context of a caller: trace id, span id and vendor state.
const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
const CALLER_STATE: &str = "vendor=abc";

fn caller_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("traceparent", format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01").as_str());
    headers.insert("tracestate", CALLER_STATE);
    headers
}

/// The `traceparent` and `tracestate` of the last dispatch of `namespace/id` on queue default.
async fn dispatch_trace_headers(
    js: &async_nats::jetstream::Context,
    namespace: &str,
    id: &str,
) -> (Option<String>, Option<String>) {
    let names = Names::default();
    let stream = js.get_stream(names.dispatch_stream()).await.expect("dispatch stream");
    let subject = names.dispatch_subject("default", namespace, id);
    let message = eventually(WAIT, "the dispatch is stored", || async {
        stream.get_last_raw_message_by_subject(&subject).await.ok()
    })
    .await;
    let get = |name: &str| message.headers.get(name).map(|v| v.as_str().to_string());
    (get("traceparent"), get("tracestate"))
}

#[tokio::test]
async fn trigger_and_replay_dispatches_carry_the_callers_trace_context_without_export() {
    let server = NatsServer::start().await;
    // In-process registry: this test process exports nothing.
    let _registry = App::registry(jetsched_registry::Config::for_tests(&server.url())).await;
    let client = server.client().await;
    let api = Api::new(&client);
    let js = async_nats::jetstream::new(client.clone());
    let task = spec("carried", "manual").every("1h");
    let reply = api.put(&task.json()).await;
    assert!(reply.get("error").is_none(), "stored: {reply}");

    // A trigger with the caller's context: the dispatch carries it as it came.
    let body = json!({"namespace": "carried", "id": "manual"});
    let reply = api.task_with("trigger", caller_headers(), body.clone()).await;
    assert!(reply.get("error").is_none(), "triggered: {reply}");
    let expected = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let (traceparent, tracestate) = dispatch_trace_headers(&js, "carried", "manual").await;
    assert_eq!(traceparent.as_deref(), Some(expected.as_str()), "the caller's traceparent");
    assert_eq!(tracestate.as_deref(), Some(CALLER_STATE), "the caller's tracestate");

    // Without one: a traceparent derived from the new execution id.
    let reply = api.task("trigger", body.clone()).await;
    let execution_id = reply["execution_id"].as_str().unwrap_or_else(|| panic!("{reply}")).to_string();
    let (traceparent, tracestate) = dispatch_trace_headers(&js, "carried", "manual").await;
    let traceparent = traceparent.expect("a derived traceparent");
    assert_eq!(trace_id_in(&traceparent), trace_id_of(&execution_id));
    assert_eq!(tracestate, None);

    // A dead letter replayed with the caller's context.
    let names = Names::default();
    let dead = dead_letter_entry(&spec("carried", "replayed").json(), "0b2f9c8e-61a4-5d2b-9b5e-3f1c2d4e5f60");
    let sequence = store_dead_letter(&js, names.dlq_subject("default", "carried", "replayed"), &dead)
        .await
        .expect("dead letter stored");
    let reply =
        api.call_with(names.dlq_api_subject("replay"), caller_headers(), json!({"sequence": sequence})).await;
    assert!(reply.get("error").is_none(), "replayed: {reply}");
    let (traceparent, tracestate) = dispatch_trace_headers(&js, "carried", "replayed").await;
    assert_eq!(traceparent.as_deref(), Some(expected.as_str()), "the caller's traceparent");
    assert_eq!(tracestate.as_deref(), Some(CALLER_STATE), "the caller's tracestate");
}

/// Runs `count` one-shot tasks through a scheduler that exports nothing and samples roots at
/// `ratio`, and a worker exporting with its default (parent-based) sampler; then one triggered
/// run whose caller's trace is sampled, whose run span, once exported, shows the worker's
/// export has passed the scheduled runs. Returns how many scheduled runs had a run span.
async fn worker_runs_exported_with_root_ratio(ratio: &str, count: usize) -> usize {
    let server = NatsServer::start().await;
    let receiver = OtlpReceiver::start().await;
    let downstream = Downstream::start().await;
    let root = [("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"), ("OTEL_TRACES_SAMPLER_ARG", ratio)];
    let _scheduler = service("jetsched-scheduler", &server, "sched-root", free_addr(), &root);
    let endpoint = receiver.endpoint();
    let _worker = service(
        "jetsched-worker",
        &server,
        "worker-follows",
        free_addr(),
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())],
    );
    let registry = App::registry(jetsched_registry::Config::for_tests(&server.url())).await;
    let client = server.client().await;
    let api = Api::new(&client);
    let js = async_nats::jetstream::new(client.clone());
    let at_ms = soon_ms(3);
    let at = chrono::DateTime::from_timestamp_millis(at_ms).expect("valid time").to_rfc3339();
    let executor = json!({"kind": "http", "method": "POST", "url": downstream.url()});
    let mut executions = Vec::new();
    for n in 0..count {
        let id = format!("root-{n}");
        let task = spec("sampled", &id).executor(executor.clone()).schedule(json!({"at": at}));
        let reply = api.put(&task.json()).await;
        assert!(reply.get("error").is_none(), "stored: {reply}");
        executions.push(scheduled_execution_id("sampled", &id, at_ms));
    }
    for execution_id in &executions {
        wait_run_status(&js, &Names::default(), execution_id, RunStatus::Succeeded, WAIT).await;
    }
    for headers in downstream.requests() {
        let flags = headers["traceparent"].rsplit('-').next().unwrap_or_default().to_string();
        let expected = if ratio == "0.0" { "00" } else { "01" };
        assert_eq!(flags, expected, "the root's decision travels: {headers:?}");
    }

    let control = spec("sampled", "control").executor(executor).every("1h");
    let reply = api.put(&control.json()).await;
    assert!(reply.get("error").is_none(), "stored: {reply}");
    let body = json!({"namespace": "sampled", "id": "control"});
    let reply = api.task_with("trigger", caller_headers(), body.clone()).await;
    assert!(reply.get("error").is_none(), "triggered: {reply}");
    eventually(WAIT, "the control run's span exported", || async {
        receiver.trace(CALLER_TRACE).iter().any(|s| s.kind == KIND_CONSUMER).then_some(())
    })
    .await;
    let spans = receiver.spans();
    assert!(
        !spans.iter().any(|s| s.service == "jetsched-scheduler"),
        "the scheduler exports nothing: {spans:#?}"
    );
    drop(registry);
    executions
        .iter()
        .filter(|execution_id| {
            let trace_id = trace_id_of(execution_id);
            spans.iter().any(|s| s.trace_id == trace_id && s.kind == KIND_CONSUMER)
        })
        .count()
}

#[tokio::test]
async fn a_root_sampling_none_leaves_every_worker_span_unexported() {
    assert_eq!(worker_runs_exported_with_root_ratio("0.0", 4).await, 0);
}

#[tokio::test]
async fn a_root_sampling_all_gets_every_worker_span_exported() {
    assert_eq!(worker_runs_exported_with_root_ratio("1.0", 4).await, 4);
}

/// A NATS responder on `subject` answering every request after `delay`.
async fn slow_handler(client: async_nats::Client, subject: &str, delay: Duration) {
    let mut sub = client.subscribe(subject.to_string()).await.expect("subscribe");
    client.flush().await.expect("flush");
    tokio::spawn(async move {
        while let Some(request) = sub.next().await {
            let client = client.clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                if let Some(reply) = request.reply {
                    let _ = client.publish(reply, "ok".into()).await;
                }
            });
        }
    });
}

#[tokio::test]
async fn a_fire_skipped_for_overlap_is_a_short_span_with_its_reason() {
    let server = NatsServer::start().await;
    let receiver = OtlpReceiver::start().await;
    slow_handler(server.client().await, "traced.slow", Duration::from_millis(2500)).await;
    let (_scheduler, _worker, _, _) = scheduler_and_worker(&server, &receiver.endpoint(), &[]);
    let registry = App::registry(jetsched_registry::Config::for_tests(&server.url())).await;
    let task =
        spec("traced", "slow").every("1s").nats("traced.slow").timeout("10s").field("overlap", "skip").json();
    let reply = Api::new(&server.client().await).put(&task).await;
    assert!(reply.get("error").is_none(), "stored: {reply}");

    let skipped = eventually(WAIT, "a skipped fire's span exported", || async {
        receiver.spans().into_iter().find(|s| s.attr("jetsched.skip_reason").is_some())
    })
    .await;
    assert_eq!(skipped.name, "fire traced/slow skipped");
    assert_eq!(skipped.service, "jetsched-scheduler");
    assert_eq!(skipped.attr("jetsched.skip_reason"), Some("overlap"));
    assert_eq!(skipped.attr("jetsched.task"), Some("traced/slow"));
    assert!(skipped.parent_span_id.is_empty(), "a root of its own: {skipped:?}");
    let execution_id = skipped.attr("jetsched.execution_id").expect("the skipped execution");
    assert_eq!(skipped.trace_id, trace_id_of(execution_id), "the skipped fire's own trace");
    assert!(skipped.attr("jetsched.nominal_time").is_some(), "{skipped:?}");
    drop(registry);
}

/// The spans of the caller's trace once `count` request, run and HTTP spans are in it (each
/// service exports on its own schedule).
async fn caller_trace_with_runs(receiver: &OtlpReceiver, count: usize) -> Vec<ReceivedSpan> {
    eventually(WAIT, "the requests' and runs' spans in the caller's trace", || async {
        let spans = receiver.trace(CALLER_TRACE);
        let of = |kind: i32| spans.iter().filter(|s| s.kind == kind).count();
        [KIND_SERVER, KIND_CONSUMER, KIND_CLIENT].iter().all(|k| of(*k) >= count).then_some(spans)
    })
    .await
}

#[tokio::test]
async fn trigger_and_replay_spans_join_the_callers_trace_with_the_runs_they_dispatch() {
    let server = NatsServer::start().await;
    let receiver = OtlpReceiver::start().await;
    let downstream = Downstream::start().await;
    let endpoint = receiver.endpoint();
    let otel = [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())];
    let _registry = service("jetsched-registry", &server, "registry-traced", free_addr(), &otel);
    let _worker = service("jetsched-worker", &server, "worker-traced", free_addr(), &otel);
    let client = server.client().await;
    let executor = json!({"kind": "http", "method": "POST", "url": downstream.url()});
    let task = spec("traced", "manual").every("1h").executor(executor.clone()).json();
    let api = Api::new(&client);
    let reply = eventually(WAIT, "the registry answers", || async {
        api.reply(
            api.names().task_api_subject("put"),
            HeaderMap::new(),
            serde_json::to_vec(&task).expect("JSON"),
        )
        .await
    })
    .await;
    assert!(reply.get("error").is_none(), "stored: {reply}");

    let reply =
        api.task_with("trigger", caller_headers(), json!({"namespace": "traced", "id": "manual"})).await;
    assert!(reply.get("error").is_none(), "triggered: {reply}");
    let spans = caller_trace_with_runs(&receiver, 1).await;
    let trigger = one(&spans, "trigger", |s| s.kind == KIND_SERVER);
    assert_eq!(trigger.name, "trigger");
    assert_eq!(trigger.service, "jetsched-registry");
    assert_eq!(trigger.parent_span_id, CALLER_SPAN, "the caller's span is the parent");
    assert_eq!(trigger.attr("jetsched.task"), Some("traced/manual"));
    let run = one(&spans, "run", |s| s.kind == KIND_CONSUMER);
    assert_eq!(run.parent_span_id, trigger.span_id, "the run is the trigger's child");
    assert_eq!(run.attr("jetsched.trigger"), Some("manual"));
    let http = one(&spans, "http", |s| s.kind == KIND_CLIENT);
    assert_eq!(http.parent_span_id, run.span_id);

    // A dead letter replayed by another span of the same caller.
    let names = Names::default();
    let replayer_span = "00f067aa0ba902b9";
    let dead = dead_letter_entry(
        &spec("traced", "replayed").every("1h").executor(executor).json(),
        "0b2f9c8e-61a4-5d2b-9b5e-3f1c2d4e5f60",
    );
    let js = async_nats::jetstream::new(client.clone());
    let sequence = store_dead_letter(&js, names.dlq_subject("default", "traced", "replayed"), &dead)
        .await
        .expect("dead letter stored");
    let mut headers = HeaderMap::new();
    headers.insert("traceparent", format!("00-{CALLER_TRACE}-{replayer_span}-01").as_str());
    let reply = api.call_with(names.dlq_api_subject("replay"), headers, json!({"sequence": sequence})).await;
    assert!(reply.get("error").is_none(), "replayed: {reply}");
    let spans = caller_trace_with_runs(&receiver, 2).await;
    let replay = one(&spans, "replay", |s| s.kind == KIND_SERVER && s.parent_span_id == replayer_span);
    assert_eq!(replay.name, "dlq replay");
    let run = one(&spans, "replayed run", |s| s.kind == KIND_CONSUMER && s.parent_span_id == replay.span_id);
    assert_eq!(run.attr("jetsched.trigger"), Some("replay"));
}

#[tokio::test]
async fn spans_are_exported_over_grpc_when_asked() {
    let server = NatsServer::start().await;
    let receiver = OtlpReceiver::start_grpc().await;
    let downstream = Downstream::start().await;
    let grpc = [("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")];
    let (_scheduler, _worker, _, _) = scheduler_and_worker(&server, &receiver.endpoint(), &grpc);
    let builder =
        spec("traced", "grpc").executor(json!({"kind": "http", "method": "POST", "url": downstream.url()}));
    let (_registry, execution_id) = put_one_shot(&server, builder, soon_ms(3)).await;
    let trace_id = trace_id_of(&execution_id);
    let spans = run_spans(&receiver, &trace_id, "fire and run spans received over gRPC").await;
    let fire = one(&spans, "fire", |s| s.kind == KIND_PRODUCER);
    assert_eq!(fire.service, "jetsched-scheduler");
    let run = one(&spans, "run", |s| s.kind == KIND_CONSUMER);
    assert_eq!(run.service, "jetsched-worker");
    assert_eq!(run.parent_span_id, fire.span_id);
    assert!(receiver.requests() > 0);
}

/// A server whose account traces every message with a sampled `traceparent` (nats-server's
/// message tracing, `msg_trace`), its events sent to `trace.events`.
async fn server_tracing_its_account() -> NatsServer {
    let accounts = r#"
accounts {
  APP {
    jetstream: enabled
    users: [{user: app, password: app}]
    msg_trace: {dest: "trace.events", sampling: 100}
  }
}
no_auth_user: app
"#;
    NatsServer::start_with(jetsched_tests::ServerOpts::default().extra_config(accounts)).await
}

/// Runs a scheduler process with `vars`, fires one one-shot, and returns the dispatch as
/// published (a plain subscriber sees its headers as sent) and the trace events nats-server
/// sent for it within a second after.
async fn dispatch_and_server_trace_events(vars: &[(&str, &str)]) -> (HeaderMap, Vec<Value>) {
    let server = server_tracing_its_account().await;
    let client = server.client().await;
    let mut events = client.subscribe("trace.events").await.expect("subscribe");
    let mut dispatches = client.subscribe(Names::default().dispatch_wildcard()).await.expect("subscribe");
    client.flush().await.expect("flush");
    let _scheduler = service("jetsched-scheduler", &server, "sched-msg-trace", free_addr(), vars);
    let (_registry, _execution_id) =
        put_one_shot(&server, spec("traced", "server-traced").nats("nobody.listens"), soon_ms(3)).await;
    let dispatch = tokio::time::timeout(WAIT, dispatches.next())
        .await
        .expect("the dispatch is published in time")
        .expect("subscription open");
    let mut received = Vec::new();
    let quiet = tokio::time::sleep(Duration::from_secs(1));
    tokio::pin!(quiet);
    loop {
        tokio::select! {
            event = events.next() => {
                let event = event.expect("subscription open");
                received.push(serde_json::from_slice(&event.payload).expect("a trace event is JSON"));
            }
            _ = &mut quiet => break,
        }
    }
    (dispatch.headers.expect("a dispatch has headers"), received)
}

#[tokio::test]
async fn nats_server_traces_sampled_dispatches_only_when_the_scheduler_lets_it() {
    // By default a sampled dispatch tells nats-server not to trace it: no event, even though
    // the account traces every sampled message.
    let (headers, events) = dispatch_and_server_trace_events(&[]).await;
    let traceparent = headers.get("traceparent").expect("a traceparent").to_string();
    assert!(traceparent.ends_with("-01"), "sampled: {traceparent}");
    assert_eq!(headers.get("Nats-Trace-Dest").map(|v| v.as_str()), Some("trace disabled"));
    assert!(events.is_empty(), "no server trace of the dispatch: {events:#?}");

    // Let through, nats-server traces the dispatch into the stream under the same trace id.
    let (headers, events) = dispatch_and_server_trace_events(&[("JETSCHED_NATS_MSG_TRACE", "true")]).await;
    let traceparent = headers.get("traceparent").expect("a traceparent").to_string();
    assert_eq!(headers.get("Nats-Trace-Dest"), None);
    let stream = Names::default().dispatch_stream();
    let traced = events.iter().find(|event| {
        let request = &event["request"]["header"];
        let carried =
            request["traceparent"].as_array().and_then(|values| values.first()).and_then(Value::as_str);
        let stored_in = event["events"].as_array().is_some_and(|hops| {
            hops.iter().any(|hop| hop["type"] == "js" && hop["stream"].as_str() == Some(stream.as_str()))
        });
        carried == Some(traceparent.as_str()) && stored_in
    });
    assert!(traced.is_some(), "a server trace of the dispatch into {stream}: {events:#?}");
}
