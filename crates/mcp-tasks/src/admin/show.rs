//! `store show`: one task in full.

use super::{
    AdminError, Inspector, Location, TaskDetail, TaskSummary, decode, open_reader, socket,
};
use crate::persist;

/// `store show`.
pub async fn show(location: &Location, id: &str) -> Result<TaskDetail, AdminError> {
    match open_reader(location).await? {
        Some(reader) => show_of(&*reader, id).await,
        None => socket::ask(location, socket::Request::Show(id.to_owned())).await,
    }
}

pub(crate) async fn show_of(reader: &dyn Inspector, id: &str) -> Result<TaskDetail, AdminError> {
    crate::task::TaskId::parse(id).map_err(|e| AdminError::Invalid(format!("{id}: {e}")))?;
    let row = reader
        .row(id)
        .await?
        .ok_or_else(|| AdminError::NoSuchTask(id.to_owned()))?;
    let record = decode(&row).map_err(|e| {
        AdminError::Invalid(format!("task {id} is stored but does not decode: {e}"))
    })?;
    Ok(TaskDetail {
        summary: TaskSummary::of(&record),
        owner: serde_json::json!({
            "tenant": record.owner.tenant,
            "principal": record.owner.principal,
        }),
        snapshot_version: persist::snapshot_version(&row.bytes).unwrap_or(0),
        snapshot_bytes: row.bytes.len(),
        arguments: record.arguments.clone(),
        ttl_ms: record.ttl_ms,
        expires_at_ms: record.expires_at_ms(),
        due_ms: row.due_ms,
        attempts: record.attempts,
        cancel_requested: record.cancel_requested,
        journal: record.journal.clone(),
        step_attempts: record.step_attempts.clone(),
        input_keys_issued: record.issued_keys.iter().cloned().collect(),
        input_requests_pending: record.pending_inputs.clone(),
        input_answers: record.answers.clone(),
        outcome: record.outcome.as_ref().map(|o| match o {
            crate::task::TaskOutcome::Result(result) => serde_json::json!({ "result": result }),
            crate::task::TaskOutcome::Error(e) => serde_json::json!({
                "error": { "code": e.code, "message": e.message, "data": e.data }
            }),
        }),
        lease: row.lease.clone(),
    })
}
