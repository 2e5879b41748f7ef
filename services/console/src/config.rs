//! Console configuration: every setting is a flag and an environment variable; `validate`
//! reports every problem at once (actions on a non-loopback address need a token).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use jetsched_shared::config::{InvalidConfig, Problems, ServiceArgs, loopback};

/// The jetsched web console: tasks, runs, dead letters, live events and the system's health,
/// read from JetStream; actions (pause, resume, trigger, delete, replay, purge) through the
/// registry API when allowed.
#[derive(Debug, Clone, Parser)]
#[command(name = "jetsched-console", version, after_help = jetsched_shared::telemetry::ENV_HELP)]
pub struct Config {
    // The topology settings are accepted (and checked) too, so one shared configuration
    // serves the console as well; the console creates and changes nothing.
    #[command(flatten)]
    pub shared: ServiceArgs,
    /// Listener of the pages; port 0 picks a free port.
    #[arg(long, env = "JETSCHED_CONSOLE_HTTP_ADDR", default_value_t = DEFAULT_HTTP_ADDR)]
    pub http_addr: SocketAddr,
    /// Allow the actions (pause, resume, trigger, delete, dead-letter replay and purge);
    /// refused with 403 otherwise.
    #[arg(long, env = "JETSCHED_CONSOLE_ALLOW_ACTIONS")]
    pub allow_actions: bool,
    /// Token every page and action needs (`Authorization: Bearer <token>` or `/login`).
    #[arg(
        long,
        env = "JETSCHED_CONSOLE_AUTH_TOKEN",
        hide_env_values = true,
        conflicts_with = "auth_token_file"
    )]
    pub auth_token: Option<String>,
    /// File holding the token (surrounding whitespace ignored).
    #[arg(long, env = "JETSCHED_CONSOLE_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,
    /// Tasks listed per page of /tasks.
    #[arg(long, env = "JETSCHED_CONSOLE_PAGE_SIZE", default_value_t = 50)]
    pub page_size: usize,
    /// Recent events kept in memory for the runs, events and chart (the last hour at most).
    #[arg(long, env = "JETSCHED_CONSOLE_RECENT_EVENTS", default_value_t = 20_000)]
    pub recent_events: usize,
    /// Link every run's trace id to this URL template, which must contain `{trace_id}` (the
    /// execution's trace id), e.g. `http://jaeger:16686/trace/{trace_id}`; no links when unset.
    #[arg(long, env = "JETSCHED_CONSOLE_TRACE_URL")]
    pub trace_url: Option<String>,
}

/// Default listener of the pages.
pub const DEFAULT_HTTP_ADDR: SocketAddr = loopback(9180);
/// Default admin listener of the console.
pub const DEFAULT_ADMIN_ADDR: SocketAddr = loopback(9105);

impl Config {
    /// A configuration for a server at `url`: ephemeral ports, reading only (tests).
    pub fn for_tests(url: &str) -> Config {
        Config {
            shared: ServiceArgs::for_tests(url, "console-test"),
            http_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            allow_actions: false,
            auth_token: None,
            auth_token_file: None,
            page_size: 50,
            recent_events: 20_000,
            trace_url: None,
        }
    }

    /// Checks every setting (the shared ones too) and reports every problem at once.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        let mut problems = self.shared.problems();
        self.console_problems(&mut problems);
        problems.finish::<Config>()
    }

    fn console_problems(&self, problems: &mut Problems) {
        problems.at_least("page-size", self.page_size, 1);
        problems.at_least("recent-events", self.recent_events, 100);
        if let Some(token) = &self.auth_token {
            problems.check(!token.trim().is_empty(), "auth-token", "(empty)", "must not be empty");
        }
        if let Some(path) = &self.auth_token_file {
            match std::fs::read_to_string(path) {
                Ok(text) if text.trim().is_empty() => {
                    problems.push("auth-token-file", path.display(), "the file is empty")
                }
                Ok(_) => {}
                Err(error) => {
                    problems.push("auth-token-file", path.display(), format!("cannot read it ({error})"))
                }
            }
        }
        if let Some(template) = &self.trace_url
            && let Some(problem) = crate::trace::problem(template)
        {
            problems.push("trace-url", template, problem);
        }
        let has_token = self.auth_token.is_some() || self.auth_token_file.is_some();
        if self.allow_actions && !self.http_addr.ip().is_loopback() && !has_token {
            problems.push(
                "allow-actions",
                "true",
                format!(
                    "actions on a non-loopback address ({}) need --auth-token or --auth-token-file",
                    self.http_addr
                ),
            );
        }
    }

    /// The token pages and actions need, if any (read from the file when one is given).
    pub fn token(&self) -> anyhow::Result<Option<String>> {
        if let Some(token) = &self.auth_token {
            return Ok(Some(token.trim().to_string()));
        }
        match &self.auth_token_file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| anyhow::anyhow!("read --auth-token-file {}: {e}", path.display()))?;
                Ok(Some(text.trim().to_string()))
            }
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_problems_are_reported_together() {
        Config::parse_from(["jetsched-console"]).validate().unwrap();
        Config::for_tests("nats://127.0.0.1:4222").validate().unwrap();
        Config::parse_from(["jetsched-console", "--allow-actions"]).validate().unwrap();
        let config = Config::parse_from([
            "jetsched-console",
            "--prefix",
            "Bad",
            "--page-size",
            "0",
            "--allow-actions",
            "--http-addr",
            "0.0.0.0:9180",
        ]);
        let text = config.validate().unwrap_err().to_string();
        assert!(text.contains("--prefix (JETSCHED_PREFIX)"), "{text}");
        assert!(text.contains("--page-size (JETSCHED_CONSOLE_PAGE_SIZE) = 0"), "{text}");
        assert!(text.contains("need --auth-token"), "{text}");
    }

    #[test]
    fn a_trace_url_needs_its_placeholder_and_http() {
        let config = |url: &str| Config::parse_from(["jetsched-console", "--trace-url", url]);
        config("http://jaeger:16686/trace/{trace_id}").validate().unwrap();
        let text = config("jaeger/trace").validate().unwrap_err().to_string();
        assert!(
            text.contains("--trace-url (JETSCHED_CONSOLE_TRACE_URL) = jaeger/trace")
                && text.contains("must start with http:// or https://")
                && text.contains("must contain {trace_id}"),
            "{text}"
        );
    }

    #[test]
    fn a_token_allows_actions_on_any_address() {
        let config = Config::parse_from([
            "jetsched-console",
            "--allow-actions",
            "--http-addr",
            "0.0.0.0:9180",
            "--auth-token",
            "s3cret",
        ]);
        config.validate().unwrap();
        assert_eq!(config.token().unwrap().as_deref(), Some("s3cret"));
    }
}
