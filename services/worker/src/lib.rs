//! jetsched-worker: replicas share one durable pull consumer per queue on the dispatch
//! stream, execute runs (http, nats, shell, embedded handlers), retry with backoff and jitter,
//! keep a run record per execution, and dead-letter what cannot succeed.
//!
//! Embedding: register handlers and start a worker in-process.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use jetsched_worker::{Config, Handlers, Outcome, RunContext, build};
//! let handlers = Handlers::new().register("greet", |run: RunContext| async move {
//!     println!("hello from {}", run.execution_id);
//!     Outcome::ok()
//! });
//! let worker = build(Config::for_tests("nats://127.0.0.1:4222", "demo"), handlers).await?;
//! worker.run(tokio_util::sync::CancellationToken::new()).await
//! # }
//! ```

mod breaker;
mod cancels;
mod config;
mod delivery;
pub mod dlq;
mod executor;
mod lanes;
mod limits;
mod message;
mod metrics;
mod pauses;
mod queues;
mod rate;
pub mod runs;
mod service;
mod slot;
mod spans;
mod verdict;

pub use config::{Config, DEFAULT_ADMIN_ADDR, DEFAULT_WEIGHTS, PolicyKind, RunEvents, RunRecords};
pub use executor::{Handler, Handlers, RunContext};
pub use service::{Worker, build, ensure_lane_consumer, ensure_queue_consumer};
pub use verdict::Outcome;
