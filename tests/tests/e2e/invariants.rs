//! The README's invariants as checks over the source tree: each test fails naming every file
//! and line that breaks its rule.
//!
//! "Test code" below is a file named `tests.rs`, a file under a `tests/` or `benches/`
//! directory, or an item marked `#[cfg(test)]` (skipped up to its closing brace).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The service crates: each may use `shared`, none may use another.
const SERVICES: [&str; 5] = ["alerter", "cli", "registry", "scheduler", "worker"];

/// Longest source file allowed under `services/` and `shared/src`, test code aside.
const MAX_LINES: usize = 600;

/// String literals that spell a subject, stream or bucket name.
const NAME_LITERALS: [&str; 3] = ["\"jetsched.", "\"JETSCHED_", "\"$JS."];

/// Calls that read the clock.
const CLOCK_READS: [&str; 4] = ["Utc::now", "Local::now", "Instant::now", "SystemTime::now"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repository root").to_path_buf()
}

/// Every `.rs` file under `dir` (relative to the repository), build output and hidden
/// directories aside, sorted.
fn rust_files(dir: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if name != "target" && !name.starts_with('.') {
                    walk(&path, out);
                }
            } else if name.ends_with(".rs") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&repo().join(dir), &mut out);
    out.sort();
    out
}

fn relative(path: &Path) -> String {
    path.strip_prefix(repo()).unwrap_or(path).display().to_string()
}

fn is_test_file(path: &Path) -> bool {
    path.file_name().is_some_and(|name| name == "tests.rs")
        || path.components().any(|c| c.as_os_str() == "tests" || c.as_os_str() == "benches")
}

/// The lines of `text` that are not test code, with their 1-based numbers.
fn non_test_lines(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((index, line)) = lines.next() {
        if line.trim() != "#[cfg(test)]" {
            out.push((index + 1, line));
            continue;
        }
        // Skip the item the attribute marks: one line ending in `;`, or up to its closing brace.
        let mut depth = 0i64;
        let mut opened = false;
        for (_, item) in lines.by_ref() {
            depth += item.matches('{').count() as i64 - item.matches('}').count() as i64;
            opened |= item.contains('{');
            if (opened && depth <= 0) || (!opened && item.trim_end().ends_with(';')) {
                break;
            }
        }
    }
    out
}

fn is_comment(line: &str) -> bool {
    line.trim_start().starts_with("//")
}

/// Asserts no violation was found, listing them all.
fn assert_none(rule: &str, violations: &[String]) {
    let mut report = String::new();
    for violation in violations {
        let _ = writeln!(report, "  {violation}");
    }
    assert!(violations.is_empty(), "{rule}: {} violation(s)\n{report}", violations.len());
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The lines of non-test code in `text` spelling a name literal.
fn name_literals(text: &str) -> Vec<(usize, &str)> {
    let mut found = Vec::new();
    for (number, line) in non_test_lines(text) {
        if is_comment(line) {
            continue;
        }
        let spelled = NAME_LITERALS.iter().any(|literal| {
            // Environment variable names (`env = "JETSCHED_..."`) are not topology names.
            line.match_indices(literal).any(|(at, _)| !line[..at].trim_end().ends_with("env ="))
        });
        if spelled {
            found.push((number, line));
        }
    }
    found
}

/// The lines of non-test code in `text` reading the clock.
fn clock_reads(text: &str) -> Vec<(usize, &str)> {
    non_test_lines(text)
        .into_iter()
        .filter(|(_, line)| !is_comment(line) && CLOCK_READS.iter().any(|call| line.contains(call)))
        .collect()
}

/// `path:line: text` of every line `find` reports in the files that are not test files.
fn lines_found(
    files: impl Iterator<Item = PathBuf>,
    find: impl for<'a> Fn(&'a str) -> Vec<(usize, &'a str)>,
) -> Vec<String> {
    let mut violations = Vec::new();
    for path in files.filter(|p| !is_test_file(p)) {
        for (number, line) in find(&read(&path)) {
            violations.push(format!("{}:{number}: {}", relative(&path), line.trim()));
        }
    }
    violations
}

#[test]
fn no_subject_stream_or_bucket_literal_outside_shared_names() {
    let files = rust_files("services").into_iter().chain(rust_files("shared/src"));
    let files = files.filter(|p| !p.ends_with("shared/src/names.rs"));
    let violations = lines_found(files, name_literals);
    assert_none("names are spelled only in shared/src/names.rs", &violations);
}

#[test]
fn services_never_import_each_other() {
    let mut violations = Vec::new();
    for service in SERVICES {
        let others: Vec<&str> = SERVICES.iter().copied().filter(|other| *other != service).collect();
        let manifest = repo().join("services").join(service).join("Cargo.toml");
        for (number, line) in read(&manifest).lines().enumerate() {
            for other in &others {
                if line.contains(&format!("jetsched-{other}")) || line.contains(&format!("services/{other}"))
                {
                    violations.push(format!("{}:{}: {}", relative(&manifest), number + 1, line.trim()));
                }
            }
        }
        for path in rust_files(&format!("services/{service}")) {
            for (number, line) in read(&path).lines().enumerate() {
                for other in &others {
                    // A path into the crate (metric names such as `jetsched_worker_...` are fine).
                    let path_into = format!("jetsched_{other}::");
                    if line.contains(&path_into) || line.contains(&format!("use jetsched_{other}")) {
                        violations.push(format!("{}:{}: {}", relative(&path), number + 1, line.trim()));
                    }
                }
            }
        }
    }
    assert_none("a service depends on shared only, never on another service", &violations);
}

#[test]
fn nothing_reads_the_clock_inside_spec_schedule_or_the_timing_wheel() {
    let pure = |path: &Path| {
        let rel = relative(path);
        ["shared/src/spec", "shared/src/schedule", "services/scheduler/src/timer"]
            .iter()
            .any(|prefix| rel.strip_prefix(prefix).is_some_and(|rest| rest.starts_with(['.', '/'])))
    };
    let files = rust_files("shared/src").into_iter().chain(rust_files("services/scheduler/src"));
    let violations = lines_found(files.filter(|p| pure(p)), clock_reads);
    assert_none("time is a parameter of spec, schedule and the timing wheel", &violations);
}

#[test]
fn every_rust_file_starts_with_a_doc_line_saying_what_it_is_for() {
    let mut violations = Vec::new();
    for dir in ["services", "shared", "tests", "tools"] {
        for path in rust_files(dir) {
            let text = read(&path);
            let first = text.lines().next().unwrap_or_default();
            if !first.starts_with("//!") {
                violations.push(format!("{}:1: {first}", relative(&path)));
            }
        }
    }
    assert_none("every .rs file starts with a `//!` line", &violations);
}

#[test]
fn no_source_file_is_over_600_lines_tests_aside() {
    let mut violations = Vec::new();
    let files = rust_files("services").into_iter().chain(rust_files("shared/src"));
    for path in files.filter(|p| !is_test_file(p)) {
        let text = read(&path);
        let lines = non_test_lines(&text).len();
        if lines > MAX_LINES {
            violations.push(format!("{}:{}: {lines} lines besides tests", relative(&path), MAX_LINES + 1));
        }
    }
    assert_none("source files stay under 600 lines", &violations);
}

#[test]
fn the_test_code_filter_skips_cfg_test_items_only() {
    let text = "fn a() {}\n#[cfg(test)]\nmod tests;\nfn b() {}\n#[cfg(test)]\nmod more {\n    fn c() {\n    }\n}\nfn d() {}\n";
    let kept: Vec<usize> = non_test_lines(text).into_iter().map(|(number, _)| number).collect();
    assert_eq!(kept, [1, 4, 10]);
}

#[test]
fn the_checks_find_what_they_look_for() {
    let source = concat!(
        "let a = \"jetsched.dispatch.default\";\n",
        "#[arg(long, env = \"JETSCHED_PREFIX\")]\n",
        "let b = format!(\"JETSCHED_{x}\");\n",
        "// \"jetsched.in.a.comment\"\n",
        "let now = chrono::Utc::now();\n",
        "#[cfg(test)]\n",
        "mod tests { const S: &str = \"$JS.API\"; fn t() { Instant::now(); } }\n",
    );
    let names: Vec<usize> = name_literals(source).into_iter().map(|(number, _)| number).collect();
    assert_eq!(names, [1, 3]);
    let clock: Vec<usize> = clock_reads(source).into_iter().map(|(number, _)| number).collect();
    assert_eq!(clock, [5]);
}
