//! The wire form of a task: the flat task objects of the Tasks extension (SEP-2663), built from
//! a [`TaskRecord`].

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value, json};

use super::{TaskOutcome, TaskRecord, TaskStatus};
use crate::wire::results::{call_tool_result, obj, with_server_info};
use crate::wire::{ServerInfo, iso8601, keys};

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

/// Which task object a [`TaskResult`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// `CreateTaskResult` (as [`create_task`]).
    Created,
    /// `GetTaskResult` (as [`get_task`]).
    Detailed,
}

/// A task result serialized straight from its record: the same JSON, member for member and in
/// the same order, as [`create_task`] and [`get_task`] build as a `Value`, without building
/// and dropping the tree (the largest share of a `tasks/get`; docs/BENCHMARKS.md). Test:
/// `tests::direct_encoding_matches_the_value_builders`.
pub(crate) struct TaskResult<'a> {
    pub(crate) record: &'a TaskRecord,
    pub(crate) server: &'a ServerInfo,
    pub(crate) shape: Shape,
}

impl Serialize for TaskResult<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let r = self.record;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry(
            "resultType",
            match self.shape {
                Shape::Created => "task",
                Shape::Detailed => "complete",
            },
        )?;
        m.serialize_entry("taskId", r.id.as_str())?;
        m.serialize_entry("status", r.status.as_str())?;
        if let Some(message) = &r.status_message {
            m.serialize_entry("statusMessage", message)?;
        }
        m.serialize_entry("createdAt", &iso8601(r.created_at_ms))?;
        m.serialize_entry("lastUpdatedAt", &iso8601(r.last_updated_at_ms))?;
        m.serialize_entry("ttlMs", &r.ttl_ms)?;
        if let Some(p) = r.poll_interval_ms {
            m.serialize_entry("pollIntervalMs", &p)?;
        }
        if self.shape == Shape::Detailed {
            match (r.status, &r.outcome) {
                (TaskStatus::InputRequired, _) => {
                    m.serialize_entry("inputRequests", &r.pending_inputs)?;
                }
                (TaskStatus::Completed, Some(TaskOutcome::Result(result))) => {
                    m.serialize_entry(
                        "result",
                        &ToolResult {
                            result,
                            server: self.server,
                        },
                    )?;
                }
                (TaskStatus::Failed, Some(TaskOutcome::Error(e))) => {
                    m.serialize_entry("error", &ErrorObject(e))?;
                }
                _ => {}
            }
        }
        m.serialize_entry("_meta", &MetaWithServer::alone(self.server))?;
        m.end()
    }
}

/// `{"code", "message", "data"?}` of a failed task.
struct ErrorObject<'a>(&'a super::TaskError);

impl Serialize for ErrorObject<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("code", &self.0.code)?;
        m.serialize_entry("message", &self.0.message)?;
        if let Some(data) = &self.0.data {
            m.serialize_entry("data", data)?;
        }
        m.end()
    }
}

/// What [`call_tool_result`] makes of a tool's result: its members in order, `resultType`
/// set to `complete` (in place, or appended), `content` appended when absent, and the server's
/// identity in `_meta`.
struct ToolResult<'a> {
    result: &'a Value,
    server: &'a ServerInfo,
}

impl Serialize for ToolResult<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        let Value::Object(members) = self.result else {
            let text = self.result.to_string();
            m.serialize_entry("content", &[TextContent { text: &text }])?;
            m.serialize_entry("resultType", "complete")?;
            m.serialize_entry("_meta", &MetaWithServer::alone(self.server))?;
            return m.end();
        };
        for (key, value) in members {
            match (key.as_str(), value) {
                ("resultType", _) => m.serialize_entry(key, "complete")?,
                ("_meta", Value::Object(existing)) => m.serialize_entry(
                    key,
                    &MetaWithServer {
                        existing: Some(existing),
                        server: self.server,
                    },
                )?,
                _ => m.serialize_entry(key, value)?,
            }
        }
        if !members.contains_key("resultType") {
            m.serialize_entry("resultType", "complete")?;
        }
        if !members.contains_key("content") {
            m.serialize_entry("content", &[(); 0])?;
        }
        if !members.contains_key("_meta") {
            m.serialize_entry("_meta", &MetaWithServer::alone(self.server))?;
        }
        m.end()
    }
}

/// `{"type": "text", "text": …}`.
struct TextContent<'a> {
    text: &'a str,
}

impl Serialize for TextContent<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("type", "text")?;
        m.serialize_entry("text", self.text)?;
        m.end()
    }
}

/// A `_meta` object with the server's identity set (in place, or appended), as
/// `with_server_info` makes it.
struct MetaWithServer<'a> {
    existing: Option<&'a Map<String, Value>>,
    server: &'a ServerInfo,
}

impl<'a> MetaWithServer<'a> {
    /// A `_meta` holding the server's identity alone.
    fn alone(server: &'a ServerInfo) -> Self {
        Self {
            existing: None,
            server,
        }
    }
}

impl Serialize for MetaWithServer<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let info = ServerInfoObject(self.server);
        let mut m = s.serialize_map(None)?;
        let mut written = false;
        for (key, value) in self.existing.into_iter().flatten() {
            if key == keys::SERVER_INFO {
                m.serialize_entry(key, &info)?;
                written = true;
            } else {
                m.serialize_entry(key, value)?;
            }
        }
        if !written {
            m.serialize_entry(keys::SERVER_INFO, &info)?;
        }
        m.end()
    }
}

/// `{"name", "version"}`, as [`ServerInfo::to_json`].
struct ServerInfoObject<'a>(&'a ServerInfo);

impl Serialize for ServerInfoObject<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("name", &self.0.name)?;
        m.serialize_entry("version", &self.0.version)?;
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::*;
    use crate::task::{Owner, TaskError, TaskId};

    fn record(status: TaskStatus, outcome: Option<TaskOutcome>) -> TaskRecord {
        let mut r = TaskRecord::new(
            TaskId::generate(),
            Owner::anonymous(),
            "t".into(),
            json!({}),
            json!({}),
            1_796_000_000_123,
            Some(60_000),
            Some(500),
            None,
        );
        r.status = status;
        r.outcome = outcome;
        r.last_updated_at_ms += 42;
        r
    }

    /// The direct encoding and the `Value` builders give the same bytes: same members, same
    /// order.
    fn assert_same(record: &TaskRecord) {
        let server = ServerInfo::new("srv", "1.2.3");
        for (shape, built) in [
            (Shape::Created, create_task(record, &server)),
            (Shape::Detailed, get_task(record, &server)),
        ] {
            let direct = TaskResult {
                record,
                server: &server,
                shape,
            };
            assert_eq!(
                serde_json::to_string(&direct).unwrap(),
                serde_json::to_string(&built).unwrap(),
                "{shape:?} of {record:?}"
            );
        }
    }

    #[test]
    fn direct_encoding_matches_the_value_builders() {
        let error = TaskError {
            code: -32000,
            message: "boom".into(),
            data: Some(json!({"why": [1, 2]})),
        };
        let results = [
            json!({"content": [{"type": "text", "text": "hi"}]}),
            json!({"content": [], "isError": true, "structuredContent": {"a": 1}}),
            json!({"resultType": "task", "content": []}),
            json!({"_meta": {"x": 1, "io.modelcontextprotocol/serverInfo": "old"}, "z": 0}),
            json!({"_meta": "not an object"}),
            json!({}),
            json!("plain text"),
            json!([1, "two"]),
            Value::Null,
        ];
        for result in results {
            assert_same(&record(
                TaskStatus::Completed,
                Some(TaskOutcome::Result(result)),
            ));
        }
        assert_same(&record(TaskStatus::Failed, Some(TaskOutcome::Error(error))));
        let mut no_data = record(
            TaskStatus::Failed,
            Some(TaskOutcome::Error(TaskError {
                code: 1,
                message: String::new(),
                data: None,
            })),
        );
        no_data.ttl_ms = None;
        no_data.poll_interval_ms = None;
        no_data.status_message = Some("why \"quoted\" \u{1F600}".into());
        assert_same(&no_data);
        let mut waiting = record(TaskStatus::InputRequired, None);
        waiting
            .pending_inputs
            .insert("b".into(), json!({"method": "elicitation/create"}));
        waiting.pending_inputs.insert("a".into(), json!(1));
        assert_same(&waiting);
        assert_same(&record(TaskStatus::Working, None));
        assert_same(&record(TaskStatus::Cancelled, None));
        // A status without the outcome it should carry (never written by the state machine).
        assert_same(&record(TaskStatus::Completed, None));
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            ".{0,8}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 6, |inner| {
            // Keys drawn partly from the members the encoding treats specially.
            let key = prop_oneof![
                Just("resultType".to_owned()),
                Just("content".to_owned()),
                Just("_meta".to_owned()),
                Just("io.modelcontextprotocol/serverInfo".to_owned()),
                ".{0,6}",
            ];
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::vec((key, inner), 0..6)
                    .prop_map(|entries| Value::Object(entries.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn direct_encoding_matches_for_any_tool_result(result in arb_json()) {
            assert_same(&record(TaskStatus::Completed, Some(TaskOutcome::Result(result))));
        }
    }
}
