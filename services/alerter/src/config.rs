//! Alerter configuration: every setting is a flag and an environment variable; `validate`
//! reports every problem at once.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{CommandFactory, Parser};
use jetsched_shared::config::{InvalidConfig, ServiceArgs, loopback, parse_duration};

use crate::rules::throttle::ThrottleConfig;
use crate::rules::{Rule, Thresholds};
use crate::state::MAX_DEDUP_WINDOW;

/// The jetsched alerter: turns run failures, dead letters, queue backlogs, leader changes,
/// missing leaders, late fires and a growing dead-letter stream into de-duplicated,
/// rate-limited alerts on the log, webhooks and `<prefix>.alert.<severity>`.
#[derive(Debug, Clone, Parser)]
#[command(name = "jetsched-alerter", version, after_help = jetsched_shared::telemetry::ENV_HELP)]
pub struct Config {
    #[command(flatten)]
    pub shared: ServiceArgs,

    /// Optional JSON file of settings keyed by long flag name, e.g.
    /// `{"rate-limit": 20, "rules": ["run_dead", "no_leader"], "webhook-url": ["https://..."]}`;
    /// flags and environment variables win over it.
    #[arg(long, env = "JETSCHED_ALERTER_CONFIG", help_heading = "Alerter")]
    pub config: Option<PathBuf>,

    /// Rules that are on (comma-separated).
    #[arg(long, env = "JETSCHED_ALERTER_RULES", value_enum, value_delimiter = ',',
          default_values_t = Rule::ALL.to_vec(), help_heading = "Rules")]
    pub rules: Vec<Rule>,
    /// Pending dispatches on one queue's consumer that count as a backlog.
    #[arg(long, env = "JETSCHED_ALERTER_BACKLOG_THRESHOLD", default_value_t = 1000, help_heading = "Rules")]
    pub backlog_threshold: u64,
    /// How long a backlog must last before it alerts.
    #[arg(long, env = "JETSCHED_ALERTER_BACKLOG_FOR", default_value = "1m", value_parser = parse_duration, help_heading = "Rules")]
    pub backlog_for: Duration,
    /// How long without a leader lease holder is fatal.
    #[arg(long, env = "JETSCHED_ALERTER_NO_LEADER_AFTER", default_value = "30s", value_parser = parse_duration, help_heading = "Rules")]
    pub no_leader_after: Duration,
    /// A fire dispatched later than this after its nominal time alerts.
    #[arg(long, env = "JETSCHED_ALERTER_FIRE_LAG", default_value = "5s", value_parser = parse_duration, help_heading = "Rules")]
    pub fire_lag: Duration,
    /// More leader changes than this within --flap-window is flapping.
    #[arg(long, env = "JETSCHED_ALERTER_FLAP_CHANGES", default_value_t = 3, help_heading = "Rules")]
    pub flap_changes: usize,
    #[arg(long, env = "JETSCHED_ALERTER_FLAP_WINDOW", default_value = "10m", value_parser = parse_duration, help_heading = "Rules")]
    pub flap_window: Duration,
    /// Share of the dead-letter stream's byte limit (--dlq-max-bytes) that counts as nearly full.
    #[arg(long, env = "JETSCHED_ALERTER_DLQ_FULL_RATIO", default_value_t = 0.9, help_heading = "Rules")]
    pub dlq_full_ratio: f64,
    /// A run waiting this long for a slot of a concurrency key alerts (`limit_waiting`).
    #[arg(long, env = "JETSCHED_ALERTER_LIMIT_WAIT", default_value = "5m", value_parser = parse_duration, help_heading = "Rules")]
    pub limit_wait: Duration,
    /// How often queue depths, the dead-letter stream and the concurrency keys are read.
    #[arg(long, env = "JETSCHED_ALERTER_CHECK_INTERVAL", default_value = "10s", value_parser = parse_duration, help_heading = "Rules")]
    pub check_interval: Duration,

    /// One alert per (rule, task) per window; repeats are counted and reported.
    #[arg(long, env = "JETSCHED_ALERTER_DEDUP_WINDOW", default_value = "5m", value_parser = parse_duration, help_heading = "Noise control")]
    pub dedup_window: Duration,
    /// Messages per minute, all rules together (token bucket).
    #[arg(long, env = "JETSCHED_ALERTER_RATE_LIMIT", default_value_t = 10, help_heading = "Noise control")]
    pub rate_limit: u32,
    /// Messages that may go out at once [default: --rate-limit].
    #[arg(long, env = "JETSCHED_ALERTER_RATE_BURST", help_heading = "Noise control")]
    pub rate_burst: Option<u32>,
    /// When suppressed alerts are summarised, counted from the first suppressed one.
    #[arg(long, env = "JETSCHED_ALERTER_SUMMARY_INTERVAL", default_value = "1m", value_parser = parse_duration, help_heading = "Noise control")]
    pub summary_interval: Duration,
    /// How long alerts of one rule are collected into one message (0s: no grouping).
    #[arg(long, env = "JETSCHED_ALERTER_GROUP_WAIT", default_value = "2s", value_parser = parse_duration, help_heading = "Noise control")]
    pub group_wait: Duration,

    /// Write alerts to the log.
    #[arg(long, env = "JETSCHED_ALERTER_LOG", default_value_t = true, action = clap::ArgAction::Set, help_heading = "Channels")]
    pub log_alerts: bool,
    /// Publish alerts on `<prefix>.alert.<severity>` (kept in the alerts stream).
    #[arg(long, env = "JETSCHED_ALERTER_NATS", default_value_t = true, action = clap::ArgAction::Set, help_heading = "Channels")]
    pub nats_alerts: bool,
    /// Webhook URL(s) receiving a JSON POST with a Slack-compatible `text` (comma-separated).
    #[arg(
        long = "webhook-url",
        env = "JETSCHED_ALERTER_WEBHOOK_URLS",
        value_delimiter = ',',
        help_heading = "Channels"
    )]
    pub webhook_urls: Vec<String>,
    /// Timeout of one webhook attempt.
    #[arg(long, env = "JETSCHED_ALERTER_WEBHOOK_TIMEOUT", default_value = "5s", value_parser = parse_duration, help_heading = "Channels")]
    pub webhook_timeout: Duration,
    /// Attempts per webhook message (first try included).
    #[arg(long, env = "JETSCHED_ALERTER_WEBHOOK_ATTEMPTS", default_value_t = 3, help_heading = "Channels")]
    pub webhook_attempts: u32,
    /// Delay before the first webhook retry (doubled each retry).
    #[arg(long, env = "JETSCHED_ALERTER_WEBHOOK_BACKOFF", default_value = "500ms", value_parser = parse_duration, help_heading = "Channels")]
    pub webhook_backoff: Duration,
    /// Messages the log and NATS channels may queue; when full, new messages for the channel
    /// are dropped and counted.
    #[arg(long, env = "JETSCHED_ALERTER_CHANNEL_QUEUE", default_value_t = 1024, help_heading = "Channels")]
    pub channel_queue: usize,
    /// Messages each webhook may queue (a slow or down webhook fills only its own queue).
    #[arg(long, env = "JETSCHED_ALERTER_WEBHOOK_QUEUE", default_value_t = 256, help_heading = "Channels")]
    pub webhook_queue: usize,

    /// Give up starting when a stream or bucket with conflicting settings (e.g. another
    /// deployment's) is not replaced within this long; an unavailable JetStream is waited for
    /// by --topology-wait, and other topology errors stop start-up at once.
    #[arg(long, env = "JETSCHED_ALERTER_STARTUP_TIMEOUT", default_value = "60s", value_parser = parse_duration, help_heading = "Alerter")]
    pub startup_timeout: Duration,
}

/// Default admin listener of the alerter.
pub const DEFAULT_ADMIN_ADDR: SocketAddr = loopback(9104);

impl Config {
    /// Parses the process arguments and environment, then the `--config` file.
    pub fn load() -> Result<Config, clap::Error> {
        Config::load_from(std::env::args_os())
    }

    /// [`Config::load`] from `args`. Precedence: flags, environment, config file, defaults.
    /// Every problem is a clap error (exit code 2 through `clap::Error::exit`).
    pub fn load_from<I, T>(args: I) -> Result<Config, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let mut args: Vec<OsString> = args.into_iter().map(Into::into).collect();
        let matches = Config::command().try_get_matches_from(&args)?;
        let Some(path) = matches.get_one::<PathBuf>("config").cloned() else {
            return Config::try_parse_from(args);
        };
        let invalid =
            |message: String| clap::Error::raw(clap::error::ErrorKind::InvalidValue, message + "\n");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| invalid(format!("--config {}: {e}", path.display())))?;
        let settings: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&text).map_err(|e| {
                invalid(format!("--config {}: not a JSON object of settings: {e}", path.display()))
            })?;
        let command = Config::command();
        let mut problems = Vec::new();
        for (key, value) in settings {
            let long = key.replace('_', "-");
            let Some(arg) =
                command.get_arguments().find(|a| a.get_long() == Some(long.as_str()) && long != "config")
            else {
                problems.push(format!("unknown setting `{key}`"));
                continue;
            };
            // A flag or an environment variable wins over the file.
            if matches!(
                matches.value_source(arg.get_id().as_str()),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            ) {
                continue;
            }
            let text = match value {
                serde_json::Value::String(text) => text,
                serde_json::Value::Number(n) => n.to_string(),
                serde_json::Value::Bool(b) => b.to_string(),
                serde_json::Value::Array(items) => {
                    let items: Option<Vec<String>> = items
                        .into_iter()
                        .map(|item| match item {
                            serde_json::Value::String(text) => Some(text),
                            serde_json::Value::Number(n) => Some(n.to_string()),
                            _ => None,
                        })
                        .collect();
                    match items {
                        Some(items) => items.join(","),
                        None => {
                            problems.push(format!("`{key}`: list items must be strings or numbers"));
                            continue;
                        }
                    }
                }
                other => {
                    problems.push(format!("`{key}`: {other} is not a string, number, boolean or list"));
                    continue;
                }
            };
            args.push(format!("--{long}").into());
            args.push(text.into());
        }
        if !problems.is_empty() {
            return Err(invalid(format!("--config {}: {}", path.display(), problems.join("; "))));
        }
        Config::try_parse_from(args)
    }

    /// A configuration for a server at `url` with defaults, an ephemeral admin port, no
    /// webhook (tests).
    pub fn for_tests(url: &str) -> Config {
        // The rules' and the throttle's own defaults (those of the flags).
        let rule_defaults = Thresholds::default();
        let Thresholds { enabled: rules, backlog_threshold, backlog_for, no_leader_after, .. } =
            rule_defaults;
        let Thresholds { fire_lag, flap_changes, flap_window, dlq_full_ratio, limit_wait, .. } =
            rule_defaults;
        let ThrottleConfig { dedup_window, rate_per_minute, group_wait, summary_interval, .. } =
            ThrottleConfig::default();
        Config {
            shared: ServiceArgs::for_tests(url, "alerter-test"),
            config: None,
            rules,
            backlog_threshold,
            backlog_for,
            no_leader_after,
            fire_lag,
            flap_changes,
            flap_window,
            dlq_full_ratio,
            limit_wait,
            check_interval: Duration::from_secs(10),
            dedup_window,
            rate_limit: rate_per_minute,
            rate_burst: None,
            summary_interval,
            group_wait,
            log_alerts: true,
            nats_alerts: true,
            webhook_urls: Vec::new(),
            webhook_timeout: Duration::from_secs(5),
            webhook_attempts: 3,
            webhook_backoff: Duration::from_millis(500),
            channel_queue: 1024,
            webhook_queue: 256,
            startup_timeout: Duration::from_secs(60),
        }
    }

    /// Checks every setting (the shared ones too) and reports every problem at once.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        let mut problems = self.shared.problems();
        problems.check(!self.rules.is_empty(), "rules", "(none)", "at least one rule must be on");
        for (flag, value) in [
            ("backlog-for", self.backlog_for),
            ("no-leader-after", self.no_leader_after),
            ("fire-lag", self.fire_lag),
            ("flap-window", self.flap_window),
            ("check-interval", self.check_interval),
            ("dedup-window", self.dedup_window),
            ("summary-interval", self.summary_interval),
            ("webhook-timeout", self.webhook_timeout),
            ("webhook-backoff", self.webhook_backoff),
            ("startup-timeout", self.startup_timeout),
        ] {
            problems.positive(flag, value);
        }
        problems.at_most_duration("dedup-window", self.dedup_window, MAX_DEDUP_WINDOW);
        problems.at_least("flap-changes", self.flap_changes, 1);
        let ratio = self.dlq_full_ratio;
        problems.check(ratio > 0.0 && ratio <= 1.0, "dlq-full-ratio", ratio, "must be in (0, 1]");
        problems.check(
            self.rate_limit >= 1,
            "rate-limit",
            self.rate_limit,
            "must be at least 1 message per minute",
        );
        if let Some(burst) = self.rate_burst {
            problems.at_least("rate-burst", burst, 1);
        }
        problems.at_least("webhook-attempts", self.webhook_attempts, 1);
        problems.at_least("channel-queue", self.channel_queue, 1);
        problems.at_least("webhook-queue", self.webhook_queue, 1);
        for url in &self.webhook_urls {
            match reqwest::Url::parse(url.trim()) {
                Ok(parsed) if matches!(parsed.scheme(), "http" | "https") => {}
                Ok(parsed) => problems.push(
                    "webhook-url",
                    format!("{url:?}"),
                    format!("scheme {} is not http(s)", parsed.scheme()),
                ),
                Err(error) => {
                    problems.push("webhook-url", format!("{url:?}"), format!("not a URL ({error})"))
                }
            }
        }
        problems.check(
            self.log_alerts || self.nats_alerts || !self.webhook_urls.is_empty(),
            "log-alerts",
            self.log_alerts,
            "no alert channel: enable --log-alerts or --nats-alerts, or give --webhook-url",
        );
        problems.finish::<Config>()
    }

    pub(crate) fn thresholds(&self) -> Thresholds {
        Thresholds {
            enabled: self.rules.clone(),
            backlog_threshold: self.backlog_threshold,
            backlog_for: self.backlog_for,
            no_leader_after: self.no_leader_after,
            fire_lag: self.fire_lag,
            flap_changes: self.flap_changes,
            flap_window: self.flap_window,
            dlq_full_ratio: self.dlq_full_ratio,
            limit_wait: self.limit_wait,
        }
    }

    pub(crate) fn throttle(&self) -> ThrottleConfig {
        ThrottleConfig {
            dedup_window: self.dedup_window,
            rate_per_minute: self.rate_limit,
            burst: self.rate_burst.unwrap_or(self.rate_limit),
            group_wait: self.group_wait,
            summary_interval: self.summary_interval,
            max_listed: 20,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_flags_parse() {
        let config = Config::try_parse_from([
            "jetsched-alerter",
            "--rules",
            "run_failed,no_leader",
            "--group-wait",
            "0s",
            "--webhook-url",
            "http://127.0.0.1:9/hook",
        ])
        .unwrap();
        assert_eq!(config.rules, [Rule::RunFailed, Rule::NoLeader]);
        assert_eq!(config.group_wait, Duration::ZERO);
        config.validate().unwrap();
        Config::for_tests("nats://127.0.0.1:4222").validate().unwrap();
    }

    /// Tests run on the rules' and the throttle's defaults, which are the flags' defaults.
    #[test]
    fn test_defaults_are_the_flags_defaults() {
        let flags = Config::try_parse_from(["jetsched-alerter"]).unwrap();
        let tests = Config::for_tests("nats://127.0.0.1:4222");
        assert_eq!(format!("{:?}", flags.thresholds()), format!("{:?}", tests.thresholds()));
        assert_eq!(format!("{:?}", flags.throttle()), format!("{:?}", tests.throttle()));
        assert_eq!(flags.check_interval, tests.check_interval);
    }

    fn settings_file(name: &str, json: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!("jetsched-alerter-{name}-{}.json", std::process::id()));
        std::fs::write(&path, json).unwrap();
        path
    }

    #[test]
    fn config_file_fills_what_flags_leave_out() {
        let path = settings_file(
            "ok",
            r#"{"rate-limit": 20, "rules": ["run_dead", "no_leader"], "group_wait": "0s",
                "webhook-url": ["http://127.0.0.1:9/a", "http://127.0.0.1:9/b"], "log-alerts": false,
                "dedup-window": "1m"}"#,
        );
        let config = Config::load_from([
            "jetsched-alerter".as_ref(),
            "--config".as_ref(),
            path.as_os_str(),
            "--dedup-window".as_ref(),
            "10m".as_ref(),
        ])
        .unwrap();
        assert_eq!(config.rate_limit, 20);
        assert_eq!(config.rules, [Rule::RunDead, Rule::NoLeader]);
        assert_eq!(config.group_wait, Duration::ZERO);
        assert_eq!(config.webhook_urls.len(), 2);
        assert!(!config.log_alerts);
        assert_eq!(config.dedup_window, Duration::from_secs(600), "the flag wins");
        config.validate().unwrap();
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn config_file_problems_are_clear() {
        let path = settings_file("bad", r#"{"rate-limmit": 20, "fire-lag": "soon", "config": "x"}"#);
        let error = Config::load_from(["jetsched-alerter".as_ref(), "--config".as_ref(), path.as_os_str()])
            .unwrap_err()
            .to_string();
        assert!(error.contains("rate-limmit") && error.contains("`config`"), "{error}");
        std::fs::write(&path, r#"{"fire-lag": "soon"}"#).unwrap();
        let error = Config::load_from(["jetsched-alerter".as_ref(), "--config".as_ref(), path.as_os_str()])
            .unwrap_err()
            .to_string();
        assert!(error.contains("soon"), "{error}");
        std::fs::write(&path, "[1, 2]").unwrap();
        let error = Config::load_from(["jetsched-alerter".as_ref(), "--config".as_ref(), path.as_os_str()])
            .unwrap_err()
            .to_string();
        assert!(error.contains("not a JSON object"), "{error}");
        std::fs::remove_file(path).unwrap();
        let missing =
            Config::load_from(["jetsched-alerter", "--config", "/nonexistent/alerter.json"]).unwrap_err();
        assert!(missing.to_string().contains("/nonexistent/alerter.json"), "{missing}");
    }

    #[test]
    fn bad_values_are_reported_together() {
        assert!(Config::try_parse_from(["jetsched-alerter", "--rules", "nope"]).is_err());
        let mut config = Config::for_tests("nats://x:1");
        config.rate_limit = 0;
        config.webhook_urls = vec!["ftp://x".into(), "not a url".into()];
        config.dedup_window = Duration::ZERO;
        let error = config.validate().unwrap_err();
        let flags: Vec<&str> = error.problems().map(|p| p.flag.as_str()).collect();
        assert_eq!(flags, ["dedup-window", "rate-limit", "webhook-url", "webhook-url"], "{error}");
        let text = error.to_string();
        assert!(text.contains("--rate-limit (JETSCHED_ALERTER_RATE_LIMIT) = 0"), "{text}");
        assert!(text.contains("ftp") && text.contains("not a url"), "{text}");
    }
}
