//! The README's invariants as checks over the source tree: each test fails naming every file
//! and line that breaks its rule.
//!
//! "Test code" below is a file named `tests.rs`, a file under a `tests/` or `benches/`
//! directory, or an item marked `#[cfg(test)]` (skipped up to its closing brace).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Longest source file allowed under `services/` and `shared/src`, test code aside.
const MAX_LINES: usize = 500;

/// String literals that spell a subject, stream or bucket name.
const NAME_LITERALS: [&str; 3] = ["\"jetsched.", "\"JETSCHED_", "\"$JS."];

/// Calls that read the clock.
const CLOCK_READS: [&str; 4] = ["Utc::now", "Local::now", "Instant::now", "SystemTime::now"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repository root").to_path_buf()
}

/// The service crates, one per directory under `services/` (a new one is covered as soon as it
/// exists): each may use `shared`, none may use another.
fn services() -> Vec<String> {
    let entries = std::fs::read_dir(repo().join("services")).expect("read services/");
    let mut services: Vec<String> = entries
        .flatten()
        .filter(|entry| entry.path().join("Cargo.toml").is_file())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    services.sort();
    services
}

/// Every `.rs` file under `dir` (relative to the repository), build output and hidden
/// directories aside, sorted.
fn rust_files(dir: &str) -> Vec<PathBuf> {
    crate::docs::files_under(&repo().join(dir), ".rs")
}

fn relative(path: &Path) -> String {
    path.strip_prefix(repo()).unwrap_or(path).display().to_string()
}

/// Whether `path` is test code: judged below the repository, so a checkout that sits in a
/// directory named `tests` is no reason.
fn is_test_file(path: &Path) -> bool {
    let root = repo();
    let path = path.strip_prefix(&root).unwrap_or(path);
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
    let services = services();
    assert!(services.len() >= 6, "every service crate, the console included: {services:?}");
    let mut violations = Vec::new();
    for service in &services {
        let others: Vec<&String> = services.iter().filter(|other| *other != service).collect();
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
fn no_source_file_is_over_500_lines_tests_aside() {
    let mut violations = Vec::new();
    let files = rust_files("services").into_iter().chain(rust_files("shared/src"));
    for path in files.filter(|p| !is_test_file(p)) {
        let text = read(&path);
        let lines = non_test_lines(&text).len();
        if lines > MAX_LINES {
            violations.push(format!("{}:{}: {lines} lines besides tests", relative(&path), MAX_LINES + 1));
        }
    }
    assert_none(&format!("source files stay under {MAX_LINES} lines"), &violations);
}

/// A crate's modules and what each uses: `src/a.rs` (or `src/a/mod.rs`) is module `a`,
/// `src/a/b.rs` is `a/b`. The crate root (`lib.rs`, `main.rs`) is left out: it is the crate's
/// facade, and its re-exports are no module's dependency.
#[derive(Default)]
struct Modules {
    /// Each module's file, relative to the repository.
    files: BTreeMap<String, String>,
    /// For each module, the modules it uses, each with the first line that does.
    uses: BTreeMap<String, BTreeMap<String, usize>>,
}

/// The module a file under `src` is, if it is not the crate root (or a binary of its own).
fn module_name(src: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src).ok()?.with_extension("");
    let mut parts: Vec<String> =
        relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    if parts.last().is_some_and(|last| last == "mod") {
        parts.pop();
    }
    let root = parts.is_empty() || parts == ["lib"] || parts == ["main"] || parts[0] == "bin";
    (!root).then(|| parts.join("/"))
}

/// Every `a::b::c` path in `code` (identifiers joined by `::`, a `use` group such as
/// `crate::{a::X, b::{c, d}}` expanded), with the byte offset where it starts.
fn paths_in(code: &str) -> Vec<(usize, Vec<String>)> {
    fn ident_at(code: &[u8], at: usize) -> usize {
        let mut end = at;
        while end < code.len() && (code[end].is_ascii_alphanumeric() || code[end] == b'_') {
            end += 1;
        }
        end
    }
    /// The paths of a `use` tree starting at `at` under `prefix`; returns where the tree ends.
    fn tree(
        code: &[u8],
        mut at: usize,
        prefix: &mut Vec<String>,
        start: usize,
        out: &mut Vec<(usize, Vec<String>)>,
    ) -> usize {
        let depth = prefix.len();
        loop {
            while at < code.len() && code[at].is_ascii_whitespace() {
                at += 1;
            }
            if at < code.len() && code[at] == b'{' {
                at += 1;
                loop {
                    at = tree(code, at, prefix, start, out);
                    while at < code.len() && code[at].is_ascii_whitespace() {
                        at += 1;
                    }
                    match code.get(at) {
                        Some(b',') => at += 1,
                        Some(b'}') => {
                            at += 1;
                            break;
                        }
                        _ => break,
                    }
                    while at < code.len() && code[at].is_ascii_whitespace() {
                        at += 1;
                    }
                    if code.get(at) == Some(&b'}') {
                        at += 1;
                        break;
                    }
                }
                break;
            }
            let end = ident_at(code, at);
            if end == at {
                break;
            }
            prefix.push(String::from_utf8_lossy(&code[at..end]).into_owned());
            at = end;
            if code[at..].starts_with(b"::") {
                at += 2;
                continue;
            }
            out.push((start, prefix.clone()));
            break;
        }
        prefix.truncate(depth);
        at
    }
    let bytes = code.as_bytes();
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let boundary = at == 0
            || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_' || bytes[at - 1] == b':');
        let end = ident_at(bytes, at);
        if !boundary || end == at {
            at += 1;
            continue;
        }
        if &code[at..end] == "use" && bytes.get(end).is_some_and(u8::is_ascii_whitespace) {
            at = tree(bytes, end, &mut Vec::new(), at, &mut out);
            continue;
        }
        if bytes[end..].starts_with(b"::") {
            let start = at;
            let mut path = Vec::new();
            let mut cursor = at;
            loop {
                let end = ident_at(bytes, cursor);
                if end == cursor {
                    break;
                }
                path.push(code[cursor..end].to_owned());
                cursor = end;
                if !bytes[cursor..].starts_with(b"::") {
                    break;
                }
                cursor += 2;
            }
            if path.len() > 1 {
                out.push((start, path));
            }
            at = cursor.max(at + 1);
            continue;
        }
        at = end;
    }
    out
}

/// The module `path` (used in `module`, which declares the child modules `children`) points
/// into: `crate::`, `super::`, `self::` or a child's name, then the longest prefix that is a
/// module. `None` for a path outside the crate's modules (another crate, a root item).
fn resolve(
    module: &str,
    children: &BTreeSet<String>,
    path: &[String],
    modules: &BTreeSet<String>,
) -> Option<String> {
    let mut segments: Vec<&str> = module.split('/').collect();
    let mut rest = path.iter().map(String::as_str).peekable();
    match rest.peek().copied() {
        Some("crate") => {
            segments.clear();
            rest.next();
        }
        Some("self") => {
            rest.next();
        }
        Some("super") => {
            while rest.peek() == Some(&"super") {
                segments.pop();
                rest.next();
            }
        }
        Some(first) if children.contains(first) => {}
        _ => return None,
    }
    segments.extend(rest);
    (1..=segments.len()).rev().map(|n| segments[..n].join("/")).find(|candidate| modules.contains(candidate))
}

/// The module graph of the crate whose sources are `src` (each file given with its text).
fn module_graph(src: &Path, files: &[(PathBuf, String)]) -> Modules {
    let mut graph = Modules::default();
    let named: Vec<(String, &PathBuf, &String)> = files
        .iter()
        .filter(|(path, _)| !is_test_file(path.strip_prefix(src).unwrap_or(path)))
        .filter_map(|(path, text)| module_name(src, path).map(|name| (name, path, text)))
        .collect();
    let modules: BTreeSet<String> = named.iter().map(|(name, _, _)| name.clone()).collect();
    for (module, path, text) in named {
        graph.files.insert(module.clone(), relative(path));
        let lines = non_test_lines(text);
        // The code as one string, comments out, with where each line starts.
        let mut code = String::new();
        let mut starts = Vec::new();
        for (number, line) in &lines {
            starts.push((code.len(), *number));
            if !is_comment(line) {
                code.push_str(line);
            }
            code.push('\n');
        }
        let children: BTreeSet<String> = lines
            .iter()
            .filter_map(|(_, line)| {
                let line = line.trim();
                let declared = line.strip_prefix("pub ").or(line.strip_prefix("pub(crate) ")).unwrap_or(line);
                declared.strip_prefix("mod ")?.strip_suffix(';').map(str::to_owned)
            })
            .collect();
        let uses = graph.uses.entry(module.clone()).or_default();
        for (offset, path) in paths_in(&code) {
            let Some(target) = resolve(&module, &children, &path, &modules) else { continue };
            if target != module {
                let line = starts.iter().rev().find(|(start, _)| *start <= offset).map_or(0, |(_, n)| *n);
                uses.entry(target).or_insert(line);
            }
        }
    }
    graph
}

/// Every circle of `graph`: each set of two or more modules that reach one another, with the
/// uses that close it (`file:line: a uses b`).
fn circles(graph: &Modules) -> Vec<Vec<String>> {
    let reach = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_owned()];
        while let Some(module) = todo.pop() {
            for next in graph.uses.get(&module).into_iter().flat_map(|uses| uses.keys()) {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> =
        graph.files.keys().map(|module| (module, reach(module))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for (module, from_here) in &reached {
        if done.contains(*module) {
            continue;
        }
        let circle: BTreeSet<&String> = from_here
            .iter()
            .filter(|other| reached.get(other).is_some_and(|back| back.contains(*module)))
            .collect();
        if circle.is_empty() {
            continue;
        }
        let mut lines = Vec::new();
        for member in &circle {
            done.insert((*member).clone());
            for (used, line) in &graph.uses[*member] {
                if circle.contains(used) {
                    lines.push(format!("{}:{line}: {member} uses {used}", graph.files[*member]));
                }
            }
        }
        out.push(lines);
    }
    out
}

/// The `.rs` files of a crate's `src/` with their text.
fn sources(src: &Path) -> Vec<(PathBuf, String)> {
    rust_files(&relative(src)).into_iter().map(|path| (path.clone(), read(&path))).collect()
}

#[test]
fn no_service_crate_has_an_import_circle_among_its_modules() {
    let mut violations = Vec::new();
    for service in services() {
        let src = repo().join("services").join(&service).join("src");
        for circle in circles(&module_graph(&src, &sources(&src))) {
            violations.push(format!("circle in {service}:\n    {}", circle.join("\n    ")));
        }
    }
    assert_none("the modules of a service crate use one another without a circle", &violations);
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
