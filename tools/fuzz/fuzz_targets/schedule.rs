//! Fuzz target: cron expressions (any text) in real time zones at any instant. Parsing never
//! panics; a parsed schedule's next fire is strictly after the given instant and the sequence
//! of fires strictly increases.
#![no_main]

use arbitrary::Arbitrary;
use chrono::DateTime;
use jetsched_shared::schedule::CronSchedule;
use libfuzzer_sys::fuzz_target;

const ZONES: [&str; 8] = [
    "UTC",
    "America/New_York",
    "Europe/Berlin",
    "Australia/Lord_Howe",
    "Asia/Kolkata",
    "America/Sao_Paulo",
    "Pacific/Chatham",
    "Not/A_Zone",
];

#[derive(Debug, Arbitrary)]
struct Input {
    expression: String,
    zone: u8,
    /// Milliseconds around 1970..2100.
    after_ms: u32,
    scale: u8,
}

fuzz_target!(|input: Input| {
    let zone = ZONES[input.zone as usize % ZONES.len()];
    let Ok(cron) = CronSchedule::parse(&input.expression, zone) else { return };
    let after_ms = i64::from(input.after_ms) * (1 + i64::from(input.scale % 16));
    let Some(mut after) = DateTime::from_timestamp_millis(after_ms) else { return };
    for _ in 0..3 {
        match cron.next_after(after) {
            Some(next) => {
                assert!(next > after, "{} in {zone}: next {next} not after {after}", input.expression);
                after = next;
            }
            None => break,
        }
    }
});
