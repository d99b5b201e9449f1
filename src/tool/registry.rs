//! The set of tools a runtime serves, with compiled argument validators.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Map, Value};

use super::Tool;
use crate::error::RpcError;

struct Entry {
    tool: Arc<dyn Tool>,
    validator: jsonschema::Validator,
}

/// Longest validation detail quoted back to a client.
const MAX_DETAIL: usize = 256;

/// Tools by name, listed in name order (deterministic `tools/list`).
#[derive(Default)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Entry>,
}

/// Why a tool cannot be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    #[error("a tool named `{0}` is already registered")]
    Duplicate(String),
    #[error("tool `{name}` has an invalid inputSchema: {detail}")]
    InvalidSchema { name: String, detail: String },
    #[error("tool name `{0}` must be 1 to 128 characters of A-Z a-z 0-9 _ - .")]
    InvalidName(String),
}

impl ToolRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a tool. Its `inputSchema` must be an object schema with `"type": "object"`.
    pub fn register(&mut self, tool: Arc<dyn Tool>) -> Result<(), RegistryError> {
        let d = tool.descriptor();
        let name = d.name.clone();
        let valid_name = !name.is_empty()
            && name.len() <= 128
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
        if !valid_name {
            return Err(RegistryError::InvalidName(name));
        }
        if self.tools.contains_key(&name) {
            return Err(RegistryError::Duplicate(name));
        }
        if d.input_schema.get("type").and_then(Value::as_str) != Some("object") {
            return Err(RegistryError::InvalidSchema {
                name,
                detail: "it must be an object with \"type\": \"object\"".into(),
            });
        }
        let validator = jsonschema::validator_for(&d.input_schema).map_err(|e| {
            RegistryError::InvalidSchema {
                name: name.clone(),
                detail: e.to_string(),
            }
        })?;
        self.tools.insert(name, Entry { tool, validator });
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name).map(|e| &e.tool)
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// The `tools/list` objects in name order.
    pub fn list(&self) -> Vec<Value> {
        self.tools
            .values()
            .map(|e| e.tool.descriptor().to_json())
            .collect()
    }

    /// `-32602` naming the first offending field when `arguments` do not match the tool's
    /// `inputSchema`.
    pub fn validate(&self, name: &str, arguments: &Map<String, Value>) -> Result<(), RpcError> {
        let entry = self
            .tools
            .get(name)
            .ok_or_else(|| RpcError::invalid_params(format!("Unknown tool: {name}")))?;
        let instance = Value::Object(arguments.clone());
        match entry.validator.iter_errors(&instance).next() {
            None => Ok(()),
            Some(err) => {
                let path = err.instance_path().to_string();
                let field = if path.is_empty() {
                    "arguments".to_owned()
                } else {
                    format!("arguments{}", path.replace('/', "."))
                };
                // The validator's text quotes the offending value, which may be huge: cap it.
                let mut detail = err.to_string();
                if detail.len() > MAX_DETAIL {
                    let mut cut = MAX_DETAIL;
                    while !detail.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    detail.truncate(cut);
                    detail.push('…');
                }
                Err(RpcError::invalid_params(format!(
                    "invalid arguments for tool `{name}`: `{field}`: {detail}"
                )))
            }
        }
    }
}
