//! The executor part of a task spec: what a worker does when the task fires.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde_json::{Value, json};

use super::schema;
use crate::error::{ApiError, ErrorCode};
use crate::field::{Obj, Problems, err, wrong_type};
use crate::names::{Names, ReservedSpace};

/// What a worker runs for a fire. JSON: `{"kind": "http" | "nats" | "shell" | "handler", ...fields}`.
#[derive(Debug, Clone, PartialEq, JsonSchema)]
#[schemars(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Executor {
    /// An HTTP request; 2xx is success.
    Http {
        /// `GET POST PUT PATCH DELETE HEAD` in any case, stored upper-case (default `POST`).
        #[schemars(default = "schema::post", pattern(r"^(?:[Gg][Ee][Tt]|[Pp][Oo][Ss][Tt]|[Pp][Uu][Tt]|[Pp][Aa][Tt][Cc][Hh]|[Dd][Ee][Ll][Ee][Tt][Ee]|[Hh][Ee][Aa][Dd])$"))]
        method: String,
        /// An `http://` or `https://` URL with a host.
        #[schemars(pattern(r"^[Hh][Tt][Tt][Pp][Ss]?://[^/?#\s]+([/?#]\S*)?$"))]
        url: String,
        #[schemars(default = "schema::empty_map", extend("propertyNames" = {"pattern": HEADER_NAME}))]
        headers: BTreeMap<String, String>,
        body: Option<Value>,
    },
    /// A NATS request to `subject` (no wildcards; never in a reserved space: see
    /// [`Executor::check_confined`]).
    Nats {
        #[schemars(length(min = 1, max = 255), pattern(r"^[^.\s*>]+(\.[^.\s*>]+)*$"))]
        subject: String,
        payload: Option<Value>,
        #[schemars(default = "schema::empty_map", extend("propertyNames" = {"pattern": HEADER_NAME}))]
        headers: BTreeMap<String, String>,
    },
    /// A process started with `command` as argv (only on workers with an explicit allow-list).
    Shell {
        #[schemars(length(min = 1))]
        command: Vec<String>,
        #[schemars(default = "schema::empty_map", extend("propertyNames" = {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$"}))]
        env: BTreeMap<String, String>,
        #[schemars(length(min = 1))]
        cwd: Option<String>,
    },
    /// A named Rust handler registered by a program embedding the worker library.
    Handler {
        #[schemars(pattern(r"^[A-Za-z0-9_.-]{1,128}$"))]
        name: String,
        payload: Option<Value>,
    },
}

/// Header names are HTTP tokens (the schema's pattern for them).
const HEADER_NAME: &str = "^[A-Za-z0-9!#$%&'*+.^_`|~-]+$";

const HTTP_METHODS: &[&str] = &["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"];

impl Executor {
    /// The `kind` string: `http`, `nats`, `shell` or `handler`.
    pub fn kind(&self) -> &'static str {
        match self {
            Executor::Http { .. } => "http",
            Executor::Nats { .. } => "nats",
            Executor::Shell { .. } => "shell",
            Executor::Handler { .. } => "handler",
        }
    }

    /// Whether a worker may carry out this executor with the rights it holds, for a deployment
    /// whose names are `names`: a `nats` subject must lie outside the reserved spaces (see
    /// [`confined_subject`]). The registry checks it when it stores a spec, and the worker
    /// again before every request (a spec stored before the rule, or written straight into
    /// the tasks bucket, is refused there). The other kinds are confined by the worker itself
    /// (`http` destinations after name resolution, `shell` programs per namespace).
    pub fn check_confined(&self, names: &Names) -> Result<(), ApiError> {
        match self {
            Executor::Nats { subject, .. } => confined_subject(subject, names),
            Executor::Http { .. } | Executor::Shell { .. } | Executor::Handler { .. } => Ok(()),
        }
    }

    /// The part of [`check_confined`](Self::check_confined) that needs no deployment names,
    /// applied when a spec is admitted (`TaskSpec::admit`).
    pub(super) fn check_admissible(&self) -> Result<(), ApiError> {
        match self {
            Executor::Nats { subject, .. } => match ReservedSpace::of(subject) {
                Some(space) => Err(refused_subject(subject, space, None)),
                None => Ok(()),
            },
            Executor::Http { .. } | Executor::Shell { .. } | Executor::Handler { .. } => Ok(()),
        }
    }

    /// Reads the `executor` object at `path`, recording each of its problems; `None` when it
    /// has one. Without a known `kind` its other fields cannot be judged.
    pub(crate) fn read(value: &Value, path: &str, problems: &mut Problems) -> Option<Executor> {
        let obj = problems.take(Obj::new(value, path))?;
        match problems.take(obj.required_string("kind"))? {
            "http" => {
                obj.deny_unknown(&["kind", "method", "url", "headers", "body"], problems);
                let method = problems
                    .take(obj.string("method").and_then(|method| parse_method(&obj.path("method"), method)));
                let url = problems.take(
                    obj.required_string("url")
                        .and_then(|url| validate_url(&obj.path("url"), url).map(|()| url)),
                );
                let headers = obj.string_map("headers", check_header, problems);
                let body = obj.get("body").cloned();
                Some(Executor::Http { method: method?, url: url?.to_owned(), headers: headers?, body })
            }
            "nats" => {
                obj.deny_unknown(&["kind", "subject", "payload", "headers"], problems);
                let subject =
                    problems.take(obj.required_string("subject").and_then(|subject| {
                        validate_subject(&obj.path("subject"), subject).map(|()| subject)
                    }));
                let headers = obj.string_map("headers", check_header, problems);
                let payload = obj.get("payload").cloned();
                Some(Executor::Nats { subject: subject?.to_owned(), payload, headers: headers? })
            }
            "shell" => {
                obj.deny_unknown(&["kind", "command", "env", "cwd"], problems);
                let command = read_command(&obj, problems);
                let env = obj.string_map("env", check_env, problems);
                let cwd = problems.take(obj.string("cwd").and_then(|cwd| {
                    if cwd.is_some_and(|c| c.is_empty() || c.contains('\0')) {
                        return Err(err(
                            ErrorCode::InvalidValue,
                            &obj.path("cwd"),
                            "must be a non-empty path",
                        ));
                    }
                    Ok(cwd)
                }));
                Some(Executor::Shell { command: command?, env: env?, cwd: cwd?.map(str::to_owned) })
            }
            "handler" => {
                obj.deny_unknown(&["kind", "name", "payload"], problems);
                let name = problems.take(
                    obj.required_string("name")
                        .and_then(|name| validate_handler_name(&obj.path("name"), name).map(|()| name)),
                );
                let payload = obj.get("payload").cloned();
                Some(Executor::Handler { name: name?.to_owned(), payload })
            }
            other => {
                problems.push(err(
                    ErrorCode::InvalidValue,
                    &obj.path("kind"),
                    format!("unknown executor kind {other:?}; expected http, nats, shell or handler"),
                ));
                None
            }
        }
    }

    /// The canonical JSON form (empty maps included, absent options left out).
    pub(crate) fn to_json(&self) -> Value {
        match self {
            Executor::Http { method, url, headers, body } => {
                let mut v = json!({"kind": "http", "method": method, "url": url, "headers": headers});
                if let Some(body) = body {
                    v["body"] = body.clone();
                }
                v
            }
            Executor::Nats { subject, payload, headers } => {
                let mut v = json!({"kind": "nats", "subject": subject, "headers": headers});
                if let Some(payload) = payload {
                    v["payload"] = payload.clone();
                }
                v
            }
            Executor::Shell { command, env, cwd } => {
                let mut v = json!({"kind": "shell", "command": command, "env": env});
                if let Some(cwd) = cwd {
                    v["cwd"] = Value::String(cwd.clone());
                }
                v
            }
            Executor::Handler { name, payload } => {
                let mut v = json!({"kind": "handler", "name": name});
                if let Some(payload) = payload {
                    v["payload"] = payload.clone();
                }
                v
            }
        }
    }
}

/// A shell command: a non-empty array of strings without NUL, the program not blank. Each bad
/// argument is a problem of its own.
fn read_command(obj: &Obj<'_>, problems: &mut Problems) -> Option<Vec<String>> {
    problems.take(obj.required("command"))?;
    let items = problems.take(obj.array("command"))?.map(Vec::as_slice).unwrap_or_default();
    let path = obj.path("command");
    if items.is_empty() {
        problems.push(err(ErrorCode::InvalidValue, &path, "must name a program: [\"prog\", \"arg\", ...]"));
        return None;
    }
    let mut command = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let item_path = format!("{path}.{i}");
        match item {
            Value::String(arg) if arg.contains('\0') => {
                problems.push(err(ErrorCode::InvalidValue, &item_path, "must not contain NUL"));
            }
            Value::String(arg) => command.push(arg.clone()),
            other => problems.push(wrong_type(&item_path, "a string", other)),
        }
    }
    if command.len() != items.len() {
        return None;
    }
    if command[0].trim().is_empty() {
        problems.push(err(ErrorCode::InvalidValue, &format!("{path}.0"), "the program must not be empty"));
        return None;
    }
    Some(command)
}

/// Environment variable names match `[A-Za-z_][A-Za-z0-9_]*`; values hold no NUL.
fn check_env(path: &str, name: &str, value: &str) -> Result<(), ApiError> {
    let mut chars = name.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !ok {
        return Err(err(ErrorCode::InvalidValue, path, "variable names match [A-Za-z_][A-Za-z0-9_]*"));
    }
    if value.contains('\0') {
        return Err(err(ErrorCode::InvalidValue, path, "must not contain NUL"));
    }
    Ok(())
}

/// An HTTP method, upper-cased; `POST` when absent.
pub(super) fn parse_method(path: &str, method: Option<&str>) -> Result<String, ApiError> {
    let Some(m) = method else { return Ok("POST".to_owned()) };
    let upper = m.to_ascii_uppercase();
    if !HTTP_METHODS.contains(&upper.as_str()) {
        return Err(err(
            ErrorCode::InvalidValue,
            path,
            format!("unsupported method {m:?}; expected one of {}", HTTP_METHODS.join(", ")),
        ));
    }
    Ok(upper)
}

/// Handler names match `[A-Za-z0-9_.-]{1,128}`.
pub(super) fn validate_handler_name(path: &str, name: &str) -> Result<(), ApiError> {
    let ok = (1..=128).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(err(ErrorCode::InvalidId, path, "handler names match [A-Za-z0-9_.-]{1,128}"))
    }
}

/// Header names are HTTP tokens (which NATS accepts too); values hold no line breaks.
pub(super) fn check_header(path: &str, name: &str, value: &str) -> Result<(), ApiError> {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || !name.bytes().all(token) {
        return Err(err(ErrorCode::InvalidValue, path, format!("{name:?} is not a valid header name")));
    }
    if value.chars().any(|c| c.is_control() && c != '\t') {
        return Err(err(ErrorCode::InvalidValue, path, "header values must not contain control characters"));
    }
    Ok(())
}

/// `http://` or `https://`, a non-empty host, an optional numeric port, no whitespace.
pub(super) fn validate_url(path: &str, url: &str) -> Result<(), ApiError> {
    let bad = |why: &str| err(ErrorCode::InvalidValue, path, format!("{url:?} is not a valid URL: {why}"));
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    let rest = if lower.starts_with("https://") {
        &url[8..]
    } else if lower.starts_with("http://") {
        &url[7..]
    } else {
        return Err(bad("the scheme must be http:// or https://"));
    };
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad("it contains whitespace"));
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    let (host, port) = if let Some(v6) = host_port.strip_prefix('[') {
        let (inside, after) = v6.split_once(']').ok_or_else(|| bad("unclosed '[' in the host"))?;
        (inside, after.strip_prefix(':'))
    } else {
        match host_port.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (host_port, None),
        }
    };
    if host.is_empty() {
        return Err(bad("it has no host"));
    }
    if let Some(port) = port
        && port.parse::<u16>().is_err()
    {
        return Err(bad("the port must be a number up to 65535"));
    }
    Ok(())
}

/// A publishable NATS subject: dot-separated non-empty tokens, no wildcards, no whitespace.
pub(super) fn validate_subject(path: &str, subject: &str) -> Result<(), ApiError> {
    let bad =
        |why: &str| err(ErrorCode::InvalidValue, path, format!("{subject:?} is not a valid subject: {why}"));
    if subject.is_empty() || subject.len() > 255 {
        return Err(bad("it must be 1 to 255 bytes long"));
    }
    if subject.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad("it contains whitespace"));
    }
    for token in subject.split('.') {
        if token.is_empty() {
            return Err(bad("it has an empty token"));
        }
        if token == "*" || token == ">" {
            return Err(bad("wildcards are not allowed"));
        }
    }
    Ok(())
}

fn refused_subject(subject: &str, space: ReservedSpace, names: Option<&Names>) -> ApiError {
    let why = space.describe(names);
    err(ErrorCode::InvalidValue, "executor.subject", format!("{subject:?} is refused: {why}"))
}

/// Checks that a `nats` executor's `subject` stays out of the reserved spaces: the server's
/// (`$...`), reply subjects (`_INBOX...`, `_R_`) and jetsched's own (`<prefix>.>`: dispatches,
/// events, the API, control requests). A refusal is `invalid_value` at `executor.subject`.
pub fn confined_subject(subject: &str, names: &Names) -> Result<(), ApiError> {
    match names.reserved_space(subject) {
        Some(space) => Err(refused_subject(subject, space, Some(names))),
        None => Ok(()),
    }
}
