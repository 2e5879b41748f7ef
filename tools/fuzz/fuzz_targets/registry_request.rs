//! Fuzz target: the registry's request decoder, for every endpoint, with any body and any
//! compare-and-set headers. It must answer with a request or a structured error, never panic.
#![no_main]

use arbitrary::Arbitrary;
use async_nats::HeaderMap;
use chrono::DateTime;
use jetsched_registry::codec::{Limits, TaskEndpoint, decode_request};
use jetsched_shared::wire::{HDR_CREATE_ONLY, HDR_EXPECTED_REVISION};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Input {
    endpoint: u8,
    payload: Vec<u8>,
    expected_revision: Option<String>,
    create_only: Option<String>,
}

fuzz_target!(|input: Input| {
    let endpoint = TaskEndpoint::ALL[input.endpoint as usize % TaskEndpoint::ALL.len()];
    let mut headers = HeaderMap::new();
    // Header values cannot hold line breaks on the wire; skip those inputs.
    for (name, value) in
        [(HDR_EXPECTED_REVISION, &input.expected_revision), (HDR_CREATE_ONLY, &input.create_only)]
    {
        if let Some(value) = value {
            if value.contains(['\r', '\n']) {
                return;
            }
            headers.insert(name, value.as_str());
        }
    }
    let now = DateTime::from_timestamp_millis(1_790_000_000_000).expect("fixed instant");
    let limits = Limits { max_spec_bytes: 64 * 1024 };
    if let Err(failure) = decode_request(endpoint, &input.payload, Some(&headers), limits, now) {
        assert!(
            failure.wire().as_slice().iter().all(|e| !e.message.is_empty()),
            "an error always says what is wrong"
        );
    }
});
