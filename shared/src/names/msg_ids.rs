//! Message ids (`Nats-Msg-Id`): the de-duplication ids of what jetsched publishes, each derived
//! from what makes the message one of a kind, so a retried publish is absorbed.

/// The de-duplication id of a pause request: `pause:<namespace>.<task_id>:<execution_id>` (the
/// execution whose failure reached the count), so a retried publish is absorbed.
pub fn pause_request_msg_id(namespace: &str, task_id: &str, execution_id: &str) -> String {
    format!("pause:{namespace}.{task_id}:{execution_id}")
}

/// The de-duplication id of a fire: `<namespace>.<task_id>:<nominal_unix_ms>`. Derived from the
/// nominal time, never from `now`, so an old and a new leader produce the same id.
pub fn dispatch_msg_id(namespace: &str, task_id: &str, nominal_unix_ms: i64) -> String {
    format!("{namespace}.{task_id}:{nominal_unix_ms}")
}

/// The de-duplication id of a backfill's rerun of a nominal time that already had a run:
/// `<namespace>.<task_id>:<nominal_unix_ms>:backfill:<backfill_id>`, so a resumed backfill
/// dispatches it once and it never stands for the live fire of that time.
pub fn backfill_rerun_msg_id(
    namespace: &str,
    task_id: &str,
    nominal_unix_ms: i64,
    backfill_id: &str,
) -> String {
    format!("{namespace}.{task_id}:{nominal_unix_ms}:backfill:{backfill_id}")
}

/// The de-duplication id of a manual run: `<namespace>.<task_id>:manual:<execution_id>`
/// (each trigger is a run of its own; a retried publish of the same one is absorbed).
pub fn manual_msg_id(namespace: &str, task_id: &str, execution_id: &str) -> String {
    format!("{namespace}.{task_id}:manual:{execution_id}")
}

/// The de-duplication id of a replayed dead letter: `replay:<execution id of the dead run>`, so
/// a replay request retried before the entry is removed dispatches it once.
pub fn replay_msg_id(dead_execution_id: &str) -> String {
    format!("replay:{dead_execution_id}")
}

/// The de-duplication id of a dead letter: `dlq:<execution_id>` (one entry per run).
pub fn dead_letter_msg_id(execution_id: &str) -> String {
    format!("dlq:{execution_id}")
}

/// The de-duplication id of one event: random and time-ordered, the same for every retry of
/// that event's publish.
pub fn event_msg_id() -> String {
    uuid::Uuid::now_v7().to_string()
}
