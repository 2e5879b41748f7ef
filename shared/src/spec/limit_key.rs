//! Keys of flow-control limits (`rate_limit.key`): a literal or a template over the task's
//! namespace, id and labels (`customer-{labels.customer}`), expanded by the pure [`expand`].
//!
//! A template is literal text `[A-Za-z0-9_-]` with placeholders `{namespace}`, `{id}` and
//! `{labels.<name>}`; the expanded key must match `[A-Za-z0-9_-]{1,128}` (it becomes a KV key
//! and an event subject token). A spec carries its labels, so [`check`] expands the template
//! at `put` and refuses what could never expand: an unknown placeholder, a bad character in the
//! text or in a label's value, a label the spec does not have, a key too long.

use std::collections::BTreeMap;

/// The longest expanded key.
pub const MAX_KEY: usize = 128;

/// Why a template does not expand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    /// `{...}` names no known placeholder (or a `{` is not closed, a `}` not opened).
    UnknownPlaceholder(String),
    /// The template's own text has a character outside `[A-Za-z0-9_-]`.
    BadCharacter(char),
    /// `{labels.<name>}` names a label the task does not have.
    MissingLabel(String),
    /// A label's value has a character outside `[A-Za-z0-9_-]` (or is empty).
    BadLabelValue(String),
    /// The expanded key is empty or longer than [`MAX_KEY`].
    Length(usize),
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyError::UnknownPlaceholder(p) => {
                write!(f, "{p:?} is not a placeholder: use {{namespace}}, {{id}} or {{labels.<name>}}")
            }
            KeyError::BadCharacter(c) => {
                write!(f, "{c:?} is not allowed: a key's text is [A-Za-z0-9_-] and placeholders")
            }
            KeyError::MissingLabel(name) => write!(f, "the task has no label {name:?}"),
            KeyError::BadLabelValue(name) => {
                write!(f, "the value of label {name:?} must match [A-Za-z0-9_-]+ to be part of a key")
            }
            KeyError::Length(n) => {
                write!(f, "the key is {n} characters once expanded; 1 to {MAX_KEY} allowed")
            }
        }
    }
}

fn key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// Expands `template` for the task `namespace`/`id` with `labels`.
pub fn expand(
    template: &str,
    namespace: &str,
    id: &str,
    labels: &BTreeMap<String, String>,
) -> Result<String, KeyError> {
    let mut key = String::with_capacity(template.len() + 16);
    let mut rest = template;
    while let Some(c) = rest.chars().next() {
        match c {
            '{' => {
                let Some(end) = rest.find('}') else {
                    return Err(KeyError::UnknownPlaceholder(rest.to_string()));
                };
                let name = &rest[1..end];
                match name {
                    "namespace" => key.push_str(namespace),
                    "id" => key.push_str(id),
                    _ => {
                        let label = name
                            .strip_prefix("labels.")
                            .ok_or_else(|| KeyError::UnknownPlaceholder(rest[..=end].to_string()))?;
                        let value =
                            labels.get(label).ok_or_else(|| KeyError::MissingLabel(label.to_string()))?;
                        if value.is_empty() || !value.chars().all(key_char) {
                            return Err(KeyError::BadLabelValue(label.to_string()));
                        }
                        key.push_str(value);
                    }
                }
                rest = &rest[end + 1..];
            }
            '}' => return Err(KeyError::UnknownPlaceholder(rest.to_string())),
            c if key_char(c) => {
                key.push(c);
                rest = &rest[1..];
            }
            c => return Err(KeyError::BadCharacter(c)),
        }
    }
    if key.is_empty() || key.len() > MAX_KEY {
        return Err(KeyError::Length(key.len()));
    }
    Ok(key)
}

/// Checks `template` at `put`: it expands for this task (every error named).
pub fn check(
    template: &str,
    namespace: &str,
    id: &str,
    labels: &BTreeMap<String, String>,
) -> Result<(), KeyError> {
    expand(template, namespace, id, labels).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn literals_and_placeholders_expand() {
        let l = labels(&[("customer", "acme"), ("team.name", "a_b")]);
        assert_eq!(expand("exports", "ns", "t", &l).unwrap(), "exports");
        assert_eq!(expand("customer-{labels.customer}", "ns", "t", &l).unwrap(), "customer-acme");
        assert_eq!(expand("{namespace}-{id}", "ns", "t", &l).unwrap(), "ns-t");
        assert_eq!(expand("{labels.team.name}", "ns", "t", &l).unwrap(), "a_b");
    }

    #[test]
    fn bad_templates_are_named() {
        let l = labels(&[("customer", "acme corp")]);
        let e = |t: &str| expand(t, "ns", "t", &l).unwrap_err();
        assert_eq!(e("{task}"), KeyError::UnknownPlaceholder("{task}".into()));
        assert_eq!(e("a{id"), KeyError::UnknownPlaceholder("{id".into()));
        assert_eq!(e("a}"), KeyError::UnknownPlaceholder("}".into()));
        assert_eq!(e("a.b"), KeyError::BadCharacter('.'));
        assert_eq!(e("{labels.region}"), KeyError::MissingLabel("region".into()));
        assert_eq!(e("{labels.customer}"), KeyError::BadLabelValue("customer".into()));
        assert_eq!(e(""), KeyError::Length(0));
        assert_eq!(e(&"x".repeat(129)), KeyError::Length(129));
    }

    proptest! {
        /// Whatever expands is a valid key, and a literal expands to itself.
        #[test]
        fn expansions_are_valid_keys(template in "[A-Za-z0-9_{}.-]{0,40}", value in "[a-z .]{0,5}") {
            let l = labels(&[("c", value.as_str())]);
            if let Ok(key) = expand(&template, "ns", "id", &l) {
                prop_assert!(!key.is_empty() && key.len() <= MAX_KEY && key.chars().all(key_char));
            }
            if !template.is_empty() && template.chars().all(key_char) {
                prop_assert_eq!(expand(&template, "ns", "id", &l).unwrap(), template);
            }
        }
    }
}
