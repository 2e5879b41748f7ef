//! The end-to-end test binary: real nats-server, services started in-process (or as real
//! processes where a crash is involved). One module per service.

mod alerter;
mod autopause;
mod backfill;
mod bench;
mod bounds;
mod breakers;
mod cancel;
mod chaos;
mod cli;
mod cli_human;

mod clock_guard;
mod config;
mod console;
mod dedupe;
mod deploy;
mod direct_batch;
mod dispatch_mismatch;
mod docs;
mod event_batches;
mod events;
mod failover;
mod full_disk_acks;
mod held_runs;
mod intake_recovery;
mod invariants;
mod limits;
mod local;
mod nemesis;
mod operator_truth;
mod overlap;
mod paused_runs;
mod priorities;
mod queues;
mod rate_limits;
mod registry;
mod scheduler;
mod tenants;
mod tracing;
mod worker_dlq;
mod worker_executors;
mod worker_retries;
mod worker_runs;
mod worker_shutdown;
mod worker_support;
