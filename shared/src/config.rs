//! Configuration pieces every binary flattens into its clap `Config` (NATS connection and
//! credentials, the admin listener, logging, prefix and instance id; [`ServiceArgs`] groups
//! what every service shares), and the validation every binary runs after parsing:
//! [`Problems`] collects every invalid setting, and [`ServiceArgs::problems`] checks the
//! settings all services share.

mod credentials;
mod problems;
mod service;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};

pub use self::credentials::{CredentialsError, NatsCredentials};
pub use self::problems::{InvalidConfig, Problem, Problems};
pub use self::service::ServiceArgs;
pub use crate::flags::parse_duration;
use crate::names::{DEFAULT_PREFIX, Names};
use crate::topology::TopologyArgs;

/// `127.0.0.1:<port>`: the default listeners of the services (admin, pages) are loopback only.
pub const fn loopback(port: u16) -> SocketAddr {
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), port)
}

/// Exit status of a binary started with an invalid configuration (clap's own usage errors
/// exit with the same status). A failure after a valid configuration exits with 1.
pub const EXIT_INVALID_CONFIG: u8 = 2;

/// How to reach NATS. The variable names are the ones the `nats` CLI and official clients use.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "NATS connection")]
pub struct NatsArgs {
    /// NATS server URL(s), comma-separated for a cluster.
    #[arg(
        long = "nats-url",
        env = "NATS_URL",
        default_value = "nats://127.0.0.1:4222",
        value_delimiter = ','
    )]
    pub urls: Vec<String>,
    /// User name (with --nats-password).
    #[arg(long = "nats-user", env = "NATS_USER")]
    pub user: Option<String>,
    /// Password (with --nats-user).
    #[arg(long = "nats-password", env = "NATS_PASSWORD", hide_env_values = true)]
    pub password: Option<String>,
    /// Authentication token.
    #[arg(long = "nats-token", env = "NATS_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Credentials file (JWT + nkey seed), as issued by nsc.
    #[arg(long = "nats-creds", env = "NATS_CREDS")]
    pub creds: Option<PathBuf>,
    /// File holding an nkey seed (SU...).
    #[arg(long = "nats-nkey", env = "NATS_NKEY")]
    pub nkey: Option<PathBuf>,
    /// CA certificate (PEM) to verify the server; implies TLS.
    #[arg(long = "tls-ca", env = "NATS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS (with --tls-key).
    #[arg(long = "tls-cert", env = "NATS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// Client private key (PEM) for mutual TLS (with --tls-cert).
    #[arg(long = "tls-key", env = "NATS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Timeout of the first connection attempt.
    #[arg(long = "nats-connect-timeout", env = "JETSCHED_NATS_CONNECT_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub connect_timeout: Duration,
}

impl NatsArgs {
    /// Arguments for the server(s) at `urls` (comma-separated) with no credentials (tests, tools).
    pub fn plain(urls: &str) -> NatsArgs {
        NatsArgs {
            urls: urls.split(',').map(str::to_string).collect(),
            user: None,
            password: None,
            token: None,
            creds: None,
            nkey: None,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            connect_timeout: Duration::from_secs(5),
        }
    }

    /// Connects with every configured credential; reconnects forever after the first success.
    /// `name` shows up in the server's connection list (`nats server report connections`).
    pub async fn connect(&self, name: &str) -> anyhow::Result<async_nats::Client> {
        self.connect_buffered(name, DEFAULT_SUBSCRIPTION_CAPACITY).await
    }

    /// As [`NatsArgs::connect`], with room for `capacity` undelivered messages per
    /// subscription. A subscription whose buffer is full drops messages ("slow consumer"); an
    /// ordered watch that loses one re-creates its consumer and starts over from the gap.
    pub async fn connect_buffered(&self, name: &str, capacity: usize) -> anyhow::Result<async_nats::Client> {
        self.connect_with(name, capacity, None).await
    }

    /// As [`NatsArgs::connect`], with replies under `inbox_prefix` instead of `_INBOX` (a team
    /// whose permissions grant only its own inbox prefix).
    pub async fn connect_with_inbox_prefix(
        &self,
        name: &str,
        inbox_prefix: Option<&str>,
    ) -> anyhow::Result<async_nats::Client> {
        self.connect_with(name, DEFAULT_SUBSCRIPTION_CAPACITY, inbox_prefix).await
    }

    async fn connect_with(
        &self,
        name: &str,
        capacity: usize,
        inbox_prefix: Option<&str>,
    ) -> anyhow::Result<async_nats::Client> {
        // Binaries validated these already; a tool or an embedding program may not have.
        let problems = self.problems();
        anyhow::ensure!(problems.is_empty(), "invalid NATS settings: {problems}");
        let mut options = async_nats::ConnectOptions::new();
        if let Some(prefix) = inbox_prefix {
            options = options.custom_inbox_prefix(prefix);
        }
        let mut options = options
            .name(name)
            .subscription_capacity(capacity)
            .max_reconnects(None)
            .connection_timeout(self.connect_timeout)
            .request_timeout(Some(Duration::from_secs(10)));
        if let (Some(user), Some(password)) = (&self.user, &self.password) {
            options = options.user_and_password(user.clone(), password.clone());
        }
        if let Some(token) = &self.token {
            options = options.token(token.clone());
        }
        if let Some(path) = &self.creds {
            options = options
                .credentials_file(path)
                .await
                .with_context(|| format!("read NATS credentials file {}", path.display()))?;
        }
        if let Some(path) = &self.nkey {
            let seed = std::fs::read_to_string(path)
                .with_context(|| format!("read nkey seed file {}", path.display()))?;
            options = options.nkey(seed.trim().to_string());
        }
        if let Some(ca) = &self.tls_ca {
            options = options.add_root_certificates(ca.clone()).require_tls(true);
        }
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            options = options.add_client_certificate(cert.clone(), key.clone()).require_tls(true);
        }
        let addrs = self
            .urls
            .iter()
            .map(|url| {
                url.trim().parse::<async_nats::ServerAddr>().with_context(|| format!("NATS URL {url:?}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        options.connect(addrs).await.with_context(|| format!("connect to NATS at {}", self.urls.join(",")))
    }

    /// The same servers, TLS settings and timeouts, authenticated with `credentials` instead
    /// of these settings' own (the worker's per-namespace executor connections).
    pub fn with_credentials(&self, credentials: &NatsCredentials) -> NatsArgs {
        let mut args =
            NatsArgs { user: None, password: None, token: None, creds: None, nkey: None, ..self.clone() };
        match credentials {
            NatsCredentials::CredsFile(path) => args.creds = Some(path.clone()),
            NatsCredentials::NkeyFile(path) => args.nkey = Some(path.clone()),
            NatsCredentials::UserPassword { user, password } => {
                args.user = Some(user.clone());
                args.password = Some(password.clone());
            }
        }
        args
    }
}

/// async-nats' default buffer per subscription, in messages.
pub const DEFAULT_SUBSCRIPTION_CAPACITY: usize = 64 * 1024;

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum LogFormat {
    #[default]
    Plain,
    Json,
}

/// Settings every service has besides the NATS connection.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Common")]
pub struct CommonArgs {
    /// Prefix of every subject, stream and bucket (several deployments can share an account).
    #[arg(long, env = "JETSCHED_PREFIX", default_value = DEFAULT_PREFIX)]
    pub prefix: String,
    /// Instance id shown in leases, events and run records [default: <hostname>-<pid>].
    #[arg(long, env = "JETSCHED_INSTANCE_ID")]
    pub instance_id: Option<String>,
    /// Admin HTTP listener (/metrics, /healthz, /readyz); port 0 picks a free port.
    #[arg(long, env = "JETSCHED_ADMIN_ADDR")]
    pub admin_addr: Option<SocketAddr>,
    /// Log format; the level comes from RUST_LOG (default info).
    #[arg(long, env = "JETSCHED_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain)]
    pub log_format: LogFormat,
}

impl CommonArgs {
    /// Defaults for tests and tools: default prefix, an ephemeral admin port.
    pub fn for_tests(instance_id: &str) -> CommonArgs {
        CommonArgs {
            prefix: DEFAULT_PREFIX.to_string(),
            instance_id: Some(instance_id.to_string()),
            admin_addr: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            log_format: LogFormat::Plain,
        }
    }

    pub fn names(&self) -> anyhow::Result<Names> {
        Names::new(&self.prefix).map_err(|e| anyhow::anyhow!("--prefix: {}", e.message))
    }

    /// The configured instance id or `<hostname>-<pid>`.
    pub fn instance_id(&self) -> String {
        self.instance_id.clone().unwrap_or_else(default_instance_id)
    }

    /// The configured admin address or this service's default.
    pub fn admin_addr_or(&self, default: SocketAddr) -> SocketAddr {
        self.admin_addr.unwrap_or(default)
    }
}

/// `<hostname>-<pid>`, the default instance id.
pub fn default_instance_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string());
    let host: String = host
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '-' })
        .collect();
    format!("{host}-{}", std::process::id())
}

impl NatsArgs {
    /// The problems of the NATS connection settings alone (part of [`ServiceArgs::problems`]).
    pub fn problems(&self) -> Problems {
        let mut problems = Problems::new();
        nats_problems(self, &mut problems);
        problems
    }
}

fn nats_problems(nats: &NatsArgs, problems: &mut Problems) {
    let urls = nats.urls.join(",");
    if nats.urls.iter().all(|url| url.trim().is_empty()) {
        problems.push("nats-url", format!("{urls:?}"), "give at least one server URL");
    }
    for url in nats.urls.iter().filter(|url| !url.trim().is_empty()) {
        if let Err(error) = url.trim().parse::<async_nats::ServerAddr>() {
            problems.push("nats-url", format!("{url:?}"), format!("not a NATS URL ({error})"));
        }
    }
    let set = |value: &Option<String>| if value.is_some() { "(set)" } else { "(not set)" };
    if nats.user.is_some() != nats.password.is_some() {
        let (flag, other, value) = match &nats.user {
            Some(user) => ("nats-user", "--nats-password", format!("{user:?}")),
            None => ("nats-password", "--nats-user", set(&nats.password).to_string()),
        };
        problems.push(flag, value, format!("needs {other} as well"));
    }
    let methods: Vec<&str> = [
        (nats.user.is_some() || nats.password.is_some(), "--nats-user/--nats-password"),
        (nats.token.is_some(), "--nats-token"),
        (nats.creds.is_some(), "--nats-creds"),
        (nats.nkey.is_some(), "--nats-nkey"),
    ]
    .into_iter()
    .filter_map(|(given, name)| given.then_some(name))
    .collect();
    if methods.len() > 1 {
        let flag = if nats.token.is_some() { "nats-token" } else { "nats-creds" };
        let value = if flag == "nats-token" { set(&nats.token).to_string() } else { path_value(&nats.creds) };
        problems.push(flag, value, format!("give one way to authenticate, not {}", methods.join(" and ")));
    }
    if nats.tls_cert.is_some() != nats.tls_key.is_some() {
        let (flag, other, value) = match &nats.tls_cert {
            Some(_) => ("tls-cert", "--tls-key", path_value(&nats.tls_cert)),
            None => ("tls-key", "--tls-cert", path_value(&nats.tls_key)),
        };
        problems.push(flag, value, format!("needs {other} as well"));
    }
    for (flag, path) in [
        ("nats-creds", &nats.creds),
        ("nats-nkey", &nats.nkey),
        ("tls-ca", &nats.tls_ca),
        ("tls-cert", &nats.tls_cert),
        ("tls-key", &nats.tls_key),
    ] {
        if let Some(path) = path {
            file_problem(problems, flag, path);
        }
    }
    problems.positive("nats-connect-timeout", nats.connect_timeout);
}

fn path_value(path: &Option<PathBuf>) -> String {
    path.as_ref().map_or_else(|| "(not set)".to_string(), |path| format!("{:?}", path.display().to_string()))
}

fn file_problem(problems: &mut Problems, flag: &str, path: &Path) {
    let value = format!("{:?}", path.display().to_string());
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => {}
        Ok(_) => problems.push(flag, value, "must be a file"),
        Err(error) => problems.push(flag, value, format!("must be a readable file ({error})")),
    }
}

fn common_problems(common: &CommonArgs, problems: &mut Problems) {
    if Names::new(&common.prefix).is_err() {
        problems.push(
            "prefix",
            format!("{:?}", common.prefix),
            "must match [a-z][a-z0-9_]{0,31} (it becomes a subject token and part of stream names)",
        );
    }
    if let Some(id) = &common.instance_id {
        let ok = !id.is_empty() && id.len() <= 128 && id.chars().all(|c| c.is_ascii_graphic());
        problems.check(
            ok,
            "instance-id",
            format!("{id:?}"),
            "must be 1-128 printable characters without spaces",
        );
    }
}

fn topology_problems(topology: &TopologyArgs, problems: &mut Problems) {
    let replicas = topology.replicas;
    problems.check((1..=5).contains(&replicas), "replicas", replicas, "must be between 1 and 5");
    let history = topology.tasks_history;
    problems.check((1..=64).contains(&history), "tasks-history", history, "must be between 1 and 64");
    let partitions = topology.partitions;
    let ok = crate::partition::invalid(partitions).is_none();
    problems.check(ok, "partitions", partitions, "must be between 1 and 4096");
    problems.at_least("events-max-bytes", topology.events_max_bytes, 1);
    problems.at_least("dlq-max-bytes", topology.dlq_max_bytes, 1);
    problems.at_least("events-max-per-subject", topology.events_max_per_subject, 0);
    problems.at_least("dlq-max-per-subject", topology.dlq_max_per_subject, 0);
    for (flag, value) in [
        ("lease", topology.lease),
        ("runs-ttl", topology.runs_ttl),
        ("duplicate-window", topology.duplicate_window),
        ("events-max-age", topology.events_max_age),
        ("intake-max-age", topology.intake_max_age),
        ("topology-wait", topology.topology_wait),
    ] {
        problems.positive(flag, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shared pieces as a binary of their own, for the report's variable names.
    #[derive(Debug, clap::Parser)]
    #[command(name = "jetsched-test")]
    struct Shared {
        #[command(flatten)]
        args: ServiceArgs,
    }

    fn problems(args: &[&str]) -> Result<(), InvalidConfig> {
        let parsed = <Shared as clap::Parser>::try_parse_from(
            std::iter::once("jetsched-test").chain(args.iter().copied()),
        )
        .expect("syntax is valid");
        parsed.args.problems().finish::<Shared>()
    }

    #[test]
    fn defaults_are_valid() {
        problems(&[]).unwrap();
        assert!(ServiceArgs::for_tests("nats://127.0.0.1:4222", "x").problems().is_empty());
    }

    #[test]
    fn every_problem_is_reported_with_flag_variable_value_and_rule() {
        let error = problems(&[
            "--prefix",
            "bad prefix",
            "--nats-url",
            "nats://ok:4222,http://[::1",
            "--nats-user",
            "alice",
            "--nats-token",
            "secret-token",
            "--tls-cert",
            "/nonexistent/cert.pem",
            "--replicas",
            "0",
            "--partitions",
            "0",
            "--lease",
            "0s",
            "--instance-id",
            "has space",
        ])
        .unwrap_err();
        let text = error.to_string();
        let flags: Vec<&str> = error.problems().map(|p| p.flag.as_str()).collect();
        assert_eq!(
            flags,
            [
                "nats-url",
                "nats-user",
                "nats-token",
                "tls-cert",
                "tls-cert",
                "prefix",
                "instance-id",
                "replicas",
                "partitions",
                "lease"
            ],
            "{text}"
        );
        assert!(text.starts_with("jetsched-test: invalid configuration (10 problems):"), "{text}");
        assert!(text.contains("--prefix (JETSCHED_PREFIX) = \"bad prefix\": must match"), "{text}");
        assert!(text.contains("--lease (JETSCHED_LEASE) = 0s: must be longer than 0s"), "{text}");
        let partitions = "--partitions (JETSCHED_PARTITIONS) = 0: must be between 1 and 4096";
        assert!(text.contains(partitions), "{text}");
        assert!(text.contains("--nats-user (NATS_USER) = \"alice\": needs --nats-password"), "{text}");
        assert!(!text.contains("secret-token"), "secrets are never shown: {text}");
    }

    #[test]
    fn connecting_with_invalid_nats_settings_fails_before_any_attempt() {
        let mut nats = NatsArgs::plain("nats://127.0.0.1:1");
        nats.password = Some("secret".into());
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let error = runtime.block_on(nats.connect("test")).unwrap_err().to_string();
        assert_eq!(error, "invalid NATS settings: --nats-password = (set): needs --nats-user as well");
    }

    #[test]
    fn durations_parse_zero_and_reject_nonsense() {
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration(" 1m 30s "), Ok(Duration::from_secs(90)));
        assert!(parse_duration("soon").unwrap_err().contains("soon"));
    }

    #[test]
    fn credentials_files_are_recognized_by_their_content() {
        let path = Path::new("/secrets/team");
        let creds = "-----BEGIN NATS USER JWT-----\neyJ0eXAi\n------END NATS USER JWT------\n\n\
                     -----BEGIN USER NKEY SEED-----\nSUAM\n------END USER NKEY SEED------\n";
        let seed = "SUANQDPB2RUOE4ETUA26CNX7FUKE5ZZKFCQIIW63OX225F2CO7UEXTM7ZY\n";
        let cases: [(&str, Option<NatsCredentials>); 9] = [
            (creds, Some(NatsCredentials::CredsFile(path.into()))),
            (seed, Some(NatsCredentials::NkeyFile(path.into()))),
            (
                "team:s3cret:with:colons\n",
                Some(NatsCredentials::UserPassword {
                    user: "team".into(),
                    password: "s3cret:with:colons".into(),
                }),
            ),
            ("", None),
            ("team\n", None),
            (":password", None),
            ("team:", None),
            ("team:a\nother:b\n", None),
            ("SUlowercase", None),
        ];
        for (text, want) in cases {
            match (NatsCredentials::recognize(path, text), want) {
                (Ok(got), Some(want)) => assert_eq!(got, want, "{text:?}"),
                (Err(CredentialsError::Unrecognized), None) => {}
                (got, want) => panic!("{text:?}: got {got:?}, want {want:?}"),
            }
        }
        let secret = NatsCredentials::UserPassword { user: "u".into(), password: "hunter2".into() };
        assert!(!format!("{secret:?}").contains("hunter2"));
        assert!(matches!(
            NatsCredentials::read(Path::new("/nonexistent/creds")),
            Err(CredentialsError::Unreadable(_))
        ));
    }

    #[test]
    fn other_credentials_keep_the_servers_and_tls_settings() {
        let mut nats = NatsArgs::plain("nats://a:4222,nats://b:4222");
        nats.token = Some("worker-token".into());
        nats.tls_ca = Some("/ca.pem".into());
        let team = nats
            .with_credentials(&NatsCredentials::UserPassword { user: "team".into(), password: "pw".into() });
        assert_eq!(team.urls, nats.urls);
        assert_eq!(team.tls_ca, nats.tls_ca);
        assert_eq!(
            (team.user.as_deref(), team.password.as_deref(), team.token.as_deref()),
            (Some("team"), Some("pw"), None)
        );
        // One way to authenticate (the missing CA file is this test's only other problem).
        assert!(team.problems().iter().all(|p| p.flag == "tls-ca"), "{}", team.problems());
        let seed = nats.with_credentials(&NatsCredentials::NkeyFile("/seed".into()));
        assert_eq!((seed.nkey, seed.token, seed.user), (Some("/seed".into()), None, None));
    }
}
