//! `jetsched-alerter`: turns events, dead letters, queue depths and the leader lease into alerts.

jetsched_shared::service_main!(
    "jetsched-alerter",
    jetsched_alerter::Config,
    jetsched_alerter::build,
    jetsched_alerter::Config::load().unwrap_or_else(|error| error.exit())
);
