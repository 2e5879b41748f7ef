//! Auto-pause: the count of a task's consecutive failed runs in its `task.<namespace>.<id>`
//! record, and the pause request to the registry when it reaches `pause_after_failures`.
//!
//! The worker that ends a run updates the count with compare-and-set; the record remembers the
//! execution that changed it last, so a redelivered ending is not counted twice. A success
//! writes only when there is a count to reset.

use std::time::Duration;

use anyhow::Context;
use chrono::Utc;
use jetsched_shared::backoff::Backoff;
use jetsched_shared::names::{self, breaker_reason};
use jetsched_shared::wire::{Dispatch, PauseRequest};

use super::state::Breakers;

/// How long a pause request is published again before it is given up (logged and counted).
const PAUSE_RETRY_FOR: Duration = Duration::from_secs(15);

impl Breakers {
    /// Counts the end of a run of `dispatch` (`failed`: it ended `failed` or `dead`) for tasks
    /// with `pause_after_failures`; asks the registry to pause the task once the count reaches
    /// it. Errors are logged and counted here.
    pub(crate) async fn run_ended(&self, dispatch: &Dispatch, failed: bool) {
        let Some(limit) = dispatch.spec.pause_after_failures else { return };
        let key = names::breaker_task_key(&dispatch.namespace, &dispatch.task_id);
        let execution = dispatch.execution_id.as_str();
        let counted = self
            .store
            .modify(&key, self.known(&key), |record| {
                if record.last_execution_id.as_deref() == Some(execution) {
                    return (None, false);
                }
                if !failed {
                    let had = record.consecutive_failures > 0;
                    record.consecutive_failures = 0;
                    record.last_execution_id = Some(execution.to_string());
                    return (None, had);
                }
                record.consecutive_failures = record.consecutive_failures.saturating_add(1);
                record.last_execution_id = Some(execution.to_string());
                (Some(record.consecutive_failures), true)
            })
            .await;
        let count = match counted {
            Ok((count, stored)) => {
                self.remember(&key, stored);
                count
            }
            Err(error) => {
                self.failed(&key, &error, "cannot count the run's ending for auto-pause");
                return;
            }
        };
        let Some(count) = count.filter(|count| *count >= limit) else { return };
        tracing::warn!(
            count,
            limit,
            "consecutive failed runs reached pause_after_failures: asking to pause the task"
        );
        if let Err(error) = self.request_pause(dispatch, count).await {
            self.metrics.errors.with_label_values(&["pause_request"]).inc();
            tracing::error!(error = format!("{error:#}"), "cannot publish the pause request");
        }
    }

    /// Publishes the pause request (once: its message id is the execution's) and awaits the
    /// stream's ack, retrying with backoff for up to [`PAUSE_RETRY_FOR`].
    async fn request_pause(&self, dispatch: &Dispatch, count: u32) -> anyhow::Result<()> {
        let request = PauseRequest {
            namespace: dispatch.namespace.clone(),
            task_id: dispatch.task_id.clone(),
            reason: breaker_reason::CONSECUTIVE_FAILURES.to_string(),
            count,
            execution_id: Some(dispatch.execution_id.clone()),
            time: Utc::now(),
        };
        let body: bytes::Bytes = serde_json::to_vec(&request).context("encode pause request")?.into();
        let subject = self.names.pause_request_subject(&dispatch.namespace, &dispatch.task_id);
        let id = names::pause_request_msg_id(&dispatch.namespace, &dispatch.task_id, &dispatch.execution_id);
        let deadline = tokio::time::Instant::now() + PAUSE_RETRY_FOR;
        let publish = |_| {
            let (subject, body, id) = (subject.clone(), body.clone(), id.clone());
            async move {
                let mut headers = async_nats::HeaderMap::new();
                headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
                let ack = self.js.publish_with_headers(subject, headers, body).await?;
                ack.await?;
                anyhow::Ok(())
            }
        };
        Backoff::new(Duration::from_millis(100), Duration::from_secs(2))
            .retry_until(deadline, publish, |_, _, _| true)
            .await
            .map_err(|gave_up| gave_up.error)
            .with_context(|| format!("publish the pause request on {subject}"))
    }
}
