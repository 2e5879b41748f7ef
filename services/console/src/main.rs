//! `jetsched-console`: the operators' web console (pages on `--http-addr`, health and metrics
//! on `--admin-addr`).

jetsched_shared::service_main!("jetsched-console", jetsched_console::Config, jetsched_console::build);
