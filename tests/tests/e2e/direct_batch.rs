//! End-to-end tests of batched direct gets (`multi_last`) against a real nats-server: the
//! latest value of many KV keys in one request, markers and missing keys told apart, an empty
//! answer, and a refused request as an error.

use std::time::Duration;

use async_nats::jetstream;
use jetsched_shared::direct_batch::{DirectBatch, DirectBatchError, MAX_SUBJECTS};
use jetsched_shared::names::Names;
use jetsched_tests::{NatsServer, init_test_logging};

async fn bucket(js: &jetstream::Context, name: &str) -> jetstream::kv::Store {
    js.create_key_value(jetstream::kv::Config { bucket: name.to_string(), history: 1, ..Default::default() })
        .await
        .expect("bucket")
}

#[tokio::test]
async fn one_request_reads_the_latest_value_of_many_keys() {
    init_test_logging();
    let server = NatsServer::start().await;
    let client = server.client().await;
    let js = jetstream::new(client.clone());
    let kv = bucket(&js, "BATCHED").await;
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
    init_test_logging();
    let server = NatsServer::start().await;
    let client = server.client().await;
    let js = jetstream::new(client.clone());
    let kv = bucket(&js, "SPARSE").await;
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
    init_test_logging();
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
