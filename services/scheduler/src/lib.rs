//! jetsched-scheduler: follows the tasks bucket into a timing wheel on every replica, holds the
//! leader lease, and while leader dispatches each fire exactly once (de-duplicated by its
//! nominal time), records fire state and catches up after failovers.

mod catchup;
mod config;
mod discovery;
mod dispatch;
mod lease;
mod metrics;
mod overlap;
mod service;
mod state;
pub mod timer;

pub use config::{Config, DEFAULT_ADMIN_ADDR};
pub use service::{Scheduler, build};
