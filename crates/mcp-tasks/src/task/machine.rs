//! The pure transition function of a task.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{TaskError, TaskOutcome, TaskRecord, TaskStatus};

/// Something that happens to a task. Events come from clients (`tasks/update`,
/// `tasks/cancel`), from the tool running inside the task, and from the expiry reaper.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The tool sets (or clears) its status message.
    StatusMessage(Option<String>),
    /// A journaled step finished with this recorded value.
    StepCompleted { name: String, value: Value },
    /// The tool asks the client for input under fresh keys (JSON `InputRequest`s).
    RequestInputs {
        requests: BTreeMap<String, Value>,
        status_message: Option<String>,
    },
    /// A client answered input requests (`tasks/update`). Keys that are not outstanding are
    /// ignored; a partial answer keeps the task `input_required`.
    ProvideInputs { responses: BTreeMap<String, Value> },
    /// A client asked for cancellation (`tasks/cancel`). A task that waits for input is
    /// cancelled at once; a working task is flagged and its tool stops cooperatively.
    RequestCancel,
    /// The tool ended with a result (`completed`) or a JSON-RPC error (`failed`).
    Finish(TaskOutcome),
    /// The tool stopped because cancellation was requested.
    Cancelled { status_message: Option<String> },
    /// The task outlived `createdAt + ttlMs` before it ended.
    Expire,
    /// The tool of a `working` task starts again after a crash, a kill or a panic: one more
    /// attempt (see [`TaskRecord::attempts`]).
    Restarted,
    /// An attempt counted by a takeover of a lapsed lease is given back: the node that held
    /// the lease renewed its heartbeat afterwards, in the same process, so its run ended in a
    /// pause (a stop of the world, a frozen VM), not in a crash. Nothing changes when no
    /// attempt beyond the first is counted.
    RestartRefunded,
}

/// Why an event cannot be applied. None of these change the record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransitionError {
    #[error("the task is already {0} and cannot change")]
    Terminal(&'static str),
    #[error("input key `{0}` was already issued for this task; keys are unique over its lifetime")]
    DuplicateInputKey(String),
    #[error("an input request needs at least one key")]
    NoInputRequests,
    /// An answer that does not fit the input request it answers (see `task::answer`); the
    /// whole update is refused and no key is used up.
    #[error("the response for input key `{key}` {reason}")]
    InvalidInputResponse { key: String, reason: String },
    #[error("step `{0}` already has a recorded result")]
    StepAlreadyRecorded(String),
    #[error("the task is not expired yet")]
    NotExpired,
}

/// Applies `event` to `record` at wall-clock time `now_ms`.
///
/// Returns `Ok(None)` when the event is valid but changes nothing (for example a
/// cancellation request for a finished task, or answers only for unknown keys), and
/// `Ok(Some(next))` with `next.seq == record.seq + 1` otherwise. A change of status appends
/// an entry to [`TaskRecord::history`](super::TaskRecord::history).
pub fn apply(
    record: &TaskRecord,
    event: Event,
    now_ms: u64,
) -> Result<Option<TaskRecord>, TransitionError> {
    let terminal = record.status.is_terminal();
    let restarted = matches!(event, Event::Restarted | Event::RestartRefunded);
    let mut next = record.clone();
    match event {
        Event::StatusMessage(message) => {
            refuse_if_terminal(record)?;
            if record.status_message == message {
                return Ok(None);
            }
            next.status_message = message;
        }
        Event::StepCompleted { name, value } => {
            refuse_if_terminal(record)?;
            if record.journal.contains_key(&name) {
                return Err(TransitionError::StepAlreadyRecorded(name));
            }
            next.step_attempts.insert(name.clone(), record.attempts);
            next.journal.insert(name, value);
            next.attempts = 1;
        }
        Event::RequestInputs {
            requests,
            status_message,
        } => request_inputs(record, &mut next, requests, status_message)?,
        Event::ProvideInputs { responses } => {
            if terminal || !provide_inputs(record, &mut next, responses)? {
                return Ok(None);
            }
        }
        Event::RequestCancel => {
            if terminal || (record.cancel_requested && record.status == TaskStatus::Working) {
                return Ok(None);
            }
            next.cancel_requested = true;
            if record.status == TaskStatus::InputRequired {
                end_cancelled(&mut next, Some("Cancelled while waiting for input.".into()));
            }
        }
        Event::Finish(outcome) => {
            refuse_if_terminal(record)?;
            finish(&mut next, outcome);
        }
        Event::Cancelled { status_message } => {
            refuse_if_terminal(record)?;
            end_cancelled(
                &mut next,
                status_message.or_else(|| Some("Cancelled.".into())),
            );
        }
        Event::Expire => {
            refuse_if_terminal(record)?;
            if !record.is_expired(now_ms) {
                return Err(TransitionError::NotExpired);
            }
            finish(
                &mut next,
                TaskOutcome::Error(TaskError {
                    code: crate::wire::error::code::INTERNAL_ERROR,
                    message: "Task has expired before it finished".into(),
                    data: None,
                }),
            );
            next.status_message = Some("Task has expired.".into());
        }
        Event::Restarted => {
            refuse_if_terminal(record)?;
            next.attempts = record.attempts.saturating_add(1);
        }
        Event::RestartRefunded => {
            refuse_if_terminal(record)?;
            if record.attempts <= 1 {
                return Ok(None);
            }
            next.attempts = record.attempts - 1;
        }
    }
    next.seq = record.seq.saturating_add(1);
    // A restart (or a refunded one) is bookkeeping, not an update a client could see. Every
    // other change gets a later `lastUpdatedAt` than the record it replaces, even within one
    // millisecond or when this node's clock is behind the node that wrote the record: the
    // wire carries no sequence number, so this is how a client orders the states it saw.
    if !restarted {
        next.last_updated_at_ms = now_ms.max(record.last_updated_at_ms.saturating_add(1));
    }
    // The history keeps changes of status only (not of the message alone, nor restarts).
    if next.status != record.status {
        next.record_transition();
    }
    Ok(Some(next))
}

/// `RequestInputs`: new keys become pending and the task `input_required` (a key issued
/// before, even answered, is refused).
fn request_inputs(
    record: &TaskRecord,
    next: &mut TaskRecord,
    requests: BTreeMap<String, Value>,
    status_message: Option<String>,
) -> Result<(), TransitionError> {
    refuse_if_terminal(record)?;
    if requests.is_empty() {
        return Err(TransitionError::NoInputRequests);
    }
    if let Some(key) = requests.keys().find(|k| record.issued_keys.contains(*k)) {
        return Err(TransitionError::DuplicateInputKey(key.clone()));
    }
    for (key, request) in requests {
        next.issued_keys.insert(key.clone());
        next.pending_inputs.insert(key, request);
    }
    next.status = TaskStatus::InputRequired;
    next.attempts = 1;
    if status_message.is_some() {
        next.status_message = status_message;
    }
    Ok(())
}

/// `ProvideInputs` on an unfinished task: each answer to a pending key is checked against its
/// request and recorded (others are ignored); the task works again once nothing is pending.
/// `false` when no answer was for a pending key (nothing changes).
fn provide_inputs(
    record: &TaskRecord,
    next: &mut TaskRecord,
    responses: BTreeMap<String, Value>,
) -> Result<bool, TransitionError> {
    let mut changed = false;
    for (key, response) in responses {
        if !record.pending_inputs.contains_key(&key) {
            continue; // never issued, already answered, or superseded: ignored
        }
        if let Err(reason) = super::answer::check(&record.pending_inputs[&key], &response) {
            return Err(TransitionError::InvalidInputResponse { key, reason });
        }
        next.pending_inputs.remove(&key);
        next.answers.insert(key, response);
        changed = true;
    }
    if changed && next.pending_inputs.is_empty() && next.status == TaskStatus::InputRequired {
        next.status = TaskStatus::Working;
    }
    Ok(changed)
}

/// Ends the task with `outcome`: `completed` without a status message (none of an earlier
/// state survives on a finished task), or `failed` with the error's message.
fn finish(next: &mut TaskRecord, outcome: TaskOutcome) {
    next.pending_inputs.clear();
    match &outcome {
        TaskOutcome::Result(_) => {
            next.status = TaskStatus::Completed;
            next.status_message = None;
        }
        TaskOutcome::Error(TaskError { message, .. }) => {
            next.status = TaskStatus::Failed;
            next.status_message = Some(message.clone());
        }
    }
    next.outcome = Some(outcome);
}

fn refuse_if_terminal(record: &TaskRecord) -> Result<(), TransitionError> {
    if record.status.is_terminal() {
        Err(TransitionError::Terminal(record.status.as_str()))
    } else {
        Ok(())
    }
}

fn end_cancelled(next: &mut TaskRecord, status_message: Option<String>) {
    next.pending_inputs.clear();
    next.status = TaskStatus::Cancelled;
    next.status_message = status_message;
}

#[cfg(test)]
mod tests;
