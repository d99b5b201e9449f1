//! The wire form of a task: the flat task objects of the Tasks extension (SEP-2663), built from
//! a [`TaskRecord`].

use serde_json::{Map, Value, json};

use super::{TaskOutcome, TaskRecord, TaskStatus};
use crate::wire::results::{call_tool_result, obj, with_server_info};
use crate::wire::{ServerInfo, iso8601};

/// The flat `Task` fields shared by every task object.
fn task_fields(record: &TaskRecord) -> Map<String, Value> {
    let mut t = Map::new();
    t.insert("taskId".into(), json!(record.id.as_str()));
    t.insert("status".into(), json!(record.status.as_str()));
    if let Some(m) = &record.status_message {
        t.insert("statusMessage".into(), json!(m));
    }
    t.insert("createdAt".into(), json!(iso8601(record.created_at_ms)));
    t.insert(
        "lastUpdatedAt".into(),
        json!(iso8601(record.last_updated_at_ms)),
    );
    t.insert(
        "ttlMs".into(),
        record.ttl_ms.map_or(Value::Null, |v| json!(v)),
    );
    if let Some(p) = record.poll_interval_ms {
        t.insert("pollIntervalMs".into(), json!(p));
    }
    t
}

/// `DetailedTask`: the task fields plus what its status carries (`inputRequests`, `result`
/// or `error`). This is the body of `tasks/get` and of every `notifications/tasks`.
pub fn detailed_task(record: &TaskRecord, server: &ServerInfo) -> Map<String, Value> {
    let mut t = task_fields(record);
    match record.status {
        TaskStatus::InputRequired => {
            let requests: Map<String, Value> = record
                .pending_inputs
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            t.insert("inputRequests".into(), Value::Object(requests));
        }
        TaskStatus::Completed => {
            if let Some(TaskOutcome::Result(r)) = &record.outcome {
                t.insert("result".into(), call_tool_result(server, r.clone()));
            }
        }
        TaskStatus::Failed => {
            if let Some(TaskOutcome::Error(e)) = &record.outcome {
                let mut err = obj(json!({ "code": e.code, "message": e.message }));
                if let Some(d) = &e.data {
                    err.insert("data".into(), d.clone());
                }
                t.insert("error".into(), Value::Object(err));
            }
        }
        TaskStatus::Working | TaskStatus::Cancelled => {}
    }
    t
}

/// `CreateTaskResult`: `resultType: "task"` and the flat task fields, nothing else.
pub fn create_task(record: &TaskRecord, server: &ServerInfo) -> Value {
    let mut r = obj(json!({ "resultType": "task" }));
    r.extend(task_fields(record));
    with_server_info(r, server)
}

/// `GetTaskResult`: `resultType: "complete"` and the detailed task.
pub fn get_task(record: &TaskRecord, server: &ServerInfo) -> Value {
    let mut r = obj(json!({ "resultType": "complete" }));
    r.extend(detailed_task(record, server));
    with_server_info(r, server)
}
