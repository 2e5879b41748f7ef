//! Worker configuration: every setting is a flag and an environment variable; `validate`
//! reports every problem at once.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use jetsched_shared::config::{
    InvalidConfig, NatsCredentials, Problems, ServiceArgs, loopback, parse_duration,
};
use jetsched_shared::priority::PerPriority;
use jetsched_shared::spec::validate_id;

use crate::executor::Scope;
use crate::executor::http::destination::{HttpAllow, parse_network};
use crate::executor::shell::ShellAllow;

/// How a free permit picks among the lanes that have work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum PolicyKind {
    /// Each lane with work gets starts in proportion to its weight (smooth weighted round
    /// robin): no lane that has work starves.
    #[default]
    Weighted,
    /// Always the most urgent lane with work.
    Strict,
}

/// The jetsched worker: pulls dispatched runs from the shared durable consumer of each queue
/// it serves, executes them, retries with backoff and jitter, and dead-letters what cannot
/// succeed. Scale by starting more replicas with the same queues.
///
/// Executors act with no more than the task's namespace was given: a nats request never goes
/// to the server's (`$...`), the replies' (`_INBOX...`, `_R_`) or jetsched's own subjects, and
/// goes out as the namespace's own NATS user when it has --executor-credentials; an http
/// request reaches internal networks only through --http-allow; a shell program starts only
/// when --shell-allow lists it for the namespace.
#[derive(Debug, Clone, Parser)]
#[command(name = "jetsched-worker", version, after_help = jetsched_shared::telemetry::ENV_HELP)]
pub struct Config {
    #[command(flatten)]
    pub shared: ServiceArgs,
    /// Queues served by this worker (comma-separated or repeated).
    #[arg(
        help_heading = "Worker",
        long = "queue",
        env = "JETSCHED_WORKER_QUEUES",
        value_delimiter = ',',
        default_value = "default"
    )]
    pub queues: Vec<String>,
    /// Runs executed at once by this replica (over all its queues).
    #[arg(help_heading = "Worker", long, env = "JETSCHED_WORKER_CONCURRENCY", default_value_t = 32)]
    pub concurrency: usize,
    /// How long the server waits for a verdict (or a progress ack) before redelivering a run.
    #[arg(help_heading = "Worker", long, env = "JETSCHED_WORKER_ACK_WAIT", default_value = "30s", value_parser = parse_duration)]
    pub ack_wait: Duration,
    /// Progress acks of a running attempt are sent this often [default: ack_wait / 3].
    #[arg(help_heading = "Worker", long, env = "JETSCHED_WORKER_PROGRESS_INTERVAL", value_parser = parse_duration)]
    pub progress_interval: Option<Duration>,
    /// Unacknowledged runs allowed per queue consumer, over all replicas.
    #[arg(help_heading = "Worker", long, env = "JETSCHED_WORKER_MAX_ACK_PENDING", default_value_t = 10_000)]
    pub max_ack_pending: i64,
    /// Safety net on deliveries of one run. Retries stop at the task's `max_attempts` first; a run
    /// still without a verdict after this many deliveries (a crash loop) is moved to the
    /// dead-letter stream through the max-deliveries advisory. Also caps `max_attempts`.
    #[arg(help_heading = "Worker", long, env = "JETSCHED_WORKER_MAX_DELIVER", default_value_t = 1_010)]
    pub max_deliver: i64,
    /// On shutdown, how long in-flight runs may take to finish before they are handed back.
    #[arg(help_heading = "Worker", long, env = "JETSCHED_WORKER_SHUTDOWN_GRACE", default_value = "30s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
    /// Longest wait of one pull request (also bounds how long shutdown waits for the pull).
    #[arg(help_heading = "Worker", long, env = "JETSCHED_WORKER_PULL_EXPIRES", default_value = "2s", value_parser = parse_duration)]
    pub pull_expires: Duration,
    /// Programs the shell executor may start (argv[0], exact match), comma-separated or
    /// repeated: `NAMESPACE=PROGRAM` lets that namespace's tasks start PROGRAM; a bare `PROGRAM`
    /// (or `*=PROGRAM`) lets every namespace's, for a deployment with a single team. Empty: the
    /// shell executor is disabled.
    #[arg(
        help_heading = "Executors",
        long = "shell-allow",
        env = "JETSCHED_WORKER_SHELL_ALLOW",
        value_name = "[NAMESPACE=]PROGRAM",
        value_delimiter = ','
    )]
    pub shell_allow: Vec<String>,
    /// Internal networks the http executor may reach, comma-separated or repeated:
    /// `NAMESPACE=CIDR` for that namespace's tasks, `*=CIDR` for every namespace's (a bare
    /// address is one host), e.g. `billing=10.20.0.0/16,*=192.168.7.20`. Without an entry,
    /// loopback, private (RFC 1918), shared (100.64.0.0/10), link-local (cloud metadata),
    /// unique-local, multicast, broadcast, unspecified and reserved destinations (and the IPv6
    /// forms of such IPv4 addresses) are refused, after name resolution and at every redirect.
    /// HTTP_PROXY and HTTPS_PROXY are not used.
    #[arg(
        help_heading = "Executors",
        long = "http-allow",
        env = "JETSCHED_WORKER_HTTP_ALLOW",
        value_name = "NAMESPACE=CIDR",
        value_delimiter = ','
    )]
    pub http_allow: Vec<String>,
    /// NATS credentials the nats executor uses for a namespace's requests, comma-separated or
    /// repeated: `NAMESPACE=PATH`, PATH a file holding a credentials file (JWT and seed), an
    /// nkey seed (SU...) or `user:password` on one line. The worker opens one more connection
    /// per namespace (same servers and TLS settings, reply subjects under `_INBOX.<namespace>`),
    /// so a task reaches only what that namespace's NATS user may. Other namespaces' requests
    /// use the worker's own connection unless --executor-credentials-required.
    #[arg(
        help_heading = "Executors",
        long = "executor-credentials",
        env = "JETSCHED_WORKER_EXECUTOR_CREDENTIALS",
        value_name = "NAMESPACE=PATH",
        value_delimiter = ','
    )]
    pub executor_credentials: Vec<String>,
    /// Refuse (permanently) the nats tasks of a namespace without --executor-credentials,
    /// instead of sending their requests with the worker's own rights.
    #[arg(help_heading = "Executors", long, env = "JETSCHED_WORKER_EXECUTOR_CREDENTIALS_REQUIRED")]
    pub executor_credentials_required: bool,
    /// Bytes kept of an HTTP response body or of a process's stdout/stderr tail.
    #[arg(help_heading = "Worker", long, env = "JETSCHED_WORKER_OUTPUT_LIMIT", default_value_t = 2048)]
    pub output_limit: usize,
    /// Which run events are published: `all`; `outcomes` (no `run.started`); `failures`
    /// (`run.retrying`, `run.failed`, `run.dead` only). Each event is a stored write per run.
    #[arg(help_heading = "Worker", long, env = "JETSCHED_WORKER_RUN_EVENTS", value_enum, default_value_t = RunEvents::All)]
    pub run_events: RunEvents,
    /// `deferred`: a first attempt still running after --running-after gets its record
    /// (status running) and its `run.started` event then; a shorter one's record is written
    /// once, at the verdict, and its outcome event (with its duration) stands for its start:
    /// two stored writes less per short run. A redelivery is recorded before it runs. `eager`:
    /// every attempt is recorded before it starts, and `run.started` told then. `lazy`:
    /// records are written at the verdict only. Whatever the setting, tasks whose overlap
    /// policy is not `allow` are recorded before each attempt (the scheduler reads those).
    #[arg(help_heading = "Worker", long, env = "JETSCHED_WORKER_RUN_RECORDS", value_enum, default_value_t = RunRecords::Deferred)]
    pub run_records: RunRecords,
    /// Under deferred run records: how long an attempt runs before its record (status running)
    /// and its `run.started` event are written.
    #[arg(help_heading = "Worker", long, env = "JETSCHED_WORKER_RUNNING_AFTER", default_value = "1s", value_parser = parse_duration)]
    pub running_after: Duration,
    /// How long a run holds a concurrency slot without renewing it (renewed every third of it
    /// while the run lasts): a slot held by a worker that died is free again within this.
    #[arg(help_heading = "Worker", long, env = "JETSCHED_WORKER_LIMIT_LEASE", default_value = "30s", value_parser = parse_duration)]
    pub limit_lease: Duration,
    /// When the dead-letter stream refuses an entry (full), the run is retried after this delay.
    #[arg(help_heading = "Worker", long, env = "JETSCHED_WORKER_DLQ_RETRY_DELAY", default_value = "30s", value_parser = parse_duration)]
    pub dlq_retry_delay: Duration,
    /// Circuit-breaker keys shared by every namespace (comma-separated or repeated): tasks of
    /// any namespace naming one of these keys share one breaker. Any other key belongs to the
    /// namespace of the task naming it (the same key in two namespaces: two breakers). Give
    /// every worker the same list.
    #[arg(
        help_heading = "Worker",
        long = "shared-breakers",
        env = "JETSCHED_WORKER_SHARED_BREAKERS",
        value_name = "KEY",
        value_delimiter = ','
    )]
    pub shared_breakers: Vec<String>,
    /// Which lane of a queue a free permit pulls from: `weighted` (each lane with work gets a
    /// share of the starts by its weight, none starves) or `strict` (the most urgent lane with work).
    #[arg(help_heading = "Priorities", long, env = "JETSCHED_WORKER_PRIORITY_POLICY", value_enum, default_value_t = PolicyKind::Weighted)]
    pub priority_policy: PolicyKind,
    /// Weights of the lanes under the weighted policy (each at least 1; lanes not named keep
    /// their default).
    #[arg(
        help_heading = "Priorities",
        long,
        env = "JETSCHED_WORKER_PRIORITY_WEIGHTS",
        default_value = "critical=8,high=4,normal=2,low=1"
    )]
    pub priority_weights: String,
    /// Permits of --concurrency kept for runs of a priority (or a more urgent one), so they
    /// start even when other runs hold every other permit: `critical=4,high=2`.
    #[arg(help_heading = "Priorities", long, env = "JETSCHED_WORKER_RESERVE", default_value = "")]
    pub reserve: String,
}

/// The default weights of the weighted policy.
pub const DEFAULT_WEIGHTS: PerPriority = PerPriority([8, 4, 2, 1]);

/// When run records are first written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum RunRecords {
    /// Before every attempt.
    Eager,
    /// At the verdict, or once the attempt has run `--running-after`, whichever comes first.
    #[default]
    Deferred,
    /// At the verdict.
    Lazy,
}

/// Which run events a worker publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum RunEvents {
    #[default]
    All,
    Outcomes,
    Failures,
}

impl RunEvents {
    /// Whether events of `kind` are published.
    pub fn wants(self, kind: jetsched_shared::wire::EventKind) -> bool {
        use jetsched_shared::wire::EventKind::{RunHeld, RunSkipped, RunStarted, RunSucceeded};
        match self {
            RunEvents::All => true,
            RunEvents::Outcomes => kind != RunStarted,
            // A run skipped or held by its open breaker did not fail (the breaker's events tell
            // why).
            RunEvents::Failures => !matches!(kind, RunStarted | RunSucceeded | RunSkipped | RunHeld),
        }
    }
}

/// Default admin listener of the worker.
pub const DEFAULT_ADMIN_ADDR: SocketAddr = loopback(9103);

impl Config {
    /// A configuration for a server at `url` with defaults and an ephemeral admin port (tests).
    pub fn for_tests(url: &str, instance_id: &str) -> Config {
        Config {
            shared: ServiceArgs::for_tests(url, instance_id),
            queues: vec!["default".to_string()],
            concurrency: 32,
            ack_wait: Duration::from_secs(30),
            progress_interval: None,
            max_ack_pending: 10_000,
            max_deliver: 1_010,
            shutdown_grace: Duration::from_secs(30),
            pull_expires: Duration::from_secs(2),
            shell_allow: Vec::new(),
            // Tests' downstreams (HTTP servers, OTLP receivers) listen on 127.0.0.1.
            http_allow: vec!["*=127.0.0.0/8".to_string()],
            executor_credentials: Vec::new(),
            executor_credentials_required: false,
            output_limit: 2048,
            run_events: RunEvents::All,
            run_records: RunRecords::Deferred,
            running_after: Duration::from_secs(1),
            limit_lease: Duration::from_secs(30),
            dlq_retry_delay: Duration::from_secs(30),
            shared_breakers: Vec::new(),
            priority_policy: PolicyKind::Weighted,
            priority_weights: DEFAULT_WEIGHTS.to_string(),
            reserve: String::new(),
        }
    }

    /// The weights of the weighted policy (defaults where not valid: `validate` refuses those).
    pub fn weights(&self) -> PerPriority {
        PerPriority::parse_over(DEFAULT_WEIGHTS, &self.priority_weights).unwrap_or(DEFAULT_WEIGHTS)
    }

    /// The reserved permits per priority (none where not valid: `validate` refuses those).
    pub fn reserve(&self) -> PerPriority {
        PerPriority::parse_over(PerPriority::default(), &self.reserve).unwrap_or_default()
    }

    /// The progress-ack period: the configured one or a third of `ack_wait`.
    pub fn progress_interval(&self) -> Duration {
        self.progress_interval.unwrap_or(self.ack_wait / 3)
    }

    /// The programs the shell executor may start, per namespace (`validate` refuses invalid
    /// entries; they are left out here).
    pub(crate) fn shell_allow(&self) -> ShellAllow {
        parse_shell_allow(&self.shell_allow, &mut Problems::new())
    }

    /// The internal networks the http executor may reach, per namespace (`validate` refuses
    /// invalid entries; they are left out here).
    pub(crate) fn http_allow(&self) -> HttpAllow {
        parse_http_allow(&self.http_allow, &mut Problems::new())
    }

    /// The credentials file of each namespace given one (`validate` refuses invalid entries;
    /// they are left out here).
    pub(crate) fn executor_credentials(&self) -> BTreeMap<String, PathBuf> {
        parse_executor_credentials(&self.executor_credentials, &mut Problems::new())
    }

    /// Checks every setting (the shared ones too) and reports every problem at once.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        let mut problems = self.shared.problems();
        problems.check(!self.queues.is_empty(), "queue", "(none)", "give at least one queue");
        check_names(&mut problems, "queue", &self.queues);
        problems.at_least("concurrency", self.concurrency, 1);
        problems.positive("ack-wait", self.ack_wait);
        if let Some(interval) = self.progress_interval {
            problems.positive("progress-interval", interval);
        }
        problems.shorter("progress-interval", self.progress_interval(), "ack-wait", self.ack_wait);
        problems.at_least("max-ack-pending", self.max_ack_pending, 1);
        problems.at_least("max-deliver", self.max_deliver, 2);
        problems.positive("shutdown-grace", self.shutdown_grace);
        problems.at_least_duration("pull-expires", self.pull_expires, Duration::from_millis(100));
        problems.positive("dlq-retry-delay", self.dlq_retry_delay);
        problems.positive("running-after", self.running_after);
        problems.at_least_duration("limit-lease", self.limit_lease, Duration::from_secs(1));
        check_names(&mut problems, "shared-breakers", &self.shared_breakers);
        if let Some(weights) =
            per_priority(&mut problems, "priority-weights", DEFAULT_WEIGHTS, &self.priority_weights)
        {
            let ok = weights.0.iter().all(|w| *w >= 1);
            problems.check(ok, "priority-weights", &self.priority_weights, "every weight is at least 1");
        }
        if let Some(reserve) = per_priority(&mut problems, "reserve", PerPriority::default(), &self.reserve) {
            let (reserved, concurrency) = (reserve.total(), self.concurrency);
            problems.check(
                reserved == 0 || reserved < concurrency,
                "reserve",
                &self.reserve,
                format!(
                    "reserved permits ({reserved}) must leave one of --concurrency ({concurrency}) unreserved"
                ),
            );
        }
        parse_shell_allow(&self.shell_allow, &mut problems);
        parse_http_allow(&self.http_allow, &mut problems);
        for (namespace, path) in parse_executor_credentials(&self.executor_credentials, &mut problems) {
            if let Err(error) = NatsCredentials::read(&path) {
                problems.push(
                    "executor-credentials",
                    format!("{namespace}={}", path.display()),
                    error.to_string(),
                );
            }
        }
        problems.finish::<Config>()
    }
}

/// Checks each of `names` given to `flag` against `[A-Za-z0-9_-]{1,64}`.
fn check_names(problems: &mut Problems, flag: &str, names: &[String]) {
    for name in names {
        let ok = (1..=64).contains(&name.len())
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        problems.check(ok, flag, format!("{name:?}"), "must match [A-Za-z0-9_-]{1,64}");
    }
}

/// `text` (`--priority-weights`, `--reserve`) parsed over `default`; `None` with its problems
/// recorded under `flag`.
fn per_priority(
    problems: &mut Problems,
    flag: &str,
    default: PerPriority,
    text: &str,
) -> Option<PerPriority> {
    match PerPriority::parse_over(default, text) {
        Ok(parsed) => Some(parsed),
        Err(errors) => {
            for error in errors {
                problems.push(flag, text, error);
            }
            None
        }
    }
}

/// Splits an entry of a per-namespace setting into its scope and value: `NAMESPACE=VALUE` is
/// that namespace's (`None` when the namespace is not a valid id, with the problem recorded),
/// `*=VALUE` every namespace's; `bare` is the scope of an entry without `=` (`None`: refused).
fn scoped<'a>(
    flag: &str,
    entry: &'a str,
    bare: Option<Scope>,
    form: &str,
    problems: &mut Problems,
) -> Option<(Scope, &'a str)> {
    let entry = entry.trim();
    let (scope, value) = match entry.split_once('=') {
        Some(("*", value)) => (Scope::Every, value),
        Some((namespace, value)) => {
            if let Err(error) = validate_id("namespace", namespace) {
                problems.push(flag, format!("{entry:?}"), format!("{}: use {form}", error.message));
                return None;
            }
            (Scope::Namespace(namespace.to_string()), value)
        }
        None => match bare {
            Some(scope) => (scope, entry),
            None => {
                problems.push(flag, format!("{entry:?}"), format!("use {form}"));
                return None;
            }
        },
    };
    if value.is_empty() {
        problems.push(flag, format!("{entry:?}"), format!("the value is empty: use {form}"));
        return None;
    }
    Some((scope, value))
}

fn parse_shell_allow(entries: &[String], problems: &mut Problems) -> ShellAllow {
    let mut allow = ShellAllow::default();
    for entry in entries {
        let form = "PROGRAM, *=PROGRAM or NAMESPACE=PROGRAM";
        if let Some((scope, program)) = scoped("shell-allow", entry, Some(Scope::Every), form, problems) {
            allow.insert(scope, program);
        }
    }
    allow
}

fn parse_http_allow(entries: &[String], problems: &mut Problems) -> HttpAllow {
    let mut allow = HttpAllow::default();
    for entry in entries {
        let form = "NAMESPACE=CIDR or *=CIDR";
        let Some((scope, network)) = scoped("http-allow", entry, None, form, problems) else { continue };
        match parse_network(network) {
            Ok(network) => allow.insert(scope, network),
            Err(error) => problems.push("http-allow", format!("{entry:?}"), error),
        }
    }
    allow
}

fn parse_executor_credentials(entries: &[String], problems: &mut Problems) -> BTreeMap<String, PathBuf> {
    let mut credentials = BTreeMap::new();
    for entry in entries {
        let form = "NAMESPACE=PATH";
        let Some((scope, path)) = scoped("executor-credentials", entry, None, form, problems) else {
            continue;
        };
        let Scope::Namespace(namespace) = scope else {
            problems.push(
                "executor-credentials",
                format!("{entry:?}"),
                "credentials belong to one namespace: use NAMESPACE=PATH",
            );
            continue;
        };
        if credentials.contains_key(&namespace) {
            problems.push(
                "executor-credentials",
                format!("{entry:?}"),
                format!("namespace {namespace:?} is given credentials twice"),
            );
            continue;
        }
        credentials.insert(namespace, PathBuf::from(path));
    }
    credentials
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_parse_and_validate() {
        let config = Config::parse_from(["jetsched-worker"]);
        assert_eq!(config.queues, vec!["default"]);
        assert_eq!(config.progress_interval(), Duration::from_secs(10));
        config.validate().unwrap();
    }

    #[test]
    fn problems_are_reported_together() {
        let config = Config::parse_from([
            "jetsched-worker",
            "--queue",
            "a.b,ok",
            "--concurrency",
            "0",
            "--ack-wait",
            "3s",
            "--progress-interval",
            "5s",
        ]);
        let error = config.validate().unwrap_err();
        let flags: Vec<&str> = error.problems().map(|p| p.flag.as_str()).collect();
        assert_eq!(flags, ["queue", "concurrency", "progress-interval"], "{error}");
        let text = error.to_string();
        assert!(text.contains("--queue (JETSCHED_WORKER_QUEUES) = \"a.b\""), "{text}");
        assert!(text.contains("--progress-interval (JETSCHED_WORKER_PROGRESS_INTERVAL) = 5s"), "{text}");
    }

    #[test]
    fn shared_breakers_are_breaker_keys() {
        let config = Config::parse_from(["jetsched-worker", "--shared-breakers", "payments-api,mail_1"]);
        assert_eq!(config.shared_breakers, vec!["payments-api", "mail_1"]);
        config.validate().unwrap();
        let config = Config::parse_from(["jetsched-worker", "--shared-breakers", "ok,a.b,"]);
        let error = config.validate().unwrap_err();
        let flags: Vec<&str> = error.problems().map(|p| p.flag.as_str()).collect();
        assert_eq!(flags, ["shared-breakers", "shared-breakers"], "{error}");
        assert!(error.to_string().contains("JETSCHED_WORKER_SHARED_BREAKERS"), "{error}");
    }

    #[test]
    fn priority_settings_are_validated_together() {
        let config = Config::parse_from(["jetsched-worker"]);
        assert_eq!((config.priority_policy, config.weights()), (PolicyKind::Weighted, DEFAULT_WEIGHTS));
        assert_eq!(config.reserve(), PerPriority::default());
        let config = Config::parse_from([
            "jetsched-worker",
            "--priority-policy",
            "strict",
            "--priority-weights",
            "low=3",
            "--reserve",
            "critical=4,high=2",
            "--concurrency",
            "7",
        ]);
        config.validate().unwrap();
        assert_eq!(config.weights(), PerPriority([8, 4, 2, 3]));
        assert_eq!(config.reserve(), PerPriority([4, 2, 0, 0]));
        let config = Config::parse_from([
            "jetsched-worker",
            "--priority-weights",
            "urgent=2,low=0",
            "--reserve",
            "critical=4,high=2",
            "--concurrency",
            "6",
        ]);
        let error = config.validate().unwrap_err();
        let flags: Vec<&str> = error.problems().map(|p| p.flag.as_str()).collect();
        assert_eq!(flags, ["priority-weights", "reserve"], "{error}");
        let text = error.to_string();
        assert!(text.contains("JETSCHED_WORKER_PRIORITY_WEIGHTS"), "{text}");
        assert!(text.contains("JETSCHED_WORKER_RESERVE"), "{text}");
    }

    #[test]
    fn shell_allow_list_is_comma_separated() {
        let config = Config::parse_from(["jetsched-worker", "--shell-allow", "/bin/echo,sleep"]);
        assert_eq!(config.shell_allow, vec!["/bin/echo", "sleep"]);
    }

    #[test]
    fn executor_settings_are_scoped_by_namespace() {
        let dir = tempfile::tempdir().unwrap();
        let billing = dir.path().join("billing");
        std::fs::write(&billing, "tenant-billing:secret\n").unwrap();
        let config = Config::parse_from([
            "jetsched-worker",
            "--shell-allow",
            "date,billing=/usr/local/bin/invoice",
            "--shell-allow",
            "*=echo",
            "--http-allow",
            "billing=10.20.0.0/16,*=192.168.7.20",
            "--executor-credentials",
            &format!("billing={}", billing.display()),
            "--executor-credentials-required",
        ]);
        config.validate().unwrap();
        let shell = config.shell_allow();
        assert!(shell.permits("ops", "date") && shell.permits("ops", "echo"));
        assert!(shell.permits("billing", "/usr/local/bin/invoice"));
        assert!(!shell.permits("ops", "/usr/local/bin/invoice"));
        let http = config.http_allow();
        let internal = |ip: &str| ip.parse::<std::net::IpAddr>().unwrap();
        assert!(http.common().check(internal("192.168.7.20")).is_ok());
        assert!(http.common().check(internal("10.20.0.1")).is_err());
        let (namespace, own) = http.namespaces().next().expect("billing's own networks");
        assert_eq!(namespace, "billing");
        assert!(own.check(internal("10.20.0.1")).is_ok() && own.check(internal("192.168.7.20")).is_ok());
        assert_eq!(
            config.executor_credentials().into_iter().collect::<Vec<_>>(),
            [("billing".into(), billing)]
        );
        assert!(config.executor_credentials_required);

        // The tests' configuration reaches loopback only.
        let tests = Config::for_tests("nats://127.0.0.1:4222", "t").http_allow();
        assert!(tests.common().check(internal("127.0.0.1")).is_ok());
        assert!(tests.common().check(internal("10.0.0.1")).is_err());
        assert_eq!(Config::parse_from(["jetsched-worker"]).http_allow(), HttpAllow::default());
    }

    #[test]
    fn executor_settings_problems_are_reported_together() {
        let dir = tempfile::tempdir().unwrap();
        let garbage = dir.path().join("garbage");
        std::fs::write(&garbage, "not credentials\n").unwrap();
        let ok = dir.path().join("ok");
        std::fs::write(&ok, "u:p").unwrap();
        let config = Config::parse_from([
            "jetsched-worker",
            "--shell-allow",
            "bad.ns=date,ops=",
            "--http-allow",
            "10.0.0.0/8,ops=10.1.2.3/8,ops=intranet,*=fd00::/8",
            "--executor-credentials",
            &format!("ops={},ops={}", ok.display(), ok.display()),
            "--executor-credentials",
            &format!("*={},billing,dev=/nonexistent/creds,qa={}", ok.display(), garbage.display()),
        ]);
        let error = config.validate().unwrap_err();
        let problems: Vec<(&str, &str)> =
            error.problems().map(|p| (p.flag.as_str(), p.rule.as_str())).collect();
        let flags: Vec<&str> = problems.iter().map(|(flag, _)| *flag).collect();
        assert_eq!(
            flags,
            [
                "shell-allow",
                "shell-allow",
                "http-allow",
                "http-allow",
                "http-allow",
                "executor-credentials",
                "executor-credentials",
                "executor-credentials",
                "executor-credentials",
                "executor-credentials",
            ],
            "{error}"
        );
        let text = error.to_string();
        for expected in [
            "--shell-allow (JETSCHED_WORKER_SHELL_ALLOW) = \"bad.ns=date\": \"bad.ns\" must match [A-Za-z0-9_-]{1,128}",
            "\"ops=\": the value is empty",
            "\"10.0.0.0/8\": use NAMESPACE=CIDR or *=CIDR",
            "did you mean 10.0.0.0/8?",
            "\"ops=intranet\": \"intranet\" is neither a CIDR nor an address",
            "--executor-credentials (JETSCHED_WORKER_EXECUTOR_CREDENTIALS)",
            "namespace \"ops\" is given credentials twice",
            "credentials belong to one namespace",
            "\"billing\": use NAMESPACE=PATH",
            "dev=/nonexistent/creds: cannot read it",
            "holds neither a NATS credentials file",
        ] {
            assert!(text.contains(expected), "{expected:?} in:\n{text}");
        }
    }
}
