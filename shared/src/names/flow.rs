//! Names of flow control: the de-duplication bucket and its keys, and the subject a debounced
//! task's pending run waits on.

use super::Names;

impl Names {
    /// De-duplication claims: [`dedupe_key`] → the first trigger's or submission's claim, each
    /// with its own time to live.
    pub fn dedupe_bucket(&self) -> String {
        format!("{}_DEDUPE", self.upper)
    }

    /// The pending run of a debounced task (one subject per task, so a newer trigger's message
    /// replaces the pending one): `jetsched.debounce.<namespace>.<task_id>`. No worker
    /// consumer's filter matches it: at its time the server publishes a copy to the run's
    /// dispatch subject.
    pub fn debounce_subject(&self, namespace: &str, task_id: &str) -> String {
        format!("{}.debounce.{namespace}.{task_id}", self.prefix)
    }
    /// Every debounced task's pending run: `jetsched.debounce.>`.
    pub fn debounce_wildcard(&self) -> String {
        format!("{}.debounce.>", self.prefix)
    }
}

/// What a de-duplication key was given to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DedupeScope {
    /// A trigger of the task (API `task.trigger`).
    Trigger,
    /// A spec submitted to the intake for the task.
    Submit,
}

/// The key of a claim in the de-duplication bucket: `<namespace>.<task_id>.<scope>.<key>`,
/// the user's key with every byte outside `[A-Za-z0-9_-]` written `=XX` (hex), so any key is
/// one valid token and two different keys never share a bucket key.
pub fn dedupe_key(namespace: &str, task_id: &str, scope: DedupeScope, key: &str) -> String {
    let scope = match scope {
        DedupeScope::Trigger => "trigger",
        DedupeScope::Submit => "submit",
    };
    let mut out = format!("{namespace}.{task_id}.{scope}.");
    for byte in key.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-' {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("={byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn flow_names_follow_the_prefix() {
        let names = Names::new("acme").expect("a valid prefix");
        assert_eq!(names.dedupe_bucket(), "ACME_DEDUPE");
        assert_eq!(names.debounce_subject("ns", "t"), "acme.debounce.ns.t");
        assert_eq!(names.debounce_wildcard(), "acme.debounce.>");
        assert_eq!(dedupe_key("ns", "t", DedupeScope::Trigger, "invoice-42"), "ns.t.trigger.invoice-42");
        assert_eq!(dedupe_key("ns", "t", DedupeScope::Submit, "a.b:c=d"), "ns.t.submit.a=2Eb=3Ac=3Dd");
    }

    proptest! {
        /// Distinct keys never share a bucket key, and every bucket key is a valid KV key.
        #[test]
        fn keys_are_injective_and_valid(a in "\\PC{1,20}", b in "\\PC{1,20}") {
            let (ka, kb) = (
                dedupe_key("ns", "t", DedupeScope::Trigger, &a),
                dedupe_key("ns", "t", DedupeScope::Trigger, &b),
            );
            prop_assert_eq!(ka == kb, a == b);
            prop_assert!(ka.chars().all(|c| c.is_ascii_alphanumeric() || "-_=.".contains(c)));
        }
    }
}
