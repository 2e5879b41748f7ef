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

/// The width a table meant for a terminal keeps within.
pub(crate) const MAX_WIDTH: usize = 100;

/// How a column of a [`fitted_table`] behaves when the table is too wide.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Column {
    /// Always as wide as its widest cell.
    Fixed,
    /// Gives way down to this many characters; longer cells are cut with `…`.
    Shrinks(usize),
}

/// The widths of `header`'s columns over `rows` within `max` characters (two between columns):
/// the widest shrinkable column gives way first, one character at a time, down to its minimum.
pub(crate) fn fit(header: &[&str], columns: &[Column], rows: &[Vec<String>], max: usize) -> Vec<usize> {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut total = widths.iter().sum::<usize>() + 2 * widths.len().saturating_sub(1);
    while total > max {
        let spare = |i: usize| match columns.get(i) {
            Some(Column::Shrinks(min)) => widths[i].saturating_sub(*min),
            _ => 0,
        };
        let Some(widest) = (0..widths.len()).filter(|&i| spare(i) > 0).max_by_key(|&i| (spare(i), i)) else {
            break;
        };
        widths[widest] -= 1;
        total -= 1;
    }
    widths
}

/// `text` in at most `width` characters: cut with `…` when longer.
pub(crate) fn cut(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    let mut out: String = text.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// Like [`table`], within `max` characters as [`fit`] decides.
pub(crate) fn fitted_table(header: &[&str], columns: &[Column], rows: &[Vec<String>], max: usize) {
    let widths = fit(header, columns, rows, max);
    let line = |cells: Vec<String>| {
        let text: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{:<w$}", cut(c, widths[i]), w = widths[i]))
            .collect();
        outln!("{}", text.join("  ").trim_end());
    };
    line(header.iter().map(|h| h.to_string()).collect());
    for row in rows {
        line(row.clone());
    }
}

/// A duration in milliseconds, compact: `12ms`, `4.2s`, `3m05s`, `2h10m`, `3d4h`.
pub(crate) fn short_duration(ms: i64) -> String {
    let sign = if ms < 0 { "-" } else { "" };
    let ms = ms.unsigned_abs();
    let s = ms / 1000;
    let text = match ms {
        0..1000 => format!("{ms}ms"),
        1000..60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{}m{:02}s", s / 60, s % 60),
        3_600_000..86_400_000 => format!("{}h{:02}m", s / 3600, s / 60 % 60),
        _ => format!("{}d{}h", s / 86_400, s / 3600 % 24),
    };
    format!("{sign}{text}")
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

    #[test]
    fn durations_read_compactly() {
        let shown: Vec<String> = [12, 4_200, 185_000, 7_800_000, 273_600_000, -40].map(short_duration).into();
        assert_eq!(shown, ["12ms", "4.2s", "3m05s", "2h10m", "3d4h", "-40ms"]);
    }

    /// The widest shrinkable column gives way first; fixed ones never do.
    #[test]
    fn a_fitted_table_keeps_within_its_width() {
        let rows = vec![vec!["a".repeat(30), "b".repeat(60), "c".repeat(40)]];
        let columns = [Column::Fixed, Column::Shrinks(10), Column::Shrinks(10)];
        let widths = fit(&["A", "B", "C"], &columns, &rows, 100);
        assert_eq!(widths.iter().sum::<usize>() + 4, 100);
        assert_eq!(widths[0], 30);
        assert_eq!(cut("abcdef", 4), "abc…");
        assert_eq!(cut("abc", 4), "abc");
    }
}
