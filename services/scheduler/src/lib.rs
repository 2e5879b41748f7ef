//! jetsched-scheduler: follows the tasks bucket into a timing wheel on every replica, holds the
//! leader lease, and while leader dispatches each fire exactly once (de-duplicated by its
//! nominal time), records fire state and catches up after failovers.

mod acks;
mod backfills;
mod calendars;
mod catchup;
mod clock;
mod config;
mod core;
mod discovery;
mod fire;
mod flush;
mod follow;
mod lease;
mod metrics;
mod overlap;
mod partitions;
mod pipeline;
mod presence;
mod service;
mod skew;
mod spans;
mod specs;
mod takeover;
mod tasks;
pub mod timer;
mod wake;

pub use clock::{Clock, ManualClock, SharedClock, SystemClock};
pub use config::{
    Config, DEFAULT_ADMIN_ADDR, DEFAULT_BACKFILL_BATCH, DEFAULT_BACKFILL_IN_FLIGHT, DEFAULT_PUBLISH_WINDOW,
};
pub use service::{Scheduler, build, build_with_clock};
