//! `jetsched calendar apply|get|ls|rm`: business calendars through the registry's calendar
//! API, on the subjects of their namespace (so a team confined to its namespace uses them too).

use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use jetsched_shared::wire::{CalendarListRequest, CalendarRef};
use serde_json::Value;

use crate::api::{Api, Failure};
use crate::files::read_specs;
use crate::output::{self, outln};

#[derive(Debug, Subcommand)]
pub(crate) enum CalendarCommand {
    /// Create or update a calendar from a JSON or YAML file (`-` for stdin) holding one
    /// calendar document.
    Apply {
        /// The calendar file (JSON or YAML), or `-` for stdin.
        file: PathBuf,
        /// Compare-and-set: write only if the stored calendar is at this revision (0: only if
        /// it does not exist yet), as `get` shows it.
        #[arg(long, conflicts_with = "create_only")]
        revision: Option<u64>,
        /// Fail if the calendar already exists instead of updating it.
        #[arg(long)]
        create_only: bool,
    },
    /// Show a calendar (`namespace/name`, or `name` in namespace `default`), its revision and
    /// the tasks and calendars referring to it.
    Get {
        /// The calendar: `namespace/name`, or `name` in namespace `default`.
        calendar: String,
    },
    /// List the calendars of a namespace (every namespace's without one).
    Ls {
        /// Only calendars of this namespace.
        namespace: Option<String>,
    },
    /// Delete a calendar; refused while a task or another calendar refers to it.
    Rm {
        /// The calendar: `namespace/name`, or `name` in namespace `default`.
        calendar: String,
    },
}

/// `namespace/name`, or `name` in namespace `default`.
fn calendar_ref(text: &str) -> CalendarRef {
    let (namespace, name) = text.split_once('/').unwrap_or(("default", text));
    CalendarRef { namespace: namespace.to_string(), name: name.to_string() }
}

pub(crate) async fn run(api: &Api, command: CalendarCommand, json_out: bool) -> Result<(), Failure> {
    match command {
        CalendarCommand::Apply { file, revision, create_only } => {
            let mut documents = read_specs(&file)?;
            if documents.len() != 1 {
                return Err(anyhow::anyhow!(
                    "{} holds {} documents; give one calendar per file",
                    file.display(),
                    documents.len()
                )
                .into());
            }
            let (_, calendar) = documents.remove(0);
            let reply = api.calendar_put(&calendar, revision, create_only).await?;
            let message = format!(
                "calendar {}/{} stored (revision {})",
                reply["calendar"]["namespace"].as_str().unwrap_or_default(),
                reply["calendar"]["name"].as_str().unwrap_or_default(),
                reply["revision"]
            );
            output::done(json_out, &reply, &message);
        }
        CalendarCommand::Get { calendar } => {
            let reference = calendar_ref(&calendar);
            let reply: Value = api.calendar("get", Some(&reference.namespace), &reference).await?;
            if json_out {
                output::pretty(&reply);
            } else {
                show(&reply);
            }
        }
        CalendarCommand::Ls { namespace } => {
            let request = CalendarListRequest { namespace: namespace.clone() };
            let reply: Value = api.calendar("list", namespace.as_deref(), &request).await?;
            if json_out {
                output::pretty(&reply);
            } else {
                let calendars = reply["calendars"].as_array().context("list reply")?;
                let rows: Vec<Vec<String>> = calendars.iter().map(row).collect();
                output::table(
                    &["CALENDAR", "ZONE", "WORKING DAYS", "HOURS", "HOLIDAYS", "BASE", "REVISION"],
                    &rows,
                );
            }
        }
        CalendarCommand::Rm { calendar } => {
            let reference = calendar_ref(&calendar);
            let reply: Value = api.calendar("delete", Some(&reference.namespace), &reference).await?;
            let message = format!("calendar {}/{} deleted", reference.namespace, reference.name);
            output::done(json_out, &reply, &message);
        }
    }
    Ok(())
}

fn joined(value: &Value) -> String {
    let items: Vec<&str> =
        value.as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    items.join(",")
}

fn hours(calendar: &Value) -> String {
    match (calendar["working_hours"]["start"].as_str(), calendar["working_hours"]["end"].as_str()) {
        (Some(start), Some(end)) => format!("{start}-{end}"),
        _ => String::new(),
    }
}

fn row(reply: &Value) -> Vec<String> {
    let calendar = &reply["calendar"];
    vec![
        format!(
            "{}/{}",
            calendar["namespace"].as_str().unwrap_or_default(),
            calendar["name"].as_str().unwrap_or_default()
        ),
        calendar["zone"].as_str().unwrap_or_default().to_string(),
        joined(&calendar["working_days"]),
        hours(calendar),
        calendar["holidays"].as_array().map_or(0, Vec::len).to_string(),
        joined(&calendar["base"]),
        reply["revision"].to_string(),
    ]
}

fn show(reply: &Value) {
    let calendar = &reply["calendar"];
    let line = |label: &str, value: String| outln!("{label:<14}{value}");
    line(
        "calendar",
        format!(
            "{}/{}",
            calendar["namespace"].as_str().unwrap_or_default(),
            calendar["name"].as_str().unwrap_or_default()
        ),
    );
    line("revision", reply["revision"].to_string());
    line("zone", calendar["zone"].as_str().unwrap_or_default().to_string());
    line("working days", joined(&calendar["working_days"]));
    let hours = hours(calendar);
    line("working hours", if hours.is_empty() { "all day".to_string() } else { hours });
    line("holidays", joined(&calendar["holidays"]));
    let base = joined(&calendar["base"]);
    line("base", if base.is_empty() { "-".to_string() } else { base });
    let used_by = joined(&reply["used_by"]);
    line("used by", if used_by.is_empty() { "nothing".to_string() } else { used_by });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_calendar_reference_defaults_to_the_default_namespace() {
        assert_eq!(calendar_ref("team-a/de-holidays").namespace, "team-a");
        assert_eq!(calendar_ref("office").namespace, "default");
        assert_eq!(calendar_ref("office").name, "office");
    }
}
