//! `jetsched breakers` and `jetsched breaker reset|show`: the circuit breakers the workers share,
//! through the registry's breaker API.

use anyhow::Context;
use chrono::Utc;
use clap::Subcommand;
use jetsched_shared::wire::{BreakerInfo, BreakerListReply, BreakerRef, BreakerResetReply, format_time};
use serde_json::Value;

use crate::api::{Api, Failure};
use crate::output;

#[derive(Debug, Subcommand)]
pub(crate) enum BreakerCommand {
    /// Show one breaker: a named key (`payments-api`) or a task's own (`namespace/id`).
    Show { key: String },
    /// Close a breaker and clear its counts (and a task's consecutive-failure count).
    Reset { key: String },
}

/// What the user typed: a task's own breaker as `namespace/id`, otherwise a named key.
fn reference(key: &str) -> BreakerRef {
    match key.split_once('/') {
        Some((namespace, id)) => {
            BreakerRef { namespace: Some(namespace.into()), id: Some(id.into()), ..BreakerRef::default() }
        }
        None => BreakerRef { key: Some(key.into()), ..BreakerRef::default() },
    }
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
            crate::commands::done(
                json_out,
                &reply,
                &format!("{key} reset (was {})", reset.previous_state.as_str()),
            );
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
    vec![
        info.name.clone(),
        info.state.as_str().to_string(),
        format!("{:.0}%", info.failure_rate * 100.0),
        format!("{}/{}", info.failures, info.runs),
        open_until,
        info.consecutive_failures.to_string(),
        info.tasks.join(","),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slash_names_a_tasks_own_breaker() {
        assert_eq!(reference("billing/report").id.as_deref(), Some("report"));
        assert_eq!(reference("billing/report").namespace.as_deref(), Some("billing"));
        assert_eq!(reference("payments-api").key.as_deref(), Some("payments-api"));
    }
}
