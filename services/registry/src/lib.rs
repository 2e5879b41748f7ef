//! jetsched-registry: the task API as a NATS micro service (`jetsched.api.task.*`) and the
//! durable intake consumer (`jetsched.submit.<namespace>.<id>`), both writing the tasks bucket
//! through [`tasks::TaskStore`].

pub mod api;
mod config;
pub mod dlq;
mod intake;
mod metrics;
mod runs;
pub mod scope;
mod service;
mod spans;
pub mod tasks;

pub use config::{Config, DEFAULT_ADMIN_ADDR};
pub use service::{Registry, build};
