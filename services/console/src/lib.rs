//! jetsched-console: a web console for operators. Pages are rendered on the server from a task
//! index fed by a watch of the tasks bucket, the recent events and alerts, the leader lease,
//! presence pings and the registry API; actions go through the registry API only.

mod access;
mod actions;
mod activity;
mod api;
mod breakers;
mod bulk;
mod config;
#[cfg(test)]
mod contrast;
mod editor;
mod handlers;
mod history;
mod http;
mod index;
mod pages;
mod queues;
mod replicas;
mod retry;
mod runs;
mod service;
mod state;
mod status;
mod task_list;
mod trace;

pub use config::{Config, DEFAULT_ADMIN_ADDR, DEFAULT_HTTP_ADDR};
pub use index::{TaskIndex, TaskQuery, TaskSummary};
pub use service::{Console, build};
