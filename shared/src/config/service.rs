//! The settings every service shares, as one group each service's `Config` flattens: the NATS
//! connection, the common settings and the topology.

use clap::Args;

use super::{CommonArgs, NatsArgs, Problems, common_problems, nats_problems, topology_problems};
use crate::topology::TopologyArgs;

/// The settings every service shares; its `--help` shows them under their own headings.
#[derive(Debug, Clone, Args)]
pub struct ServiceArgs {
    #[command(flatten)]
    pub nats: NatsArgs,
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub topology: TopologyArgs,
}

impl ServiceArgs {
    /// Defaults for a server at `url` (comma-separated) with no credentials, the instance id
    /// `instance_id` and an ephemeral admin port (tests, tools).
    pub fn for_tests(url: &str, instance_id: &str) -> ServiceArgs {
        ServiceArgs {
            nats: NatsArgs::plain(url),
            common: CommonArgs::for_tests(instance_id),
            topology: TopologyArgs::default(),
        }
    }

    /// Checks the NATS connection and credentials, prefix, instance id and topology sizes and
    /// durations. Each service's validation extends these problems with its own.
    pub fn problems(&self) -> Problems {
        let mut problems = Problems::new();
        nats_problems(&self.nats, &mut problems);
        common_problems(&self.common, &mut problems);
        topology_problems(&self.topology, &mut problems);
        problems
    }
}
