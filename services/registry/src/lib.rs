//! jetsched-registry: the task API as a NATS micro service (`jetsched.api.task.*`, with the
//! dead-letter and breaker APIs), the durable intake consumer (`jetsched.submit.<namespace>.<id>`)
//! and the durable consumer of workers' pause requests, all writing the tasks bucket through
//! [`tasks::TaskStore`].
//!
//! A request goes from `endpoints` (the table of every endpoint, and the router) through the
//! [`codec`] (decoded and validated at the edge) to its API (`api` for tasks, [`dlq`],
//! [`breakers`], [`queues`], [`calendars`], `runs`, `history`) and on to the store; a failure stays a typed
//! [`failure::Failure`] until `endpoints` answers it with the error reply.

mod after;
mod api;
mod backfills;
mod breaker_users;
pub mod breakers;
pub mod calendars;
mod cancel;
pub mod codec;
pub mod concurrency;
mod config;
pub mod dlq;
mod endpoints;
pub mod failure;
mod history;
mod intake;
mod metrics;
mod pause;
mod pull;
pub mod queues;
pub mod quota;
mod runs;
pub mod scope;
mod service;
mod spans;
mod status;
pub mod tasks;
mod tasks_feed;

pub use config::{Config, DEFAULT_ADMIN_ADDR};
pub use service::{Registry, build};
