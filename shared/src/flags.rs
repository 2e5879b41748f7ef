//! Parsers of command-line values that the settings of every binary share.

use std::time::Duration;

/// Parses a human duration (`90s`, `5m`, `1h 30m`, `0s`) for clap. Only the syntax is
/// checked here; whether a setting may be zero is a rule of its validation.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("{text:?} is not a duration ({e}); use e.g. 90s, 5m, 1h"))
}
