//! Configuration pieces every binary flattens into its clap `Config`: NATS connection and
//! credentials, the admin listener, logging, prefix and instance id.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};

use crate::names::{DEFAULT_PREFIX, Names};

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
    #[arg(long = "nats-password", env = "NATS_PASSWORD", hide_env_values = true, requires = "user")]
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
    #[arg(long = "tls-cert", env = "NATS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Client private key (PEM) for mutual TLS (with --tls-cert).
    #[arg(long = "tls-key", env = "NATS_KEY", requires = "tls_cert")]
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
        let mut options = async_nats::ConnectOptions::new()
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

/// Parses a human duration (`90s`, `5m`, `1h 30m`) for clap.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration ({e}); use e.g. 90s, 5m, 1h"))?;
    if d.is_zero() {
        return Err(format!("{text:?}: must be greater than zero"));
    }
    Ok(d)
}
