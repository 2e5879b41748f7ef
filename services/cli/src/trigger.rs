//! `jetsched trigger`: one run now with an optional payload, at most once per de-duplication
//! key, or the task's pending run joined when it debounces; the reply said in a line.

use anyhow::Context;
use jetsched_shared::wire::TriggerReply;
use serde_json::Value;

use crate::api::{Api, Failure, task_ref};
use crate::output;

/// What `trigger` asks for besides the task.
pub(crate) struct TriggerFields {
    pub(crate) priority: Option<String>,
    pub(crate) payload: Option<String>,
    pub(crate) dedupe_key: Option<String>,
    pub(crate) dedupe_ttl: Option<String>,
}

pub(crate) async fn trigger(
    api: &Api,
    task: &str,
    fields: TriggerFields,
    json_out: bool,
) -> Result<(), Failure> {
    let reference = task_ref(task);
    let mut request = serde_json::json!({"namespace": reference.namespace, "id": reference.id});
    if let Some(text) = fields.payload {
        let text = match text.strip_prefix('@') {
            Some(path) => {
                std::fs::read_to_string(path).with_context(|| format!("read payload file {path}"))?
            }
            None => text,
        };
        let payload: Value = serde_json::from_str(&text).context("--payload is not JSON")?;
        request["payload"] = payload;
    }
    for (field, value) in
        [("priority", fields.priority), ("dedupe_key", fields.dedupe_key), ("dedupe_ttl", fields.dedupe_ttl)]
    {
        if let Some(value) = value {
            request[field] = Value::String(value);
        }
    }
    let reply: Value = api.task_in("trigger", &reference.namespace, &request).await?;
    let run: TriggerReply = serde_json::from_value(reply.clone()).context("trigger reply")?;
    let line = if run.deduplicated {
        format!("{task} not triggered again: its dedupe key names execution {}", run.execution_id)
    } else if run.debounced {
        let triggers = run.triggers.unwrap_or(1);
        format!(
            "{task} debounced: execution {} starts at {} ({triggers} trigger{} collapsed so far)",
            run.execution_id,
            jetsched_shared::wire::format_time(run.nominal_time),
            if triggers == 1 { "" } else { "s" }
        )
    } else {
        format!("{task} triggered: execution {}", run.execution_id)
    };
    output::done(json_out, &reply, &line);
    Ok(())
}
