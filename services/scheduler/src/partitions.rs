//! Figures per partition: the tasks of each partition this replica follows, and the fires it
//! dispatched for each (`jetsched_partition_tasks`, `jetsched_partition_fires_total`). A
//! task's partition is a hash of its key ([`jetsched_shared::partition`]); the handles of every
//! partition are made once, so a fire costs a hash and an increment.

use jetsched_shared::metrics::{counter_vec, gauge_vec};
use jetsched_shared::partition::partition_of;
use prometheus::{IntCounter, IntGauge, Registry};

use crate::tasks::TaskInfo;

pub(crate) struct Partitions {
    count: u16,
    tasks: Vec<IntGauge>,
    fires: Vec<IntCounter>,
}

impl Partitions {
    /// The figures of `count` partitions, registered on `registry`.
    pub(crate) fn register(registry: &Registry, count: u16) -> anyhow::Result<Partitions> {
        let tasks = gauge_vec(
            registry,
            "jetsched_partition_tasks",
            "Tasks this replica follows, by partition",
            &["partition"],
        )?;
        let fires = counter_vec(
            registry,
            "jetsched_partition_fires_total",
            "Fires stored in the dispatch stream, by partition",
            &["partition"],
        )?;
        let labels: Vec<String> = (0..count).map(|p| p.to_string()).collect();
        Ok(Partitions {
            count,
            tasks: labels.iter().map(|p| tasks.with_label_values(&[p.as_str()])).collect(),
            fires: labels.iter().map(|p| fires.with_label_values(&[p.as_str()])).collect(),
        })
    }

    fn of(&self, info: &TaskInfo) -> usize {
        usize::from(partition_of(info.namespace(), info.task_id(), self.count))
    }

    /// A task joined the table.
    pub(crate) fn added(&self, info: &TaskInfo) {
        self.tasks[self.of(info)].inc();
    }

    /// A task left the table.
    pub(crate) fn removed(&self, info: &TaskInfo) {
        self.tasks[self.of(info)].dec();
    }

    /// A fire of the task was stored (the first time).
    pub(crate) fn fired(&self, info: &TaskInfo) {
        self.fires[self.of(info)].inc();
    }
}

#[cfg(test)]
mod tests {
    use jetsched_shared::spec::TaskSpec;

    use super::*;

    fn info(namespace: &str, id: &str) -> TaskInfo {
        let json = serde_json::json!({"namespace": namespace, "id": id, "schedule": {"every": "1s"},
                                      "executor": {"kind": "nats", "subject": "s"}});
        let spec: TaskSpec = serde_json::from_value(json.clone()).expect("a spec");
        TaskInfo::new(spec, json.to_string().as_bytes(), 1, 0)
    }

    #[test]
    fn each_task_counts_in_its_own_partition_and_leaves_it_when_removed() {
        let registry = Registry::new();
        let partitions = Partitions::register(&registry, 64).expect("register");
        let (a, b) = (info("demo", "hello"), info("billing", "payroll"));
        partitions.added(&a);
        partitions.added(&b);
        partitions.fired(&a);
        partitions.fired(&a);
        partitions.removed(&b);
        let value = |name: &str, partition: &str| -> f64 {
            let families = registry.gather();
            let family = families.iter().find(|f| f.name() == name).expect(name);
            let metric = family.get_metric().iter().find(|m| m.get_label()[0].value() == partition);
            metric.map_or(f64::NAN, |m| m.get_gauge().get_value() + m.get_counter().get_value())
        };
        // The partitions of these two tasks are pinned in `jetsched_shared::partition`.
        assert_eq!(value("jetsched_partition_tasks", "16"), 1.0);
        assert_eq!(value("jetsched_partition_tasks", "48"), 0.0);
        assert_eq!(value("jetsched_partition_fires_total", "16"), 2.0);
        assert_eq!(value("jetsched_partition_fires_total", "48"), 0.0);
        assert_eq!(value("jetsched_partition_tasks", "0"), 0.0, "every partition is exported");
    }
}
