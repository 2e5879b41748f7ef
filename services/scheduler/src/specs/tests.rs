//! Spec text kept compactly: every document comes back byte for byte, shapes are shared, and
//! the table's bounds keep further documents whole.

use proptest::prelude::*;

use super::*;

fn round_trip(specs: &Specs, doc: &[u8], task_id: &str) -> (u32, usize) {
    let doc = std::str::from_utf8(doc).expect("UTF-8");
    let mut scratch = Scratch::default();
    let (shape, bytes) = specs.encode(doc, task_id, &mut scratch);
    let kept = bytes.len();
    let bytes = bytes.to_owned();
    let mut out = b"prefix".to_vec();
    specs.decode_into(shape, &bytes, task_id, &mut out);
    assert_eq!(String::from_utf8_lossy(&out[6..]), doc, "rebuilt document differs (shape {shape})");
    (shape, kept)
}

#[test]
fn documents_come_back_byte_for_byte() {
    let specs = Specs::default();
    let docs: &[&str] = &[
        r#"{"executor":{"kind":"nats","subject":"bench.run"},"id":"t1","misfire":"fire_all","namespace":"bench","schedule":{"anchor":"1970-01-01T00:00:00.000Z","every":"1h"}}"#,
        r#"{ "id" : "a-b_c" ,"namespace":"ns",
            "schedule": {"cron": "0 30 2 * * *", "timezone": "Asia/Shanghai"},
            "executor": {"kind": "http", "method": "POST", "url": "http://reports.internal/run", "body": {"day": "yesterday", "n": [1, -2.5e3, 0, true, null, "x\"y\\\\"]}},
            "retry": {"max_attempts": 4, "initial": "1s", "multiplier": 2.0, "jitter": 0.3},
            "labels": {"team": "billing", "": ""}, "paused": false}"#,
        r#"{"id":"e","schedule":{"every":"1s"},"executor":{"kind":"nats","subject":"s","payload":"\u00e9\u2028 \"q\" \\"},"labels":{"k:":"v:","x":":"}}"#,
        r#"{"id":"u","schedule":{"at":"2030-01-01T00:00:00Z"},"executor":{"kind":"nats","subject":"s","payload":{"":[[],{},[[""]],""]}}}"#,
        "{\"id\":\"ws\",\t\"schedule\" :\r\n{\"after\":\"5m\"}\n,\"executor\":{\"kind\":\"handler\",\"name\":\"h\"}}  ",
        "{\"id\":\"é\",\"n\":1e-7,\"m\":-0,\"o\":123456789012345678901234567890}",
        "[]",
        "",
        "\"",
        "{\"unterminated\":\"abc",
    ];
    for doc in docs {
        round_trip(&specs, doc.as_bytes(), "t1");
    }
}

#[test]
fn tasks_of_one_shape_keep_only_what_differs() {
    let specs = Specs::default();
    let doc = |i: usize| {
        format!(
            r#"{{"executor":{{"kind":"nats","subject":"bench.run"}},"id":"t{i}","misfire":"fire_all","namespace":"bench","schedule":{{"anchor":"1970-01-01T00:{:02}:00.000Z","every":"1h"}}}}"#,
            i % 60
        )
    };
    let (first, kept) = round_trip(&specs, doc(0).as_bytes(), "t0");
    assert_eq!(kept, 7, "the template keeps one code per value");
    for i in 1..1000 {
        let (shape, kept) = round_trip(&specs, doc(i).as_bytes(), &format!("t{i}"));
        assert_eq!(shape, first);
        // Six codes, the anchor's length code and the anchor itself (the id is the task's).
        assert!(kept <= 7 + 24, "{kept} bytes kept for task {i}");
    }
    assert_eq!(specs.shapes(), 1);
    // Another structure is another shape; a different number is not.
    let (other, _) = round_trip(&specs, br#"{"id":"x","retry":{"max_attempts":4}}"#, "x");
    let (same, kept) = round_trip(&specs, br#"{"id":"y","retry":{"max_attempts":17}}"#, "y");
    assert_ne!(other, first);
    assert_eq!(same, other);
    assert_eq!(kept, 1 + 1 + 2, "the id's code, the number's length code and its two digits");
}

#[test]
fn past_the_table_bounds_documents_are_kept_whole() {
    let specs = Specs::default();
    for i in 0..MAX_SHAPES {
        let doc = format!(r#"{{"k{i}":1}}"#);
        let (shape, _) = round_trip(&specs, doc.as_bytes(), "x");
        assert_eq!(shape as usize, i);
    }
    let doc = br#"{"another":1}"#;
    let (shape, kept) = round_trip(&specs, doc, "x");
    assert_eq!((shape, kept), (WHOLE, doc.len()));
    // Known shapes are still shared.
    let (shape, _) = round_trip(&specs, br#"{"k7":2}"#, "x");
    assert_eq!(shape, 7);
    assert_eq!(specs.shapes(), MAX_SHAPES);
}

#[test]
fn long_values_take_several_length_bytes() {
    let specs = Specs::default();
    round_trip(&specs, br#"{"payload":"a"}"#, "x");
    let long = format!(r#"{{"payload":"{}"}}"#, "z".repeat(100_000));
    let (shape, kept) = round_trip(&specs, long.as_bytes(), "x");
    assert_eq!(shape, 0);
    assert_eq!(kept, 100_000 + 3);
}

fn json() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(serde_json::Value::from),
        ".{0,12}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
            prop::collection::btree_map(".{0,6}", inner, 0..6)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn any_json_text_comes_back_byte_for_byte(value in json(), pretty in any::<bool>(), id in "[a-z0-9]{1,4}") {
        let specs = Specs::default();
        let text = if pretty {
            serde_json::to_vec_pretty(&value).expect("serializes")
        } else {
            serde_json::to_vec(&value).expect("serializes")
        };
        // Twice: as the template of its shape, then against it.
        round_trip(&specs, &text, &id);
        round_trip(&specs, &text, &id);
    }
}
