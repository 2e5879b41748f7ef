//! Limit keys: a template over the task's namespace, id and labels (`customer-{labels.customer}`)
//! expanded into the key runs are counted under, and its validation.
//!
//! A template is literal text `[A-Za-z0-9_-]` and placeholders `{namespace}`, `{id}` and
//! `{labels.<label>}`. Every value a template can use is in the spec, so a template is checked
//! whole when the spec is stored: an unknown placeholder, a character outside the key's
//! alphabet, a label the spec does not have, or an expansion that is not a valid key is refused
//! there. [`expand`] is pure and used again by the worker (a spec stored before a rule existed
//! gets a clear error then).

use std::collections::BTreeMap;

/// The longest key after expansion.
pub const MAX_KEY: usize = 128;

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece<'a> {
    Text(&'a str),
    Namespace,
    Id,
    Label(&'a str),
}

/// Whether `byte` may appear in a key (one KV key and subject token).
fn key_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-'
}

/// Whether `key` is a valid expanded key: `[A-Za-z0-9_-]{1,128}`.
pub fn valid_key(key: &str) -> bool {
    (1..=MAX_KEY).contains(&key.len()) && key.bytes().all(key_byte)
}

/// Splits a template into pieces; the message of the first problem otherwise.
fn pieces(template: &str) -> Result<Vec<Piece<'_>>, String> {
    let mut out = Vec::new();
    let mut rest = template;
    while !rest.is_empty() {
        match rest.find(['{', '}']) {
            Some(0) if rest.starts_with('}') => return Err("a `}` without its `{`".to_string()),
            Some(0) => {
                let end = rest.find('}').ok_or("a `{` without its `}`")?;
                let name = &rest[1..end];
                out.push(match name {
                    "namespace" => Piece::Namespace,
                    "id" => Piece::Id,
                    _ => match name.strip_prefix("labels.") {
                        Some(label) if !label.is_empty() => Piece::Label(label),
                        _ => {
                            return Err(format!(
                                "unknown placeholder {{{name}}}: use {{namespace}}, {{id}} or {{labels.<label>}}"
                            ));
                        }
                    },
                });
                rest = &rest[end + 1..];
            }
            found => {
                let end = found.unwrap_or(rest.len());
                let text = &rest[..end];
                if let Some(bad) = text.chars().find(|c| !c.is_ascii() || !key_byte(*c as u8)) {
                    return Err(format!("{bad:?} is not allowed: keys use [A-Za-z0-9_-] and placeholders"));
                }
                out.push(Piece::Text(text));
                rest = &rest[end..];
            }
        }
    }
    if out.is_empty() {
        return Err("must not be empty".to_string());
    }
    Ok(out)
}

/// Expands `template` for a task: its namespace, id and labels. The error says what is wrong
/// (a bad template, a missing label, or an expansion that is not a valid key).
pub fn expand(
    template: &str,
    namespace: &str,
    id: &str,
    labels: &BTreeMap<String, String>,
) -> Result<String, String> {
    let mut key = String::new();
    for piece in pieces(template)? {
        match piece {
            Piece::Text(text) => key.push_str(text),
            Piece::Namespace => key.push_str(namespace),
            Piece::Id => key.push_str(id),
            Piece::Label(label) => match labels.get(label) {
                Some(value) if value.bytes().all(key_byte) => key.push_str(value),
                Some(value) => {
                    return Err(format!(
                        "the value of label {label:?} ({value:?}) is not a valid key part ([A-Za-z0-9_-])"
                    ));
                }
                None => return Err(format!("the task has no label {label:?}")),
            },
        }
    }
    if !valid_key(&key) {
        return Err(format!("expands to {key:?}, which is not a valid key ([A-Za-z0-9_-]{{1,{MAX_KEY}}})"));
    }
    Ok(key)
}

/// Checks a template alone (no labels known): its syntax.
pub fn check_template(template: &str) -> Result<(), String> {
    pieces(template).map(|_| ())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn templates_expand_over_namespace_id_and_labels() {
        let l = labels(&[("customer", "acme"), ("team", "pay")]);
        assert_eq!(expand("payments-api", "ns", "t", &l).unwrap(), "payments-api");
        assert_eq!(expand("customer-{labels.customer}", "ns", "t", &l).unwrap(), "customer-acme");
        assert_eq!(expand("{namespace}_{id}-{labels.team}", "ns", "t", &l).unwrap(), "ns_t-pay");
    }

    #[test]
    fn bad_templates_and_expansions_are_refused_with_their_reason() {
        let l = labels(&[("spaced", "a b"), ("empty", "")]);
        let cases = [
            ("", "empty"),
            ("{colour}", "unknown placeholder"),
            ("{labels.}", "unknown placeholder"),
            ("a{id", "without its `}`"),
            ("a}", "without its `{`"),
            ("a.b", "not allowed"),
            ("naïve", "not allowed"),
            ("{labels.missing}", "no label \"missing\""),
            ("x-{labels.spaced}", "not a valid key part"),
            ("{labels.empty}", "not a valid key"),
        ];
        for (template, reason) in cases {
            let error = expand(template, "ns", "t", &l).unwrap_err();
            assert!(error.contains(reason), "{template:?}: {error}");
        }
        assert!(expand(&"k".repeat(129), "ns", "t", &l).is_err());
    }

    proptest! {
        /// Whatever the template and labels, an expansion that succeeds is a valid key, and a
        /// template of literal key text is its own expansion.
        #[test]
        fn an_expansion_is_a_valid_key_or_an_error(
            template in "[A-Za-z0-9_{}.-]{0,40}",
            value in "[ -~]{0,20}",
            literal in "[A-Za-z0-9_-]{1,128}",
        ) {
            let l = labels(&[("x", &value)]);
            if let Ok(key) = expand(&template, "ns", "id", &l) {
                prop_assert!(valid_key(&key));
            }
            prop_assert_eq!(expand(&literal, "ns", "id", &l).unwrap(), literal);
        }
    }
}
