//! Parameters of the methods this server handles. Unknown members are ignored (the legacy
//! `task` parameter of `tools/call` among them); missing or ill-typed ones are `-32602` with a
//! message that names the member.

use serde_json::{Map, Value};

use super::jsonrpc::kind;
use super::limits;
use crate::wire::error::RpcError;

/// `tools/call` parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct CallToolParams {
    pub name: String,
    pub arguments: Map<String, Value>,
    pub input_responses: Option<Map<String, Value>>,
    pub request_state: Option<String>,
}

/// `tasks/get` and `tasks/cancel` parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskIdParams {
    pub task_id: String,
}

/// `tasks/update` parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct UpdateTaskParams {
    pub task_id: String,
    pub input_responses: Map<String, Value>,
}

/// `tools/list` parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct ListParams {
    pub cursor: Option<String>,
}

type Params<'a> = Option<&'a Map<String, Value>>;

fn get<'a>(params: Params<'a>, key: &str) -> Option<&'a Value> {
    params.and_then(|p| p.get(key))
}

fn required_str(params: Params<'_>, key: &str, max: usize) -> Result<String, RpcError> {
    match get(params, key) {
        Some(Value::String(s)) if s.len() > max => Err(RpcError::invalid_params(format!(
            "`{key}` is longer than {max} characters"
        ))),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(RpcError::invalid_params(format!(
            "`{key}` must be a string, not {}",
            kind(other)
        ))),
        None => Err(RpcError::invalid_params(format!("`{key}` is required"))),
    }
}

fn optional_object(params: Params<'_>, key: &str) -> Result<Option<Map<String, Value>>, RpcError> {
    match get(params, key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(o)) => Ok(Some(o.clone())),
        Some(other) => Err(RpcError::invalid_params(format!(
            "`{key}` must be an object, not {}",
            kind(other)
        ))),
    }
}

impl CallToolParams {
    pub fn parse(params: Params<'_>) -> Result<Self, RpcError> {
        let name = required_str(params, "name", limits::MAX_NAME_LEN)?;
        let arguments = optional_object(params, "arguments")?.unwrap_or_default();
        let input_responses = optional_object(params, "inputResponses")?;
        let request_state = match get(params, "requestState") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => {
                return Err(RpcError::invalid_params(format!(
                    "`requestState` must be a string, not {}",
                    kind(other)
                )));
            }
        };
        Ok(Self {
            name,
            arguments,
            input_responses,
            request_state,
        })
    }
}

impl TaskIdParams {
    pub fn parse(params: Params<'_>) -> Result<Self, RpcError> {
        Ok(Self {
            task_id: required_str(params, "taskId", limits::MAX_NAME_LEN)?,
        })
    }
}

impl UpdateTaskParams {
    pub fn parse(params: Params<'_>) -> Result<Self, RpcError> {
        let task_id = required_str(params, "taskId", limits::MAX_NAME_LEN)?;
        let input_responses = optional_object(params, "inputResponses")?
            .ok_or_else(|| RpcError::invalid_params("`inputResponses` is required"))?;
        Ok(Self {
            task_id,
            input_responses,
        })
    }
}

impl ListParams {
    pub fn parse(params: Params<'_>) -> Result<Self, RpcError> {
        let cursor = match get(params, "cursor") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => {
                return Err(RpcError::invalid_params(format!(
                    "`cursor` must be a string, not {}",
                    kind(other)
                )));
            }
        };
        Ok(Self { cursor })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn call_tool_ignores_legacy_task_param() {
        let p = json!({"name": "greet", "arguments": {"name": "x"}, "task": {"ttl": 1}});
        let parsed = CallToolParams::parse(p.as_object()).unwrap();
        assert_eq!(parsed.name, "greet");
    }

    #[test]
    fn messages_name_the_member() {
        let e = CallToolParams::parse(json!({"name": 3}).as_object()).unwrap_err();
        assert!(e.message.contains("`name`"), "{}", e.message);
        let e = UpdateTaskParams::parse(json!({"taskId": "x"}).as_object()).unwrap_err();
        assert!(e.message.contains("`inputResponses`"), "{}", e.message);
        let e = TaskIdParams::parse(None).unwrap_err();
        assert!(e.message.contains("`taskId`"), "{}", e.message);
    }
}
