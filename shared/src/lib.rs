//! Code every jetsched service shares: names, wire types, topology, task spec, schedule math,
//! connection options, telemetry and the admin HTTP server.

pub mod admin;
pub mod alert;
pub mod api_client;
pub mod backfill;
pub mod backoff;
pub mod calendar;
pub mod cas;
pub mod config;
pub mod direct_batch;
pub mod dispatch;
pub mod error;
pub mod events;
pub(crate) mod field;
pub(crate) mod flags;
pub mod follow;
pub mod metrics;
pub mod names;
pub mod partition;
pub mod presence;
pub mod priority;
pub mod schedule;
pub mod service;
pub mod shutdown;
pub mod spec;
pub mod telemetry;
pub mod topology;
pub mod trace;
pub mod wire;
