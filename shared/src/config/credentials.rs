//! NATS credentials read from a file: a credentials file, an nkey seed or `user:password`,
//! told apart by their content.

use std::fmt;
use std::path::{Path, PathBuf};

/// One NATS user's credentials, read from a file that holds one of: a credentials file (user
/// JWT and nkey seed, as nsc issues them: it has a `-----BEGIN NATS USER JWT-----` block), an
/// nkey seed (`SU...`), or `user:password` on one line.
#[derive(Clone, PartialEq, Eq)]
pub enum NatsCredentials {
    CredsFile(PathBuf),
    NkeyFile(PathBuf),
    UserPassword { user: String, password: String },
}

/// Why a credentials file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("cannot read it: {0}")]
    Unreadable(#[from] std::io::Error),
    #[error(
        "it holds neither a NATS credentials file (-----BEGIN NATS USER JWT-----), an nkey seed (SU...) nor user:password on one line"
    )]
    Unrecognized,
}

impl NatsCredentials {
    /// Reads `path` and tells which kind of credentials it holds.
    pub fn read(path: &Path) -> Result<NatsCredentials, CredentialsError> {
        let text = std::fs::read_to_string(path)?;
        NatsCredentials::recognize(path, &text)
    }

    pub(super) fn recognize(path: &Path, text: &str) -> Result<NatsCredentials, CredentialsError> {
        if text.contains("-----BEGIN NATS USER JWT-----") {
            return Ok(NatsCredentials::CredsFile(path.to_path_buf()));
        }
        let line = text.trim();
        if line.contains(['\n', '\r']) {
            return Err(CredentialsError::Unrecognized);
        }
        let seed = line.len() > 2
            && line.starts_with("SU")
            && line.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit());
        if seed {
            return Ok(NatsCredentials::NkeyFile(path.to_path_buf()));
        }
        match line.split_once(':') {
            Some((user, password)) if !user.is_empty() && !password.is_empty() => {
                Ok(NatsCredentials::UserPassword { user: user.to_string(), password: password.to_string() })
            }
            _ => Err(CredentialsError::Unrecognized),
        }
    }

    /// The kind, for logs and reports (never the secret).
    pub fn kind(&self) -> &'static str {
        match self {
            NatsCredentials::CredsFile(_) => "credentials file",
            NatsCredentials::NkeyFile(_) => "nkey seed",
            NatsCredentials::UserPassword { .. } => "user and password",
        }
    }
}

/// Never shows the password.
impl fmt::Debug for NatsCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NatsCredentials::CredsFile(path) => f.debug_tuple("CredsFile").field(path).finish(),
            NatsCredentials::NkeyFile(path) => f.debug_tuple("NkeyFile").field(path).finish(),
            NatsCredentials::UserPassword { user, .. } => {
                f.debug_struct("UserPassword").field("user", user).finish_non_exhaustive()
            }
        }
    }
}
