//! `jetsched-worker`: executes dispatched runs (http, nats and, when allowed, shell executors).

jetsched_shared::service_main!("jetsched-worker", jetsched_worker::Config, |config| {
    jetsched_worker::build(config, jetsched_worker::Handlers::new())
});
