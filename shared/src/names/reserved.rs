//! The subject spaces no task's `nats` executor may send a request to: the server's, the
//! replies' and this deployment's own.

use super::{DEFAULT_PREFIX, Names};

/// A subject space no task's `nats` executor may send a request to (see
/// [`Names::reserved_space`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReservedSpace {
    /// A first token starting with `$`: the server's own subjects (`$JS`, `$KV`, `$O`, `$SYS`,
    /// `$SRV`, `$JSC`, `$NRG`, `$MQTT`, ...). Their requests act with the requester's rights,
    /// and the server sends the answer wherever the reply subject points.
    Server,
    /// A first token `_INBOX...` or `_R_`: reply subjects, which deliver into another
    /// client's pending request.
    Replies,
    /// The prefix as first token (`jetsched.>`): dispatches, events, the API, control requests.
    Jetsched,
}

impl ReservedSpace {
    /// The space of `subject` among those every deployment reserves (the server's and the
    /// replies'), judged by its first token; jetsched's own needs the prefix:
    /// [`Names::reserved_space`].
    pub fn of(subject: &str) -> Option<ReservedSpace> {
        let first = subject.split('.').next().unwrap_or_default();
        if first.starts_with('$') {
            Some(ReservedSpace::Server)
        } else if first.starts_with("_INBOX") || first == "_R_" {
            Some(ReservedSpace::Replies)
        } else {
            None
        }
    }

    /// Why the space is reserved, in words (`names` gives jetsched's prefix).
    pub fn describe(self, names: Option<&Names>) -> String {
        match self {
            ReservedSpace::Server => "subjects whose first token starts with `$` belong to the NATS server \
                 (JetStream, KV, object store, system and service APIs)"
                .to_string(),
            ReservedSpace::Replies => {
                "reply subjects (`_INBOX...`, `_R_`) belong to other clients' requests".to_string()
            }
            ReservedSpace::Jetsched => format!(
                "`{}.>` is jetsched's own subject space (dispatches, events, the API, control requests)",
                names.map_or(DEFAULT_PREFIX, Names::prefix)
            ),
        }
    }
}

impl Names {
    /// The reserved space `subject` lies in, if any: the server's, the replies' or this
    /// deployment's own (its first token is the prefix).
    pub fn reserved_space(&self, subject: &str) -> Option<ReservedSpace> {
        ReservedSpace::of(subject).or_else(|| {
            (subject.split('.').next() == Some(self.prefix.as_str())).then_some(ReservedSpace::Jetsched)
        })
    }
}
