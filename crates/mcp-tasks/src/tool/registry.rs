//! The tools a runtime serves: a [`ToolSet`] (tools with compiled argument validators) fixed
//! at start, and the [`ToolSource`]s whose tools change while it runs (a gateway's upstreams).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Map, Value};

use super::Tool;
use crate::wire::error::RpcError;

struct Entry {
    tool: Arc<dyn Tool>,
    validator: jsonschema::Validator,
    headers: Vec<HeaderParam>,
}

/// An argument a client mirrors into an HTTP header (SEP-2243 `x-mcp-header`): the
/// argument's value travels in `Mcp-Param-{header}` too, and the server checks that both agree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderParam {
    /// The top-level argument.
    pub argument: String,
    /// The header's name after `Mcp-Param-`, as declared.
    pub header: String,
    /// The argument's JSON type: `string`, `integer`, `number` or `boolean`.
    pub kind: String,
}

/// The `x-mcp-header` annotations of an input schema's top-level properties.
fn header_params(schema: &Value) -> Result<Vec<HeaderParam>, String> {
    let mut params: Vec<HeaderParam> = Vec::new();
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return Ok(params);
    };
    for (argument, property) in properties {
        let Some(annotation) = property.get("x-mcp-header") else {
            continue;
        };
        let header = annotation
            .as_str()
            .ok_or_else(|| format!("`x-mcp-header` of `{argument}` must be a string"))?;
        let token = !header.is_empty()
            && header
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !token {
            return Err(format!(
                "`x-mcp-header` of `{argument}` must be a non-empty HTTP header name token, not `{header}`"
            ));
        }
        let kind = match property.get("type").and_then(Value::as_str) {
            Some(k @ ("string" | "integer" | "number" | "boolean")) => k.to_owned(),
            _ => {
                return Err(format!(
                    "`{argument}` has `x-mcp-header` but is not of type string, integer, number or boolean"
                ));
            }
        };
        if let Some(other) = params
            .iter()
            .find(|p| p.header.eq_ignore_ascii_case(header))
        {
            return Err(format!(
                "`{argument}` and `{}` both use the header `Mcp-Param-{header}`",
                other.argument
            ));
        }
        params.push(HeaderParam {
            argument: argument.clone(),
            header: header.to_owned(),
            kind,
        });
    }
    Ok(params)
}

/// Longest validation detail quoted back to a client.
const MAX_DETAIL: usize = 256;

/// Tools by name with their compiled argument validators, listed in the order they were
/// registered (a deterministic `tools/list` whose order the host chooses).
#[derive(Default)]
pub struct ToolSet {
    tools: BTreeMap<String, Entry>,
    /// Names in registration order.
    order: Vec<String>,
}

/// Why a tool cannot be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// Two tools have the same name (names are unique within a server).
    #[error("a tool named `{0}` is already registered")]
    Duplicate(String),
    /// The `inputSchema` is not an object schema (`"type": "object"`), does not compile as
    /// JSON Schema 2020-12, or declares an invalid `x-mcp-header` parameter.
    #[error("tool `{name}` has an invalid inputSchema: {detail}")]
    InvalidSchema {
        /// The tool's name.
        name: String,
        /// What is wrong with the schema.
        detail: String,
    },
    /// The name is empty, longer than 128 characters or uses other characters than
    /// `A-Z a-z 0-9 _ - .` (the MCP tool-name rules).
    #[error("tool name `{0}` must be 1 to 128 characters of A-Z a-z 0-9 _ - .")]
    InvalidName(String),
}

impl ToolSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a tool. Its `inputSchema` must be an object schema with `"type": "object"`; an
    /// `x-mcp-header` annotation must name a header token on a top-level property of a
    /// primitive type, once per header name (case-insensitively).
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
        let headers =
            header_params(&d.input_schema).map_err(|detail| RegistryError::InvalidSchema {
                name: name.clone(),
                detail,
            })?;
        self.order.push(name.clone());
        self.tools.insert(
            name,
            Entry {
                tool,
                validator,
                headers,
            },
        );
        Ok(())
    }

    /// The tool named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name).map(|e| &e.tool)
    }

    /// How many tools the set has.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether the set has no tool.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The tools' names in registration order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.order.iter().map(String::as_str)
    }

    /// The arguments of tool `name` mirrored in `Mcp-Param-*` headers (empty for an unknown
    /// tool).
    pub(crate) fn header_params(&self, name: &str) -> &[HeaderParam] {
        self.tools.get(name).map_or(&[], |e| e.headers.as_slice())
    }

    /// The `tools/list` objects in registration order.
    pub(crate) fn list(&self) -> Vec<Value> {
        self.order
            .iter()
            .filter_map(|name| self.tools.get(name))
            .map(|e| e.tool.descriptor().to_json())
            .collect()
    }

    /// `-32602` naming the first offending field when `arguments` do not match the tool's
    /// `inputSchema`.
    pub(crate) fn validate(
        &self,
        name: &str,
        arguments: &Map<String, Value>,
    ) -> Result<(), RpcError> {
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

/// Tools that appear, change and disappear while the runtime runs: a gateway's upstream
/// servers (see `mcp_tasks::gateway`), or any other catalogue a host keeps outside the
/// runtime. Register one with `RuntimeBuilder::tool_source`.
///
/// The runtime asks [`ToolSource::current`] on every `tools/list` and `tools/call` (keep it
/// cheap: hand out an `Arc` built when the tools changed), and [`ToolSource::recover`] when a
/// stored task of a tool no longer listed runs again (after a restart, or on a replica that
/// took the task over): a source that can still run such a task (or fail it with a clear
/// error) answers `Some`, so that the task does not wait for a tool that may never come back.
pub trait ToolSource: Send + Sync + 'static {
    /// The tools offered now.
    fn current(&self) -> Arc<ToolSet>;
    /// A tool for a task of `name` that exists already, when [`ToolSource::current`] does not
    /// list it (its server is unreachable, say). The default: none.
    fn recover(&self, _name: &str) -> Option<Arc<dyn Tool>> {
        None
    }
    /// Why a tool `name` that [`ToolSource::current`] does not list cannot be called now,
    /// when the source knows (its server is down, say): the client that calls it gets this
    /// message (as a `-32603` error) instead of "Unknown tool". The default: `None`.
    fn unavailable(&self, _name: &str) -> Option<String> {
        None
    }
    /// Lines on the source's state for the body of the readiness probe (`GET /readyz`): a
    /// gateway's upstreams, say. They never make the runtime unready. The default: none.
    fn readiness(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Every tool of a runtime: the fixed [`ToolSet`] the host registered, then its
/// [`ToolSource`]s in registration order (a name in the fixed set hides the same name in a
/// source).
#[derive(Default)]
pub(crate) struct ToolRegistry {
    fixed: ToolSet,
    sources: Vec<Arc<dyn ToolSource>>,
}

impl ToolRegistry {
    pub(crate) fn new(fixed: ToolSet, sources: Vec<Arc<dyn ToolSource>>) -> Self {
        Self { fixed, sources }
    }

    /// Runs `f` on the set that holds `name` now.
    fn with<R>(&self, name: &str, f: impl FnOnce(&ToolSet) -> R) -> Option<R> {
        if self.fixed.get(name).is_some() {
            return Some(f(&self.fixed));
        }
        let set = self
            .sources
            .iter()
            .map(|source| source.current())
            .find(|set| set.get(name).is_some())?;
        Some(f(&set))
    }

    /// Whether the tools can change while the runtime runs (a [`ToolSource`] is registered).
    pub(crate) fn changes(&self) -> bool {
        !self.sources.is_empty()
    }

    /// The tool `name` as listed now.
    pub(crate) fn get(&self, name: &str) -> Option<Arc<dyn Tool>> {
        self.with(name, |set| set.get(name).cloned()).flatten()
    }

    /// The tool that runs a stored task of `name`: the listed one, else one a source can
    /// still run it with.
    pub(crate) fn recover(&self, name: &str) -> Option<Arc<dyn Tool>> {
        self.get(name)
            .or_else(|| self.sources.iter().find_map(|s| s.recover(name)))
    }

    /// The error of a call of `name`, a tool not listed now: a source's reason it cannot be
    /// called ([`ToolSource::unavailable`], `-32603`), else `-32602` "Unknown tool".
    pub(crate) fn unknown(&self, name: &str) -> RpcError {
        match self.sources.iter().find_map(|s| s.unavailable(name)) {
            Some(why) => RpcError::new(crate::wire::error::code::INTERNAL_ERROR, why),
            None => RpcError::invalid_params(format!("Unknown tool: {name}")),
        }
    }

    /// Every source's [`ToolSource::readiness`] lines.
    pub(crate) fn readiness(&self) -> Vec<String> {
        self.sources.iter().flat_map(|s| s.readiness()).collect()
    }

    /// The `tools/list` objects: the fixed tools, then each source's.
    pub(crate) fn list(&self) -> Vec<Value> {
        let mut tools = self.fixed.list();
        for source in &self.sources {
            let set = source.current();
            tools.extend(set.list().into_iter().filter(|t| {
                t.get("name")
                    .and_then(Value::as_str)
                    .is_none_or(|n| self.fixed.get(n).is_none())
            }));
        }
        tools
    }

    /// See [`ToolSet::header_params`].
    pub(crate) fn header_params(&self, name: &str) -> Vec<HeaderParam> {
        self.with(name, |set| set.header_params(name).to_vec())
            .unwrap_or_default()
    }

    /// See [`ToolSet::validate`].
    pub(crate) fn validate(
        &self,
        name: &str,
        arguments: &Map<String, Value>,
    ) -> Result<(), RpcError> {
        self.with(name, |set| set.validate(name, arguments))
            .unwrap_or_else(|| Err(RpcError::invalid_params(format!("Unknown tool: {name}"))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool::{CallToolResult, ToolDescriptor, tool_fn};
    use serde_json::json;

    fn with_schema(schema: Value) -> Result<(), RegistryError> {
        let tool = tool_fn(
            ToolDescriptor::new("t", "d").input_schema(schema),
            |_, _| async { Ok(CallToolResult::text("x")) },
        );
        ToolSet::new().register(tool)
    }

    #[test]
    fn header_annotations_are_checked() {
        let ok = json!({ "type": "object", "properties": {
            "region": { "type": "string", "x-mcp-header": "Region" },
            "priority": { "type": "integer", "x-mcp-header": "Priority" },
            "query": { "type": "string" }
        }});
        let mut registry = ToolSet::new();
        registry
            .register(tool_fn(
                ToolDescriptor::new("t", "d").input_schema(ok),
                |_, _| async { Ok(CallToolResult::text("x")) },
            ))
            .unwrap();
        let params = registry.header_params("t");
        assert_eq!(params.len(), 2);
        assert_eq!(params[0].argument, "region");
        assert_eq!(params[1].header, "Priority");
        assert!(registry.header_params("unknown").is_empty());
        for bad in [
            json!({ "type": "object", "properties": { "a": { "type": "string", "x-mcp-header": "" } } }),
            json!({ "type": "object", "properties": { "a": { "type": "string", "x-mcp-header": "A B" } } }),
            json!({ "type": "object", "properties": { "a": { "type": "string", "x-mcp-header": 5 } } }),
            json!({ "type": "object", "properties": { "a": { "type": "object", "x-mcp-header": "A" } } }),
            json!({ "type": "object", "properties": {
                "a": { "type": "string", "x-mcp-header": "Same" },
                "b": { "type": "string", "x-mcp-header": "same" } } }),
        ] {
            assert!(
                matches!(
                    with_schema(bad.clone()),
                    Err(RegistryError::InvalidSchema { .. })
                ),
                "{bad}"
            );
        }
    }
}
