//! Human output: tables for lists, pretty JSON for single objects, and every line written to
//! standard output (a reader that went away, as `jetsched ls | head -1`, ends the command
//! quietly with exit 0, like other Unix tools).

use std::io::Write;

use serde_json::Value;

/// `println!` for the CLI's standard output: see [`line`].
macro_rules! outln {
    () => {
        $crate::output::line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::output::line(format_args!($($arg)*))
    };
}
pub(crate) use outln;

/// Writes one line to standard output. When the reader has gone (a broken pipe) nothing more
/// is worth printing: the process exits 0 at once, quietly; any other write error exits 2
/// saying so.
pub(crate) fn line(text: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(error) = out.write_fmt(text).and_then(|()| out.write_all(b"\n")) {
        if error.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: write to standard output: {error}");
        std::process::exit(2);
    }
}

/// Prints rows as a left-aligned table with a header.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let text: Vec<String> =
            cells.iter().enumerate().map(|(i, c)| format!("{c:<w$}", w = widths[i])).collect();
        outln!("{}", text.join("  ").trim_end());
    };
    line(header.iter().map(|h| h.to_string()).collect());
    for row in rows {
        line(row.clone());
    }
}

/// A one-line summary of a schedule object.
pub(crate) fn schedule(schedule: &Value) -> String {
    if let Some(cron) = schedule.get("cron").and_then(Value::as_str) {
        let tz = schedule.get("timezone").and_then(Value::as_str).unwrap_or("UTC");
        format!("cron {cron} ({tz})")
    } else if let Some(every) = schedule.get("every").and_then(Value::as_str) {
        format!("every {every}")
    } else if let Some(at) = schedule.get("at").and_then(Value::as_str) {
        format!("at {at}")
    } else {
        schedule.to_string()
    }
}

pub(crate) fn pretty(value: &Value) {
    outln!("{}", serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string()));
}

/// `1 dead letter`, `3 dead letters`.
pub(crate) fn count(n: u64, singular: &str, plural: &str) -> String {
    format!("{n} {}", if n == 1 { singular } else { plural })
}

/// The plural of a role name: `registry` -> `registries`, `worker` -> `workers`.
pub(crate) fn plural(noun: &str) -> String {
    match noun.strip_suffix('y') {
        Some(stem) if !stem.ends_with(['a', 'e', 'i', 'o', 'u']) => format!("{stem}ies"),
        _ => format!("{noun}s"),
    }
}

/// The reply as JSON, or `message`.
pub(crate) fn done(json_out: bool, value: &Value, message: &str) {
    if json_out { pretty(value) } else { outln!("{message}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plurals_of_role_names_and_counts() {
        let roles: Vec<String> = ["registry", "scheduler", "worker", "alerter", "key"].map(plural).into();
        assert_eq!(roles, ["registries", "schedulers", "workers", "alerters", "keys"]);
        assert_eq!(count(1, "dead letter", "dead letters"), "1 dead letter");
        assert_eq!(count(0, "dead letter", "dead letters"), "0 dead letters");
    }
}
