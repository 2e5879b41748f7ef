//! `jetsched-scheduler`: leader-elected timing wheel that dispatches every fire exactly once.

jetsched_shared::service_main!("jetsched-scheduler", jetsched_scheduler::Config, jetsched_scheduler::build);
