//! jetsched-alerter: durable consumers on the events stream (one per event kind the enabled
//! rules read, shared by replicas) plus periodic checks of queue consumers, the dead-letter
//! stream and the leader lease, turned into de-duplicated, grouped, rate-limited alerts on the
//! log, webhooks and `<prefix>.alert.<severity>`.

mod alerts;
mod channels;
mod checks;
mod config;
mod core;
mod feed;
mod leaders;
mod lease;
mod metrics;
mod reopen;
pub mod rules;
mod service;
mod state;

pub use config::{Config, DEFAULT_ADMIN_ADDR};
pub use service::{Alerter, build};
pub use state::MAX_DEDUP_WINDOW;
