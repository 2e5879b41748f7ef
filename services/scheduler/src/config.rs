//! Scheduler configuration: every setting is a flag and an environment variable; `validate`
//! reports every problem at once.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use jetsched_shared::config::{InvalidConfig, ServiceArgs, loopback, parse_duration};

/// The jetsched scheduler: follows the tasks bucket, holds the leader lease and, while leader,
/// dispatches every fire exactly once to the dispatch stream.
#[derive(Debug, Clone, Parser)]
#[command(name = "jetsched-scheduler", version, after_help = jetsched_shared::telemetry::ENV_HELP)]
pub struct Config {
    #[command(flatten)]
    pub shared: ServiceArgs,
    /// Dispatch publishes awaiting their ack at once (the bounded publish window).
    #[arg(long, env = "JETSCHED_SCHEDULER_PUBLISH_WINDOW", default_value_t = DEFAULT_PUBLISH_WINDOW)]
    pub publish_window: usize,
    /// How often dirty fire state is written to the state bucket (writes are coalesced).
    #[arg(long, env = "JETSCHED_SCHEDULER_STATE_FLUSH", default_value = "50ms", value_parser = parse_duration)]
    pub state_flush: Duration,
    /// Safety margin: the leader stops dispatching this long before its lease could expire.
    #[arg(long, env = "JETSCHED_SCHEDULER_LEASE_MARGIN", default_value = "500ms", value_parser = parse_duration)]
    pub lease_margin: Duration,
    /// A fire dispatched at most this late (after a failover, a stall) is an ordinary fire;
    /// older ones follow the task's misfire policy.
    #[arg(long, env = "JETSCHED_SCHEDULER_MISFIRE_THRESHOLD", default_value = "10s", value_parser = parse_duration)]
    pub misfire_threshold: Duration,
    /// Most catch-up fires (fire_all) or skip events (skip) per task after a failover; older
    /// occurrences are counted as missed.
    #[arg(long, env = "JETSCHED_SCHEDULER_CATCHUP_MAX", default_value_t = 100)]
    pub catchup_max: usize,
    /// Catch-up fires dispatched per second at most (ordinary fires are not limited).
    #[arg(long, env = "JETSCHED_SCHEDULER_CATCHUP_RATE", default_value_t = 5000)]
    pub catchup_rate: u32,
    /// Publish a `fire.dispatched` event per fire (the metric is kept either way).
    #[arg(long, env = "JETSCHED_SCHEDULER_FIRE_EVENTS", default_value_t = true, action = clap::ArgAction::Set)]
    pub fire_events: bool,
    /// Largest offset of the local clock from the NATS server's before this replica counts as
    /// skewed: it then campaigns one lease later and publishes a `scheduler.clock_skew` event
    /// (fires follow the server's clock either way).
    #[arg(long, env = "JETSCHED_SCHEDULER_MAX_CLOCK_SKEW", default_value = "1s", value_parser = parse_duration)]
    pub max_clock_skew: Duration,
    /// Nominal times of a backfill dispatched per batch: one batch's publishes are in flight at
    /// once, and the live schedule's fires go first between batches.
    #[arg(long, env = "JETSCHED_SCHEDULER_BACKFILL_BATCH", default_value_t = DEFAULT_BACKFILL_BATCH)]
    pub backfill_batch: usize,
    /// A backfill's publishes awaiting their acknowledgement at once: the live schedule's fires
    /// wait behind at most this many in the dispatch stream (fewer: less lag added to the live
    /// fires while a backfill runs, a slower backfill).
    #[arg(long, env = "JETSCHED_SCHEDULER_BACKFILL_IN_FLIGHT", default_value_t = DEFAULT_BACKFILL_IN_FLIGHT)]
    pub backfill_in_flight: usize,
}

/// The default backfill publishes in flight.
pub const DEFAULT_BACKFILL_IN_FLIGHT: usize = 64;

/// The default backfill batch.
pub const DEFAULT_BACKFILL_BATCH: usize = 500;

/// The default publish window: wide enough that a burst of due fires is bound by what the
/// server can store, not by the acknowledgements' round trip (512 left the two cores idle a
/// fifth of a 100k burst; 2,048 and 4,096 finished it sooner).
pub const DEFAULT_PUBLISH_WINDOW: usize = 4096;

/// Default admin listener of the scheduler.
pub const DEFAULT_ADMIN_ADDR: SocketAddr = loopback(9102);

impl Config {
    /// A configuration for a server at `url` with defaults, an ephemeral admin port (tests).
    pub fn for_tests(url: &str) -> Config {
        Config {
            shared: ServiceArgs::for_tests(url, "scheduler-test"),
            publish_window: DEFAULT_PUBLISH_WINDOW,
            state_flush: Duration::from_millis(50),
            lease_margin: Duration::from_millis(500),
            misfire_threshold: Duration::from_secs(10),
            catchup_max: 100,
            catchup_rate: 5000,
            fire_events: true,
            max_clock_skew: Duration::from_secs(1),
            backfill_batch: DEFAULT_BACKFILL_BATCH,
            backfill_in_flight: DEFAULT_BACKFILL_IN_FLIGHT,
        }
    }

    /// Checks every setting (the shared ones too) and reports every problem at once.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        let mut problems = self.shared.problems();
        problems.at_least("publish-window", self.publish_window, 1);
        problems.positive("state-flush", self.state_flush);
        problems.positive("lease-margin", self.lease_margin);
        problems.shorter("lease-margin", self.lease_margin, "lease", self.shared.topology.lease);
        problems.positive("misfire-threshold", self.misfire_threshold);
        problems.at_least("catchup-max", self.catchup_max, 1);
        problems.at_least("catchup-rate", self.catchup_rate, 1);
        problems.positive("max-clock-skew", self.max_clock_skew);
        problems.at_least("backfill-batch", self.backfill_batch, 1);
        problems.at_least("backfill-in-flight", self.backfill_in_flight, 1);
        problems.finish::<Config>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_problems_are_reported_together() {
        Config::parse_from(["jetsched-scheduler"]).validate().unwrap();
        Config::for_tests("nats://127.0.0.1:4222").validate().unwrap();
        let config = Config::parse_from([
            "jetsched-scheduler",
            "--publish-window",
            "0",
            "--catchup-rate",
            "0",
            "--lease",
            "2s",
            "--lease-margin",
            "2s",
            "--max-clock-skew",
            "0s",
        ]);
        let error = config.validate().unwrap_err();
        let flags: Vec<&str> = error.problems().map(|p| p.flag.as_str()).collect();
        assert_eq!(flags, ["publish-window", "lease-margin", "catchup-rate", "max-clock-skew"], "{error}");
        let text = error.to_string();
        assert!(text.contains("--publish-window (JETSCHED_SCHEDULER_PUBLISH_WINDOW) = 0"), "{text}");
    }
}
