//! The end-to-end test binary: real nats-server, services started in-process (or as real
//! processes where a crash is involved). One module per service.

mod cli;
mod registry;
mod scheduler;
mod worker;
