//! Partitions: every task belongs to one of a fixed number of partitions, by a stable hash of
//! its namespace and id.
//!
//! The number is fixed when the topology is created and recorded in the dispatch stream's
//! metadata (`jetsched_partitions`, see `nats stream info JETSCHED_DISPATCH`): every service
//! checks it at start and refuses a deployment configured with another number, so no two
//! replicas ever disagree on which partition a task is in. The hash is xxHash64 (seed 0) of the
//! namespace, a zero byte and the task id: specified, and the same on every platform and in
//! every version.

use std::hash::Hasher;

use twox_hash::XxHash64;

/// Partitions of a new topology.
pub const DEFAULT_PARTITIONS: u16 = 64;
/// The largest number of partitions a topology may have.
pub const MAX_PARTITIONS: u16 = 4096;
/// The dispatch stream's metadata key that records the topology's number of partitions.
pub const METADATA_KEY: &str = "jetsched_partitions";

/// The partition (`0..partitions`) of task `task_id` of `namespace`.
///
/// # Panics
///
/// If `partitions` is 0 (the topology refuses it).
pub fn partition_of(namespace: &str, task_id: &str, partitions: u16) -> u16 {
    assert!(partitions > 0, "a topology has at least one partition");
    let mut hasher = XxHash64::with_seed(0);
    hasher.write(namespace.as_bytes());
    // Namespaces never contain a zero byte: ("a", "bc") and ("ab", "c") hash apart.
    hasher.write(&[0]);
    hasher.write(task_id.as_bytes());
    (hasher.finish() % u64::from(partitions)) as u16
}

/// Why a number of partitions is refused, if it is.
pub fn invalid(partitions: u16) -> Option<String> {
    (partitions == 0 || partitions > MAX_PARTITIONS)
        .then(|| format!("{partitions} (use 1..={MAX_PARTITIONS})"))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn the_hash_is_xxhash64_of_namespace_zero_and_id() {
        // The published xxHash64 test vector of the empty input, seed 0.
        assert_eq!(XxHash64::oneshot(0, b""), 0xEF46_DB37_51D8_E999);
        let whole = XxHash64::oneshot(0, b"billing\0payroll");
        assert_eq!(u64::from(partition_of("billing", "payroll", MAX_PARTITIONS)), whole % 4096);
        assert_eq!(partition_of("billing", "payroll", 1), 0);
    }

    #[test]
    fn partitions_of_known_tasks_never_change() {
        // Pinned values, computed independently with the reference C library of xxHash: a
        // change here would move tasks between partitions of a running deployment.
        let pinned: Vec<u16> = [("demo", "hello"), ("billing", "payroll"), ("a", "bc"), ("ab", "c")]
            .iter()
            .map(|(ns, id)| partition_of(ns, id, DEFAULT_PARTITIONS))
            .collect();
        assert_eq!(pinned, PINNED);
    }

    const PINNED: [u16; 4] = [16, 48, 39, 13];

    #[test]
    fn a_hundred_thousand_tasks_spread_evenly_over_the_default_partitions() {
        let partitions = usize::from(DEFAULT_PARTITIONS);
        let tasks = 100_000;
        let mut counts = vec![0u32; partitions];
        for i in 0..tasks {
            let namespace = ["demo", "billing", "ops"][i % 3];
            counts[usize::from(partition_of(namespace, &format!("task-{i}"), DEFAULT_PARTITIONS))] += 1;
        }
        // Chi-square with 63 degrees of freedom: 110 is beyond its 99.98th percentile.
        let expected = tasks as f64 / partitions as f64;
        let chi2: f64 = counts.iter().map(|&c| (f64::from(c) - expected).powi(2) / expected).sum();
        assert!(chi2 < 110.0, "chi-square {chi2:.1}, counts {counts:?}");
    }

    #[test]
    fn invalid_counts_are_named() {
        assert_eq!(invalid(0).as_deref(), Some("0 (use 1..=4096)"));
        assert_eq!(invalid(4097).as_deref(), Some("4097 (use 1..=4096)"));
        assert_eq!(invalid(1), None);
        assert_eq!(invalid(DEFAULT_PARTITIONS), None);
    }

    proptest! {
        #[test]
        fn every_task_has_one_partition_in_range(
            namespace in "[a-z][a-z0-9-]{0,20}",
            id in "[A-Za-z0-9._-]{1,40}",
            partitions in 1u16..=MAX_PARTITIONS,
        ) {
            let p = partition_of(&namespace, &id, partitions);
            prop_assert!(p < partitions);
            prop_assert_eq!(p, partition_of(&namespace, &id, partitions));
        }
    }
}
