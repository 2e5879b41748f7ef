//! `jetsched breakers` and `jetsched breaker reset|show`: the circuit breakers the workers share,
//! through the registry's breaker API. A breaker is named as `list` shows it: `namespace/id` (a
//! task's own), `namespace:key` (a namespace's named breaker) or a bare key (a shared one, or a
//! key only one namespace uses).

use anyhow::Context;
use chrono::Utc;
use clap::Subcommand;
use jetsched_shared::wire::{BreakerInfo, BreakerListReply, BreakerRef, BreakerResetReply, format_time};
use serde_json::Value;

use crate::api::{Api, Failure};
use crate::output;

#[derive(Debug, Subcommand)]
pub(crate) enum BreakerCommand {
    /// Show one breaker: a namespace's named key (`billing:payments-api`), a task's own
    /// (`billing/charge-cards`), or a key alone (`payments-api`: shared, or used by one namespace).
    Show {
        /// `namespace:key`, `namespace/id` or a key alone.
        key: String,
    },
    /// Close a breaker and clear its counts (and a task's consecutive-failure count); named as
    /// for `show`.
    Reset {
        /// `namespace:key`, `namespace/id` or a key alone.
        key: String,
    },
}

/// What the user typed: a task's own breaker as `namespace/id`, a namespace's named breaker as
/// `namespace:key`, otherwise a key alone (or a bucket key).
fn reference(key: &str) -> BreakerRef {
    if let Some((namespace, id)) = key.split_once('/') {
        return BreakerRef {
            namespace: Some(namespace.into()),
            id: Some(id.into()),
            ..BreakerRef::default()
        };
    }
    if let Some((namespace, key)) = key.split_once(':') {
        return BreakerRef {
            namespace: Some(namespace.into()),
            key: Some(key.into()),
            ..BreakerRef::default()
        };
    }
    BreakerRef { key: Some(key.into()), ..BreakerRef::default() }
}

/// `jetsched breakers`: every breaker as a table, or the reply as JSON.
pub(crate) async fn list(api: &Api, json_out: bool) -> Result<(), Failure> {
    let reply: Value = api.breaker("list", &BreakerRef::default()).await?;
    if json_out {
        output::pretty(&reply);
        return Ok(());
    }
    let BreakerListReply { breakers } = serde_json::from_value(reply).context("list reply")?;
    let rows: Vec<Vec<String>> = breakers.iter().map(row).collect();
    output::table(
        &["BREAKER", "STATE", "FAILURE RATE", "FAILURES/RUNS", "OPEN UNTIL", "IN A ROW", "TASKS"],
        &rows,
    );
    Ok(())
}

/// `jetsched breaker show|reset <key>`.
pub(crate) async fn run(api: &Api, command: BreakerCommand, json_out: bool) -> Result<(), Failure> {
    match command {
        BreakerCommand::Show { key } => {
            let reply: Value = api.breaker("get", &reference(&key)).await?;
            if json_out {
                output::pretty(&reply);
                return Ok(());
            }
            let info: BreakerInfo = serde_json::from_value(reply).context("get reply")?;
            output::table(
                &["BREAKER", "STATE", "FAILURE RATE", "FAILURES/RUNS", "OPEN UNTIL", "IN A ROW", "TASKS"],
                &[row(&info)],
            );
        }
        BreakerCommand::Reset { key } => {
            let reply: Value = api.breaker("reset", &reference(&key)).await?;
            let reset: BreakerResetReply = serde_json::from_value(reply.clone()).context("reset reply")?;
            output::done(json_out, &reply, &format!("{key} reset (was {})", reset.previous_state.as_str()));
        }
    }
    Ok(())
}

fn row(info: &BreakerInfo) -> Vec<String> {
    let open_until = match info.open_until {
        Some(until) if until > Utc::now() => format_time(until),
        Some(until) => format!("{} (passed)", format_time(until)),
        None => String::new(),
    };
    let (rate, counts) = window(info);
    vec![
        info.name.clone(),
        info.state.as_str().to_string(),
        rate,
        counts,
        open_until,
        info.consecutive_failures.to_string(),
        info.tasks.join(","),
    ]
}

/// The failure rate and failures/runs to show: the window's, or, while nothing was counted
/// since a breaker opened, the window that opened it (`opened at 80%`, `8/10`); `-` when
/// nothing was ever counted.
fn window(info: &BreakerInfo) -> (String, String) {
    let percent = |failures: u64, runs: u64| format!("{:.0}%", failures as f64 * 100.0 / runs as f64);
    match (info.runs, info.opened_runs) {
        (0, 0) => ("-".into(), "0/0".into()),
        (0, opened) => (
            format!("opened at {}", percent(info.opened_failures, opened)),
            format!("{}/{opened}", info.opened_failures),
        ),
        (runs, _) => (percent(info.failures, runs), format!("{}/{runs}", info.failures)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slash_names_a_tasks_own_breaker_and_a_colon_a_namespaces_key() {
        assert_eq!(reference("billing/report").id.as_deref(), Some("report"));
        assert_eq!(reference("billing/report").namespace.as_deref(), Some("billing"));
        let named = reference("billing:payments-api");
        assert_eq!(
            (named.namespace.as_deref(), named.key.as_deref()),
            (Some("billing"), Some("payments-api"))
        );
        assert_eq!(named.id, None);
        let bare = reference("payments-api");
        assert_eq!((bare.namespace, bare.key.as_deref()), (None, Some("payments-api")));
        assert_eq!(reference("key.=shared.pay").key.as_deref(), Some("key.=shared.pay"));
    }

    #[test]
    fn an_open_breaker_shows_the_window_that_opened_it() {
        let info = |runs, failures, opened_runs, opened_failures| BreakerInfo {
            key: "task.billing.nightly".into(),
            name: "billing/nightly".into(),
            state: jetsched_shared::wire::BreakerState::Open,
            failure_rate: 0.0,
            runs,
            failures,
            opened_at: None,
            open_until: None,
            opened_runs,
            opened_failures,
            consecutive_failures: 0,
            tasks: vec![],
            revision: 1,
            updated_at: None,
        };
        assert_eq!(window(&info(0, 0, 10, 8)), ("opened at 80%".into(), "8/10".into()));
        assert_eq!(window(&info(4, 1, 10, 8)), ("25%".into(), "1/4".into()));
        assert_eq!(window(&info(0, 0, 0, 0)), ("-".into(), "0/0".into()));
    }
}
