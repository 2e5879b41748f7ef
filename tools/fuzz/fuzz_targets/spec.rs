//! Fuzz target: any bytes through spec parsing and validation. A spec that parses must
//! round-trip through its canonical JSON, admit or refuse without panicking, and yield
//! strictly increasing fire times; and `parse` (with its typed fast path) must agree with the
//! reference reader on every input: the same spec, or the same list of problems.
#![no_main]

use chrono::{DateTime, Utc};
use jetsched_shared::spec::TaskSpec;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let parsed = TaskSpec::parse(data);
    let reference = TaskSpec::parse_reference(data);
    match (&parsed, &reference) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "fast path and reference build different specs"),
        // The whole list: every problem, in the same order.
        (Err(a), Err(b)) => assert_eq!(a, b, "fast path and reference report different errors"),
        _ => panic!("fast path and reference disagree: {parsed:?} vs {reference:?}"),
    }
    let Ok(spec) = parsed else { return };
    let canonical = serde_json::to_vec(&spec.to_json()).expect("a spec serializes");
    let again = TaskSpec::parse(&canonical).expect("the canonical form of a valid spec parses");
    assert_eq!(spec, again, "round trip through to_json");
    let now = DateTime::<Utc>::from_timestamp_millis(1_790_000_000_000).expect("fixed instant");
    if let Ok(admitted) = spec.admit(now) {
        let mut after = now;
        for _ in 0..4 {
            match admitted.schedule.next_after(after) {
                Some(next) => {
                    assert!(next > after, "next fire {next} not after {after}");
                    after = next;
                }
                None => break,
            }
        }
    }
});
