//! `jetsched-registry`: the task API (NATS micro service) and the durable intake consumer.

jetsched_shared::service_main!("jetsched-registry", jetsched_registry::Config, jetsched_registry::build);
