//! The documentation is true. deploy/CONFIGURATION.md is the `--help` of every binary, as
//! `tools/config-reference.sh` writes it; every link in README.md and the other Markdown pages
//! leads to a file (and heading) that exists; every command the README shows is run by a test:
//! the quickstart's `jetsched` and `nats` lines and its URLs against `deploy/local.sh` itself
//! (`run_readme_quickstart`, called by the `local` test while the script runs), the others here.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use jetsched_tests::workspace_bin;

use crate::console::browser::http_request;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repository root").to_path_buf()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

#[test]
fn configuration_reference_matches_every_binarys_help() {
    let repo = repo();
    let bin_dir = workspace_bin("jetsched").parent().expect("binary dir").to_path_buf();
    let out = tempfile::NamedTempFile::new().expect("temp file");
    let status = Command::new("bash")
        .arg(repo.join("tools/config-reference.sh"))
        .arg(&bin_dir)
        .arg(out.path())
        .status()
        .expect("run tools/config-reference.sh");
    assert!(status.success(), "tools/config-reference.sh failed");
    let generated = std::fs::read_to_string(out.path()).expect("generated reference");
    let committed = std::fs::read_to_string(repo.join("deploy/CONFIGURATION.md")).unwrap_or_default();
    assert!(
        generated == committed,
        "deploy/CONFIGURATION.md is out of date: run `bash tools/config-reference.sh` and commit it"
    );
}

// ---------------------------------------------------------------------------------------------
// Links

/// Every file under `dir` whose name ends with `suffix`, build output and hidden directories
/// aside, sorted.
pub(crate) fn files_under(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, suffix: &str, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if name != "target" && !name.starts_with('.') {
                    walk(&path, suffix, out);
                }
            } else if name.ends_with(suffix) {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, suffix, &mut out);
    out.sort();
    out
}

/// The Markdown pages whose links are checked: the README, `docs/`, and every page under
/// `deploy/` and `tools/`.
fn markdown_pages() -> Vec<PathBuf> {
    let repo = repo();
    let mut pages = vec![repo.join("README.md")];
    for dir in ["docs", "deploy", "tools"] {
        pages.extend(files_under(&repo.join(dir), ".md"));
    }
    pages
}

/// The targets of the inline links `[text](target)` of a Markdown text, code spans and fenced
/// blocks aside.
fn link_targets(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Code spans may hold `](` (a shell `$(...)`, an index); drop them first.
        let mut plain = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                plain.push_str(part);
            }
        }
        let mut rest = plain.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or_default();
            out.push((n + 1, target.to_string()));
            rest = &after[end..];
        }
    }
    out
}

/// GitHub's anchors of a Markdown page's headings: lower case, punctuation dropped, spaces as
/// hyphens, a repeated heading numbered `-1`, `-2`, ...
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let Some(heading) = line.strip_prefix('#') else { continue };
        if fenced || !(heading.starts_with('#') || heading.starts_with(' ')) {
            continue;
        }
        let title = heading.trim_start_matches('#').trim();
        let slug: String = title
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                '-' | '_' => Some(c),
                c if c.is_alphanumeric() => Some(c.to_ascii_lowercase()),
                _ => None,
            })
            .collect();
        let mut unique = slug.clone();
        let mut n = 0;
        while seen.contains(&unique) {
            n += 1;
            unique = format!("{slug}-{n}");
        }
        seen.insert(unique);
    }
    seen
}

/// What is wrong with one link of `page`, if anything.
fn broken_link(page: &Path, target: &str) -> Option<String> {
    if target.starts_with("http://") || target.starts_with("https://") || target.starts_with("mailto:") {
        return Some("a link out of the repository (no test can open it here)".into());
    }
    let (file, anchor) = match target.split_once('#') {
        Some((file, anchor)) => (file, Some(anchor)),
        None => (target, None),
    };
    let path = if file.is_empty() { page.to_path_buf() } else { page.parent().expect("page dir").join(file) };
    if !path.exists() {
        return Some(format!("{} does not exist", path.display()));
    }
    let anchor = anchor?;
    if path.extension().is_some_and(|e| e == "md") && !anchors(&read(&path)).contains(anchor) {
        return Some(format!("no heading of {} has the anchor #{anchor}", path.display()));
    }
    None
}

#[test]
fn every_link_of_the_readme_and_docs_leads_somewhere() {
    let repo = repo();
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in markdown_pages() {
        for (line, target) in link_targets(&read(&page)) {
            checked += 1;
            if let Some(why) = broken_link(&page, &target) {
                let page = page.strip_prefix(&repo).unwrap_or(&page).display().to_string();
                broken.push(format!("{page}:{line}: ({target}) {why}"));
            }
        }
    }
    assert!(checked > 100, "the link reader found only {checked} links: it is broken");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_link_checks_find_what_they_look_for() {
    let text = "# Title\n## A heading, with `code`\n## Twice\n## Twice\n```sh\n# not a heading\n```\n";
    let found = anchors(text);
    for anchor in ["title", "a-heading-with-code", "twice", "twice-1"] {
        assert!(found.contains(anchor), "{anchor} in {found:?}");
    }
    assert!(!found.contains("not-a-heading"), "{found:?}");
    let links = link_targets("see [a](docs/a.md#x) and `$(cat f)` and [b](b.md)\n```\n[c](c.md)\n```\n");
    assert_eq!(links, vec![(1, "docs/a.md#x".to_string()), (1, "b.md".to_string())]);
    let readme = repo().join("README.md");
    assert!(broken_link(&readme, "docs/no-such-page.md").is_some());
    assert!(broken_link(&readme, "docs/api.md#no-such-heading").is_some());
    assert!(broken_link(&readme, "https://example.com/").is_some());
    assert!(broken_link(&readme, "#testing").is_none());
}

// ---------------------------------------------------------------------------------------------
// Commands

/// One command line of a README code block, with the section it stands in and its comment.
#[derive(Debug, Clone)]
pub(crate) struct ReadmeCommand {
    pub(crate) section: String,
    pub(crate) line: String,
    pub(crate) comment: String,
}

/// Every line of the README's `sh` code blocks, comments split off.
pub(crate) fn readme_commands() -> Vec<ReadmeCommand> {
    let mut out = Vec::new();
    let mut section = String::new();
    let mut in_sh = false;
    for line in read(&repo().join("README.md")).lines() {
        if let Some(title) = line.strip_prefix("## ") {
            section = title.trim().to_string();
        }
        if line.starts_with("```") {
            in_sh = !in_sh && line.trim() == "```sh";
            continue;
        }
        if !in_sh || line.trim().is_empty() {
            continue;
        }
        // A comment starts at a `#` after whitespace, outside quotes.
        let (mut quote, mut cut, mut previous) = (None, line.len(), ' ');
        for (i, c) in line.char_indices() {
            match (quote, c) {
                (None, '"' | '\'') => quote = Some(c),
                (Some(q), c) if c == q => quote = None,
                (None, '#') if previous.is_whitespace() => {
                    cut = i;
                    break;
                }
                _ => {}
            }
            previous = c;
        }
        out.push(ReadmeCommand {
            section: section.clone(),
            line: line[..cut].trim().to_string(),
            comment: line[cut..].trim_start_matches('#').trim().to_string(),
        });
    }
    out
}

/// Who runs a README command.
#[derive(Debug, PartialEq, Eq)]
enum Runner {
    /// `deploy/local.sh`: the `local` test runs the script.
    LocalScript,
    /// `.ci/run`: what CI runs; its last step must be the README's test command.
    Ci,
    /// The quickstart's `export PATH=...`, `jetsched ...` and `nats ...` lines: run by
    /// `run_readme_quickstart` against the running script.
    Quickstart,
    /// A `cargo` command: checked against `.ci/run` and the tests it names.
    Cargo,
    /// `jetsched-bench ...`: its command line is parsed by the built binary.
    Bench,
}

fn runner(command: &ReadmeCommand) -> Option<Runner> {
    let line = command.line.as_str();
    let first = line.split_whitespace().find(|word| !word.contains('='))?;
    match first {
        "bash" if line == "bash deploy/local.sh" => Some(Runner::LocalScript),
        "bash" if line == "bash .ci/run" => Some(Runner::Ci),
        "export" | "jetsched" | "nats" if command.section == "Quickstart" => Some(Runner::Quickstart),
        "cargo" => Some(Runner::Cargo),
        bench if bench.ends_with("/jetsched-bench") => Some(Runner::Bench),
        _ => None,
    }
}

#[test]
fn every_readme_command_is_run_by_a_test() {
    let repo = repo();
    let commands = readme_commands();
    let ci = read(&repo.join(".ci/run"));
    let ci_commands: Vec<&str> =
        ci.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
    let mut problems = Vec::new();
    let mut quickstart = 0;
    for command in &commands {
        let line = command.line.as_str();
        match runner(command) {
            None => problems.push(format!(
                "no test runs `{line}` ({}): teach tests/tests/e2e/docs.rs it",
                command.section
            )),
            Some(Runner::Quickstart) => quickstart += 1,
            Some(Runner::LocalScript) => {
                if !read(&repo.join("tests/tests/e2e/local.rs")).contains("deploy/local.sh") {
                    problems.push("the local test no longer runs deploy/local.sh".into());
                }
            }
            Some(Runner::Ci) => {
                let test_command = commands
                    .iter()
                    .find(|c| c.section == "Testing" && c.line.starts_with("cargo nextest run"))
                    .map(|c| c.line.as_str());
                if test_command.is_none() || ci_commands.last().copied() != test_command {
                    problems.push(format!(
                        "the last command of .ci/run is {:?}, not the README's test command {test_command:?}",
                        ci_commands.last()
                    ));
                }
            }
            Some(Runner::Cargo) => problems.extend(cargo_problem(line, &ci_commands)),
            Some(Runner::Bench) => {
                let mut args = shlex::split(line).expect("shell words");
                args.remove(0);
                args.push("--help".into());
                let out = Command::new(workspace_bin("jetsched-bench"))
                    .args(&args)
                    .output()
                    .expect("run jetsched-bench");
                if !out.status.success() {
                    problems.push(format!("`{line}` is refused: {}", String::from_utf8_lossy(&out.stderr)));
                }
            }
        }
    }
    assert!(quickstart >= 10, "the quickstart has only {quickstart} commands: the README reader is broken");
    assert!(problems.is_empty(), "README commands:\n{}", problems.join("\n"));
}

/// A README `cargo` command: the test command and the builds are what `.ci/run` runs (the
/// release build being the same with `--release`); a command with a test filter and an
/// environment variable names tests and a variable that exist.
fn cargo_problem(line: &str, ci_commands: &[&str]) -> Option<String> {
    let words = shlex::split(line).expect("shell words");
    let (env, command): (Vec<&String>, Vec<&String>) =
        words.iter().partition(|w| w.contains('=') && !w.starts_with('-'));
    let plain = command.iter().map(|w| w.as_str()).collect::<Vec<_>>().join(" ");
    let in_ci = |c: &str| ci_commands.iter().any(|l| l.split(" --locked").next() == Some(c) || *l == c);
    if env.is_empty() && (in_ci(&plain) || in_ci(&plain.replace(" --release", ""))) {
        return None;
    }
    let sources = sources(&["tests"]);
    for variable in env {
        let (name, value) = variable.split_once('=').expect("NAME=value");
        if !sources.contains(&format!("\"{name}\"")) || !sources.contains(&format!("\"{value}\"")) {
            return Some(format!("`{line}`: no test reads {name} or its value {value:?}"));
        }
    }
    let filter = command.iter().position(|w| *w == "-E").and_then(|i| command.get(i + 1));
    match filter.and_then(|f| f.strip_prefix("test(/")).and_then(|f| f.strip_suffix("/)")) {
        Some(pattern)
            if sources.contains(&format!("mod {pattern}")) || sources.contains(&format!("fn {pattern}")) =>
        {
            None
        }
        Some(pattern) => Some(format!("`{line}`: no test module or function is named {pattern}")),
        None => Some(format!("`{line}` is neither what .ci/run runs nor a filtered test run")),
    }
}

/// The text of every Rust source under the given directories.
fn sources(dirs: &[&str]) -> String {
    dirs.iter().flat_map(|dir| files_under(&repo().join(dir), ".rs")).map(|path| read(&path)).collect()
}

#[test]
fn every_variable_of_the_test_guides_table_is_read() {
    let guide = read(&repo().join("docs/TESTING.md"));
    let sources = sources(&["tests", "tools/bench/src", "services"]);
    let variables: Vec<&str> = guide
        .lines()
        .filter_map(|l| l.strip_prefix("| `JETSCHED_"))
        .filter_map(|l| l.split(['=', '`']).next())
        .collect();
    assert!(variables.len() >= 4, "the table of test variables in docs/TESTING.md: {variables:?}");
    let unread: Vec<_> =
        variables.iter().filter(|v| !sources.contains(&format!("\"JETSCHED_{v}\""))).collect();
    assert!(unread.is_empty(), "variables docs/TESTING.md names that nothing reads: {unread:?}");
}

// ---------------------------------------------------------------------------------------------
// The quickstart, against the running deploy/local.sh

/// Runs every quickstart line of the README in order against the system `deploy/local.sh`
/// started (local ports, its demo specs), as a person in a second terminal would: `jetsched`
/// lines with the built CLI first on the path, `nats` lines (`kv get`, `stream view`, `req`) as
/// the `nats` CLI would do them, and every `http://127.0.0.1` URL of the README opened. Call it
/// once a demo task has dead-lettered.
pub(crate) async fn run_readme_quickstart(bin_dir: &Path, client: &async_nats::Client) {
    let repo = repo();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let mut last_output = String::new();
    for command in readme_commands().into_iter().filter(|c| c.section == "Quickstart") {
        let line = command.line.clone();
        let words = shlex::split(&line).unwrap_or_else(|| panic!("shell words of `{line}`"));
        match words[0].as_str() {
            "export" => assert!(line.starts_with("export PATH="), "`{line}`"),
            "jetsched" => {
                let line = fill_placeholders(&line, &last_output);
                let words = shlex::split(&line).expect("shell words");
                last_output = if words.iter().any(|w| w == "--follow") {
                    follow(&path, &repo, &words[1..], &line)
                } else {
                    run_cli(&path, &repo, &words[1..], &line)
                };
                if words.get(1).map(String::as_str) == Some("ls") && command.comment.contains(',') {
                    for task in command.comment.split(',').map(str::trim) {
                        assert!(last_output.contains(task), "`{line}` shows {task}:\n{last_output}");
                    }
                }
            }
            "nats" => nats_like(client, &repo, &words[1..], &line).await,
            other => panic!("the quickstart line `{line}` starts with {other}"),
        }
    }
    let readme = read(&repo.join("README.md"));
    let urls: BTreeSet<&str> = readme
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')' || c == ',')
        .filter(|w| w.starts_with("http://127.0.0.1:"))
        .map(|w| w.trim_end_matches(['.', '`']))
        .collect();
    assert!(!urls.is_empty(), "the README names the console's URL");
    for url in urls {
        let rest = url.strip_prefix("http://").expect("http URL");
        let (host, path) =
            rest.split_once('/').map_or((rest, "/".to_string()), |(h, p)| (h, format!("/{p}")));
        let addr = host.parse().unwrap_or_else(|e| panic!("{url}: {e}"));
        let status = http_request(addr, "GET", &path, &[], "").await.status;
        assert!((200..400).contains(&status), "{url} answers {status}");
    }
}

/// `<seq>` becomes the first sequence number of the previous command's table (`dlq ls`).
fn fill_placeholders(line: &str, previous: &str) -> String {
    if !line.contains("<seq>") {
        return line.to_string();
    }
    let seq = previous
        .lines()
        .skip(1)
        .find_map(|l| l.split_whitespace().next().and_then(|w| w.parse::<u64>().ok()))
        .unwrap_or_else(|| panic!("a sequence number in the previous output:\n{previous}"));
    line.replace("<seq>", &seq.to_string())
}

fn run_cli(path: &str, repo: &Path, args: &[String], line: &str) -> String {
    let out = Command::new("jetsched")
        .args(args)
        .env("PATH", path)
        .current_dir(repo)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run `{line}`: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && !stdout.trim().is_empty(),
        "`{line}` exits {:?} with:\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A `--follow` command prints at least one line within 30 s; then it is stopped, as Ctrl-C
/// would.
fn follow(path: &str, repo: &Path, args: &[String], line: &str) -> String {
    let mut child = Command::new("jetsched")
        .args(args)
        .env("PATH", path)
        .current_dir(repo)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("run `{line}`: {e}"));
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let first = rx.recv_timeout(Duration::from_secs(30));
    let _ = child.kill();
    let _ = child.wait();
    first.unwrap_or_else(|_| panic!("`{line}` printed nothing within 30 s"))
}

/// The `nats` CLI's `kv get BUCKET KEY`, `stream view STREAM [--subject S]` and
/// `req SUBJECT BODY` (with `$(cat FILE)` read), each expected to find or answer something.
async fn nats_like(client: &async_nats::Client, repo: &Path, args: &[String], line: &str) {
    let js = async_nats::jetstream::new(client.clone());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["kv", "get", bucket, key] => {
            let kv = js.get_key_value(*bucket).await.unwrap_or_else(|e| panic!("`{line}`: {e}"));
            let entry = kv.entry(*key).await.unwrap_or_else(|e| panic!("`{line}`: {e}"));
            assert!(entry.is_some(), "`{line}` finds nothing");
        }
        ["stream", "view", stream, rest @ ..] => {
            let mut stream = js.get_stream(*stream).await.unwrap_or_else(|e| panic!("`{line}`: {e}"));
            let count = match rest {
                ["--subject", subject] => {
                    let info = stream.info_with_subjects(*subject).await.expect("stream subjects");
                    let subjects: Vec<_> = futures::StreamExt::collect(info).await;
                    subjects.into_iter().flatten().map(|(_, n)| n as u64).sum::<u64>()
                }
                [] => stream.info().await.expect("stream info").state.messages,
                other => panic!("`{line}`: unexpected arguments {other:?}"),
            };
            assert!(count > 0, "`{line}` shows no message");
        }
        ["req", subject, body] => {
            let body = match body.strip_prefix("$(cat ").and_then(|b| b.strip_suffix(')')) {
                Some(file) => read(&repo.join(file)),
                None => body.to_string(),
            };
            let reply = client
                .request(subject.to_string(), body.into())
                .await
                .unwrap_or_else(|e| panic!("`{line}`: {e}"));
            let value: serde_json::Value = serde_json::from_slice(&reply.payload)
                .unwrap_or_else(|e| panic!("`{line}` answers no JSON: {e}"));
            assert!(value.get("error").is_none(), "`{line}` answers an error: {value}");
        }
        other => panic!("`{line}`: the test does not know `nats {}`", other.join(" ")),
    }
}
