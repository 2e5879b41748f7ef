//! Names of concurrency limits: the bucket every worker counts slots in, its keys, and the
//! operators' limits API.

use super::Names;

/// The prefix of a concurrency key in the limits bucket.
const CONCURRENCY: &str = "concurrency.";

/// `concurrency.<namespace>.<key>`: a concurrency key's entry in the limits bucket.
pub fn concurrency_key(namespace: &str, key: &str) -> String {
    format!("{CONCURRENCY}{namespace}.{key}")
}

/// `<namespace>.<key>` of a limits bucket key, as the API, the CLI and metrics name it.
pub fn limit_name(bucket_key: &str) -> Option<&str> {
    bucket_key.strip_prefix(CONCURRENCY).filter(|rest| rest.split_once('.').is_some())
}

/// Reason of a run's `held` record and `run.held` event while it waits for a concurrency slot.
pub const CONCURRENCY_LIMIT: &str = "concurrency_limit";

impl Names {
    /// Concurrency limits shared by every worker: [`concurrency_key`] → the key's holders (with
    /// leases), waiting runs and operator override.
    pub fn limits_bucket(&self) -> String {
        format!("{}_LIMITS", self.upper)
    }

    /// `jetsched.api.limits` — the group of the limits endpoints (`list`, `set`, `clear`), for
    /// operators only.
    pub fn limits_api_group(&self) -> String {
        format!("{}.api.limits", self.prefix)
    }

    /// `jetsched.api.limits.<endpoint>`.
    pub fn limits_api_subject(&self, endpoint: &str) -> String {
        format!("{}.{endpoint}", self.limits_api_group())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_named_from_the_prefix() {
        let names = Names::new("acme").expect("a valid prefix");
        assert_eq!(names.limits_bucket(), "ACME_LIMITS");
        assert_eq!(names.limits_api_subject("list"), "acme.api.limits.list");
        assert_eq!(concurrency_key("ns", "pay-api"), "concurrency.ns.pay-api");
        assert_eq!(limit_name("concurrency.ns.pay-api"), Some("ns.pay-api"));
        assert_eq!(limit_name("concurrency.nokey"), None);
        assert_eq!(limit_name("other.ns.k"), None);
    }
}
