//! End-to-end tests of batched direct gets (`multi_last`) against a real nats-server: the
//! latest value of many KV keys in one request, markers and missing keys told apart, an empty
//! answer, a refused request as an error, and a worker with lazy records reading the records
//! of a backlog in batches, every run executed once.

use std::time::Duration;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_nats::jetstream;
use futures::StreamExt;
use jetsched_shared::direct_batch::{DirectBatch, DirectBatchError, MAX_SUBJECTS};
use jetsched_shared::names::Names;
use jetsched_tests::fixtures::{execution_of, publish_dispatch, wait_run_status};
use jetsched_tests::{App, NatsServer, eventually, spec};
use jetsched_worker::runs::RunStatus;
use jetsched_worker::{Handlers, Outcome, RunContext, RunRecords};

use crate::worker_support::{WAIT, config, dispatch_pending};

/// A fresh server, a client on it and a KV bucket `name` (history 1).
async fn server_with_bucket(name: &str) -> (NatsServer, async_nats::Client, jetstream::kv::Store) {
    let server = NatsServer::start().await;
    let client = server.client().await;
    let kv = jetstream::new(client.clone())
        .create_key_value(jetstream::kv::Config {
            bucket: name.to_string(),
            history: 1,
            ..Default::default()
        })
        .await
        .expect("bucket");
    (server, client, kv)
}

#[tokio::test]
async fn one_request_reads_the_latest_value_of_many_keys() {
    let (_server, client, kv) = server_with_bucket("BATCHED").await;
    let keys: Vec<String> = (0..MAX_SUBJECTS - 2).map(|n| format!("run-{n}")).collect();
    for key in &keys {
        kv.create(key.as_str(), format!("first {key}").into()).await.expect("create");
    }
    // Some keys written again, one deleted; one key asked is never written.
    for key in keys.iter().step_by(7) {
        kv.put(key.as_str(), format!("second {key}").into()).await.expect("put");
    }
    kv.delete("run-3").await.expect("delete");
    let mut asked: Vec<String> = keys.iter().map(|key| Names::kv_subject("BATCHED", key)).collect();
    asked.push(Names::kv_subject("BATCHED", "never-written"));

    let mut reader = DirectBatch::new(client.clone(), &Names::kv_stream("BATCHED")).await.expect("reader");
    let found = reader.last_of(&asked).await.expect("batched read");
    assert_eq!(found.len(), keys.len(), "one message per written key, none for the missing one");
    for message in &found {
        let key = message.subject.strip_prefix("$KV.BATCHED.").expect("bucket subject");
        let entry = kv.entry(key).await.expect("entry").expect("present");
        assert_eq!(message.sequence, entry.revision, "{key}: the latest revision");
        if key == "run-3" {
            assert!(message.is_kv_marker(), "a deleted key comes back as its marker");
        } else {
            assert!(!message.is_kv_marker(), "{key}");
            assert_eq!(message.payload, entry.value, "{key}: the latest value");
        }
    }
    // The same reader serves request after request.
    let again = reader.last_of(&asked[..10]).await.expect("second batch");
    assert_eq!(again.len(), 10);
}

#[tokio::test]
async fn keys_without_values_give_an_empty_answer_and_too_many_are_refused() {
    let (_server, client, kv) = server_with_bucket("SPARSE").await;
    kv.put("other", "x".into()).await.expect("put");
    let mut reader = DirectBatch::new(client, &Names::kv_stream("SPARSE")).await.expect("reader");
    let asked = vec![Names::kv_subject("SPARSE", "a"), Names::kv_subject("SPARSE", "b")];
    assert!(reader.last_of(&asked).await.expect("answer").is_empty());
    assert!(reader.last_of(&[]).await.expect("nothing asked").is_empty());
    let too_many: Vec<String> =
        (0..=MAX_SUBJECTS).map(|n| Names::kv_subject("SPARSE", &n.to_string())).collect();
    assert!(
        matches!(reader.last_of(&too_many).await, Err(DirectBatchError::TooMany(n)) if n == MAX_SUBJECTS + 1)
    );
}

#[tokio::test]
async fn a_stream_that_is_not_there_is_an_error_at_once() {
    let server = NatsServer::start().await;
    let client = server.client().await;
    let mut reader = DirectBatch::new(client, "NO_SUCH_STREAM")
        .await
        .expect("reader")
        .with_timeout(Duration::from_secs(10));
    let started = std::time::Instant::now();
    let error = reader.last_of(&["a.b".to_string()]).await.expect_err("no stream answers");
    assert!(matches!(error, DirectBatchError::Status { code: 503, .. }), "{error}");
    assert!(started.elapsed() < Duration::from_secs(5), "no responders is immediate, not a timeout");
}

#[tokio::test]
async fn a_lazy_worker_reads_the_records_of_a_backlog_in_batches() {
    let server = NatsServer::start().await;
    let client = server.client().await;
    let js = jetstream::new(client.clone());
    let names = Names::default();
    let executed: Arc<Mutex<Vec<String>>> = Arc::default();
    let handlers = {
        let executed = executed.clone();
        Handlers::new().register("noop", move |run: RunContext| {
            executed.lock().unwrap().push(run.execution_id);
            async { Outcome::ok() }
        })
    };
    let mut config = config(&server, "w-batched");
    config.concurrency = 32;
    config.run_records = RunRecords::Lazy;
    let worker = App::worker(config, handlers).await;
    // Every direct get of the runs bucket, batched (body) or of one key (subject).
    let stream = Names::kv_stream(&names.runs_bucket());
    let (batched, single) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut requests = client.subscribe(format!("$JS.API.DIRECT.GET.{stream}.>")).await.expect("subscribe");
    let mut batches = client.subscribe(format!("$JS.API.DIRECT.GET.{stream}")).await.expect("subscribe");
    let counted = {
        let (batched, single) = (batched.clone(), single.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    Some(_) = batches.next() => batched.fetch_add(1, Ordering::Relaxed),
                    Some(_) = requests.next() => single.fetch_add(1, Ordering::Relaxed),
                    else => break,
                };
            }
        })
    };
    client.flush().await.expect("flush");

    let task = spec("wk", "backlog").handler("noop").task();
    let runs = 600;
    let mut acks = Vec::new();
    for n in 0..runs {
        acks.push(publish_dispatch(&js, &names, &task, n).await);
    }
    for ack in acks {
        ack.await.expect("stored");
    }
    eventually(WAIT, "every run acked", || async { dispatch_pending(&js).await == 0 }).await;
    let mut executed = executed.lock().unwrap().clone();
    executed.sort();
    executed.dedup();
    assert_eq!(executed.len(), runs as usize, "each run executed once");
    let (batched, single) = (batched.load(Ordering::Relaxed), single.load(Ordering::Relaxed));
    assert_eq!(single, 0, "no record read alone");
    assert!(batched < runs as usize / 2, "{batched} batched reads for {runs} runs");
    eprintln!("{runs} runs, {batched} batched record reads");
    // (after the counts: these reads are the test's own, one key each)
    for n in [0, runs / 2, runs - 1] {
        wait_run_status(&js, &names, &execution_of(&task, n), RunStatus::Succeeded, WAIT).await;
    }
    counted.abort();
    worker.stop().await;
}
