//! jetsched-registry: the task API as a NATS micro service (`jetsched.api.task.*`, with the
//! dead-letter and breaker APIs), the durable intake consumer (`jetsched.submit.<namespace>.<id>`)
//! and the durable consumer of workers' pause requests, all writing the tasks bucket through
//! [`tasks::TaskStore`].

pub mod api;
pub mod breakers;
mod config;
pub mod dlq;
mod history;
mod intake;
mod metrics;
mod pause;
mod pull;
pub mod quota;
mod runs;
pub mod scope;
mod service;
mod spans;
pub mod tasks;

pub use config::{Config, DEFAULT_ADMIN_ADDR};
pub use service::{Registry, build};
