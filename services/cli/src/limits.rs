//! `jetsched limits` and `jetsched limits set|clear`: every concurrency key with its limit,
//! slots in use and runs waiting, every rate-limit key with its limit and whether it throttles,
//! and operators' overrides of a concurrency key's limit, through the registry's limits API.

use anyhow::Context;
use clap::Subcommand;
use jetsched_shared::wire::{LimitInfo, LimitListReply, LimitRequest, RateInfo, format_time};
use serde_json::Value;

use crate::api::{Api, Failure};
use crate::output;

#[derive(Debug, Subcommand)]
pub(crate) enum LimitCommand {
    /// Override a key's limit (in force instead of the specs' until cleared): a raised limit
    /// starts waiting runs at once, a lowered one lets runs holding slots finish.
    Set {
        /// The key as `jetsched limits` lists it: `<namespace>.<key>`.
        key: String,
        /// Runs under the key at once.
        limit: u32,
    },
    /// Clear a key's override: the limit the specs declare is in force again.
    Clear {
        /// The key as `jetsched limits` lists it: `<namespace>.<key>`.
        key: String,
    },
}

const HEADER: [&str; 7] = ["KEY", "LIMIT", "OVERRIDE", "IN USE", "AHEAD", "WAITING", "OLDEST WAIT"];
const RATE_HEADER: [&str; 6] = ["RATE KEY", "LIMIT", "BURST", "AVAILABLE", "NEXT START", "THROTTLED SINCE"];

/// `jetsched limits [set|clear]`.
pub(crate) async fn run(api: &Api, command: Option<LimitCommand>, json_out: bool) -> Result<(), Failure> {
    let (endpoint, request) = match command {
        None => return list(api, json_out).await,
        Some(LimitCommand::Set { key, limit }) => ("set", LimitRequest { key, limit: Some(limit) }),
        Some(LimitCommand::Clear { key }) => ("clear", LimitRequest { key, limit: None }),
    };
    let reply: Value = api.limits(endpoint, &request).await?;
    let info: LimitInfo = serde_json::from_value(reply.clone()).context("limits reply")?;
    let message = match info.override_limit {
        Some(n) => format!("limit of {} set to {n} (declared {})", info.key, info.declared),
        None => format!("limit of {} back to {}", info.key, info.declared),
    };
    output::done(json_out, &reply, &message);
    Ok(())
}

async fn list(api: &Api, json_out: bool) -> Result<(), Failure> {
    let reply: Value = api.limits("list", &serde_json::json!({})).await?;
    if json_out {
        output::pretty(&reply);
        return Ok(());
    }
    let LimitListReply { limits, rates } = serde_json::from_value(reply).context("list reply")?;
    output::table(&HEADER, &limits.iter().map(row).collect::<Vec<_>>());
    if !rates.is_empty() {
        println!();
        output::table(&RATE_HEADER, &rates.iter().map(rate_row).collect::<Vec<_>>());
    }
    Ok(())
}

fn rate_row(info: &RateInfo) -> Vec<String> {
    let (limit, burst) = match info.declared {
        Some(declared) => (declared.per_period(), declared.burst.to_string()),
        None => ("?".to_string(), "?".to_string()),
    };
    vec![
        info.key.clone(),
        limit,
        burst,
        info.available.map(|n| n.to_string()).unwrap_or_default(),
        info.next_start.map(format_time).unwrap_or_default(),
        info.throttled_since.map(format_time).unwrap_or_default(),
    ]
}

fn row(info: &LimitInfo) -> Vec<String> {
    let waiting = if info.waiting_by_priority.len() > 1 {
        let by: Vec<String> = info.waiting_by_priority.iter().map(|(p, n)| format!("{p}={n}")).collect();
        format!("{} ({})", info.waiting, by.join(","))
    } else {
        info.waiting.to_string()
    };
    vec![
        info.key.clone(),
        info.limit.to_string(),
        info.override_limit.map(|n| n.to_string()).unwrap_or_default(),
        info.in_use.to_string(),
        info.reserved_ahead.to_string(),
        waiting,
        info.oldest_wait.map(format_time).unwrap_or_default(),
    ]
}
