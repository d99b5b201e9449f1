//! Tools hosted by the runtime: the public API a host application implements.
//!
//! A tool is a descriptor (name, description, `inputSchema`, [`TaskPolicy`]) and an async
//! function of a [`ToolContext`] and the call's arguments. When a call becomes a task the
//! function runs inside the task's actor; after a restart it runs again from the top, and
//! the context replays what was already committed: journaled [`ToolContext::step`]s return
//! their recorded values, answered [`ToolContext::input`]s return their answers.

pub(crate) mod context;
pub(crate) mod registry;
mod typed;

pub use context::{ElicitAction, ElicitResponse, InputRequest, LogLevel, StepKey, ToolContext};
pub(crate) use registry::ToolRegistry;
pub use registry::{RegistryError, ToolSet, ToolSource};
pub use typed::{Elicited, elicitation_schema_for, schema_for, typed_tool};

use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::{Map, Value, json};

use crate::wire::error::RpcError;

/// Whether a call of this tool becomes a task (the server decides per call, as the Tasks extension allows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskPolicy {
    /// Always answered synchronously with a `CallToolResult`.
    Never,
    /// A task when the request declares the Tasks extension, a synchronous call otherwise.
    WhenSupported,
    /// Always a task; a client that did not declare the extension gets `-32021`.
    Always,
}

/// What `tools/list` shows of a tool, plus how the server runs it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDescriptor {
    /// The tool's name (unique in the runtime; `tools/call` names it).
    pub name: String,
    /// A human-readable title.
    pub title: Option<String>,
    /// What the tool does, for the model.
    pub description: String,
    /// A JSON Schema object with `"type": "object"`; arguments are validated against it.
    pub input_schema: Value,
    /// The JSON Schema of `structuredContent`, when the tool returns structured results.
    pub output_schema: Option<Value>,
    /// MCP tool annotations (`readOnlyHint`, `destructiveHint`, ...), as given.
    pub annotations: Option<Value>,
    /// Whether a call becomes a task.
    pub task_policy: TaskPolicy,
    /// Time to live of this tool's tasks; `None` takes the runtime's default.
    pub ttl_ms: Option<u64>,
    /// The first `statusMessage` of a task of this tool.
    pub initial_status_message: Option<String>,
    /// Whether a task of this tool waiting for input may be passivated (its actor and the
    /// tool's future dropped, the tool run again from its start when the task is needed; see
    /// [`crate::RuntimeConfig::passivate_after`]). Default `true`; `false` for a tool that
    /// keeps working while its task waits ([`ToolDescriptor::stay_active_while_waiting`]).
    pub passivate: bool,
    /// How many tasks of this tool may run at once in the runtime; beyond it a call still
    /// creates its task, which waits `working` (`statusMessage` `queued: N ahead`) until a
    /// slot frees. `None` (the default): no limit of its own. A limit the runtime sets for
    /// the tool ([`crate::RuntimeBuilder::max_running`]) takes precedence.
    pub max_running: Option<u32>,
    /// The flow group the tool belongs to: a limit set for the group
    /// ([`crate::quota::FlowLimits::per_group`]) holds for its tools together. The gateway
    /// puts each upstream's tools in `upstream:NAME`. `None` (the default): no group.
    pub flow_group: Option<String>,
}

impl ToolDescriptor {
    /// A descriptor with an empty-object input schema and [`TaskPolicy::WhenSupported`].
    pub fn new(name: impl Into<String>, description: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            title: None,
            description: description.into(),
            input_schema: json!({ "type": "object", "properties": {} }),
            output_schema: None,
            annotations: None,
            task_policy: TaskPolicy::WhenSupported,
            ttl_ms: None,
            initial_status_message: None,
            passivate: true,
            max_running: None,
            flow_group: None,
        }
    }

    /// Sets the title.
    pub fn title(mut self, title: impl Into<String>) -> Self {
        self.title = Some(title.into());
        self
    }

    /// Sets the `inputSchema` (a JSON Schema object with `"type": "object"`).
    pub fn input_schema(mut self, schema: Value) -> Self {
        self.input_schema = schema;
        self
    }

    /// Sets the [`TaskPolicy`].
    pub fn task_policy(mut self, policy: TaskPolicy) -> Self {
        self.task_policy = policy;
        self
    }

    /// Sets the time to live of this tool's tasks, in milliseconds.
    pub fn ttl_ms(mut self, ttl_ms: u64) -> Self {
        self.ttl_ms = Some(ttl_ms);
        self
    }

    /// Sets the first `statusMessage` of this tool's tasks.
    pub fn initial_status_message(mut self, message: impl Into<String>) -> Self {
        self.initial_status_message = Some(message.into());
        self
    }

    /// Keeps a task of this tool active while it waits for input: never passivated, for a
    /// tool that does work meanwhile (follows something, sends progress) rather than only
    /// wait for the answer.
    pub fn stay_active_while_waiting(mut self) -> Self {
        self.passivate = false;
        self
    }

    /// Lets at most `n` tasks of this tool run at once; more wait, queued (see
    /// the `max_running` field). `0` is taken as 1.
    pub fn max_running(mut self, n: u32) -> Self {
        self.max_running = Some(n.max(1));
        self
    }

    /// Puts the tool in flow group `group` (see the `flow_group` field).
    pub fn flow_group(mut self, group: impl Into<String>) -> Self {
        self.flow_group = Some(group.into());
        self
    }

    /// The `Tool` object of `tools/list`.
    pub fn to_json(&self) -> Value {
        let mut t = Map::new();
        t.insert("name".into(), json!(self.name));
        if let Some(title) = &self.title {
            t.insert("title".into(), json!(title));
        }
        t.insert("description".into(), json!(self.description));
        t.insert("inputSchema".into(), self.input_schema.clone());
        if let Some(o) = &self.output_schema {
            t.insert("outputSchema".into(), o.clone());
        }
        if let Some(a) = &self.annotations {
            t.insert("annotations".into(), a.clone());
        }
        Value::Object(t)
    }
}

/// What a tool returns: the `CallToolResult` of MCP. `is_error: true` is still a result (the
/// task ends `completed`); protocol failures are [`ToolError::Rpc`] (the task ends `failed`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CallToolResult {
    /// The content blocks (see [`crate::content`]).
    pub content: Vec<Value>,
    /// The `structuredContent`, if any.
    pub structured_content: Option<Value>,
    /// Whether this is a tool-level error reported to the model.
    pub is_error: bool,
}

impl CallToolResult {
    /// A result with these content blocks (see [`crate::content`] for text, image, audio,
    /// resource links and embedded resources).
    pub fn new(content: Vec<Value>) -> Self {
        Self {
            content,
            ..Self::default()
        }
    }

    /// One text content block.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            content: vec![json!({ "type": "text", "text": text.into() })],
            ..Self::default()
        }
    }

    /// A tool-level error reported to the model (`isError: true`).
    pub fn error_text(text: impl Into<String>) -> Self {
        Self {
            is_error: true,
            ..Self::text(text)
        }
    }

    /// Sets `structuredContent`.
    pub fn with_structured(mut self, value: Value) -> Self {
        self.structured_content = Some(value);
        self
    }

    /// The JSON object, without `resultType` and `_meta` (the wire layer adds both).
    pub fn to_json(&self) -> Value {
        let mut r = Map::new();
        r.insert("content".into(), Value::Array(self.content.clone()));
        if let Some(s) = &self.structured_content {
            r.insert("structuredContent".into(), s.clone());
        }
        r.insert("isError".into(), json!(self.is_error));
        Value::Object(r)
    }
}

/// Why a tool call did not produce a result.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    /// The tool ends with a JSON-RPC error: the task becomes `failed` with this `error`.
    #[error(transparent)]
    Rpc(RpcError),
    /// A synchronous call needs client input first (core MRTR): the call answers
    /// `input_required` with these requests. Produced by [`ToolContext::input`]; return it as
    /// it is.
    #[error("the call needs client input: {}", .0.keys().cloned().collect::<Vec<_>>().join(", "))]
    InputRequired(std::collections::BTreeMap<String, Value>),
    /// The task was cancelled while the tool waited or worked: the task becomes `cancelled`.
    #[error("the task was cancelled")]
    Cancelled,
    /// The runtime could not record what the tool did (the store failed, the task actor is
    /// gone, a journaled value no longer decodes). The tool should return this error as it is:
    /// the actor then restarts the task from its last committed snapshot.
    #[error("the task runtime failed: {message}{}", cause_suffix(source.as_deref()))]
    Runtime {
        /// What the runtime was doing.
        message: String,
        /// The underlying error, when there is one (a serde error, the actor system's error).
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

/// `": {cause}"`, so that the message of [`ToolError::Runtime`] names its cause.
fn cause_suffix(source: Option<&(dyn std::error::Error + Send + Sync)>) -> String {
    source.map(|s| format!(": {s}")).unwrap_or_default()
}

impl ToolError {
    /// A JSON-RPC error with the given code and message.
    pub fn rpc(code: i64, message: impl Into<String>) -> Self {
        Self::Rpc(RpcError::new(code, message))
    }

    /// [`ToolError::Runtime`] without an underlying error.
    pub(crate) fn runtime(message: impl Into<String>) -> Self {
        Self::Runtime {
            message: message.into(),
            source: None,
        }
    }

    /// [`ToolError::Runtime`] caused by `source`.
    pub(crate) fn runtime_caused(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::Runtime {
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }
}

/// The boxed future a tool returns.
pub type ToolFuture = BoxFuture<'static, Result<CallToolResult, ToolError>>;

/// The boxed future of [`Tool::prepare`].
pub type PrepareFuture = BoxFuture<'static, Result<Map<String, Value>, ToolError>>;

/// A tool a host registers with the runtime.
///
/// Most tools are built with [`typed_tool`] (arguments as a Rust type, schema derived) or
/// [`tool_fn`] (a closure over the JSON arguments). Implement the trait directly for a tool
/// whose shape is only known at run time, e.g. one generated from configuration:
///
/// ```
/// use mcp_tasks::tool::{CallToolResult, Tool, ToolContext, ToolDescriptor, ToolFuture};
/// use serde_json::{json, Map, Value};
///
/// /// Returns one configured setting.
/// struct Setting {
///     descriptor: ToolDescriptor,
///     settings: Map<String, Value>,
/// }
///
/// impl Setting {
///     fn new(settings: Map<String, Value>) -> Self {
///         let names: Vec<&String> = settings.keys().collect();
///         let descriptor = ToolDescriptor::new("setting", "Reads a setting.").input_schema(json!({
///             "type": "object",
///             "properties": { "name": { "enum": names } },
///             "required": ["name"]
///         }));
///         Self { descriptor, settings }
///     }
/// }
///
/// impl Tool for Setting {
///     fn descriptor(&self) -> &ToolDescriptor {
///         &self.descriptor
///     }
///
///     fn call(&self, _ctx: ToolContext, arguments: Map<String, Value>) -> ToolFuture {
///         // The runtime validated `arguments` against the input schema: `name` is one of ours.
///         let value = self.settings[arguments["name"].as_str().unwrap_or_default()].clone();
///         Box::pin(async move { Ok(CallToolResult::text(value.to_string())) })
///     }
/// }
///
/// let tool = Setting::new(Map::from_iter([("region".to_owned(), json!("eu-west-1"))]));
/// assert_eq!(tool.descriptor().input_schema["properties"]["name"]["enum"], json!(["region"]));
/// ```
pub trait Tool: Send + Sync + 'static {
    /// The tool's name, description, schemas and task policy, as `tools/list` shows them.
    /// Read at registration and for every call; it must not change afterwards.
    fn descriptor(&self) -> &ToolDescriptor;
    /// Runs the tool. Arguments were validated against the input schema already.
    fn call(&self, ctx: ToolContext, arguments: Map<String, Value>) -> ToolFuture;
    /// Runs synchronously, inside the `tools/call` request, before the call becomes a task.
    /// It may ask for input through core MRTR ([`ToolContext::input`] answers come from the
    /// request's `inputResponses` and `requestState`); the arguments it returns are the ones
    /// the task runs with. The default passes the arguments through.
    fn prepare(&self, _ctx: ToolContext, arguments: Map<String, Value>) -> PrepareFuture {
        Box::pin(async move { Ok(arguments) })
    }
}

/// A tool with a [`Tool::prepare`] phase; see [`with_prepare`].
struct Prepared<P> {
    tool: Arc<dyn Tool>,
    prepare: P,
}

impl<P, Fut> Tool for Prepared<P>
where
    P: Fn(ToolContext, Map<String, Value>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Map<String, Value>, ToolError>> + Send + 'static,
{
    fn descriptor(&self) -> &ToolDescriptor {
        self.tool.descriptor()
    }

    fn call(&self, ctx: ToolContext, arguments: Map<String, Value>) -> ToolFuture {
        self.tool.call(ctx, arguments)
    }

    fn prepare(&self, ctx: ToolContext, arguments: Map<String, Value>) -> PrepareFuture {
        Box::pin((self.prepare)(ctx, arguments))
    }
}

/// Adds a synchronous preparation phase (with core MRTR input) to a tool.
pub fn with_prepare<P, Fut>(tool: Arc<dyn Tool>, prepare: P) -> Arc<dyn Tool>
where
    P: Fn(ToolContext, Map<String, Value>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Map<String, Value>, ToolError>> + Send + 'static,
{
    Arc::new(Prepared { tool, prepare })
}

/// A tool made of a descriptor and an async closure; see [`tool_fn`].
pub struct FnTool<F> {
    descriptor: ToolDescriptor,
    f: F,
}

impl<F, Fut> Tool for FnTool<F>
where
    F: Fn(ToolContext, Map<String, Value>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<CallToolResult, ToolError>> + Send + 'static,
{
    fn descriptor(&self) -> &ToolDescriptor {
        &self.descriptor
    }

    fn call(&self, ctx: ToolContext, arguments: Map<String, Value>) -> ToolFuture {
        Box::pin((self.f)(ctx, arguments))
    }
}

/// Builds a tool from a descriptor and an async closure.
pub fn tool_fn<F, Fut>(descriptor: ToolDescriptor, f: F) -> Arc<dyn Tool>
where
    F: Fn(ToolContext, Map<String, Value>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<CallToolResult, ToolError>> + Send + 'static,
{
    Arc::new(FnTool { descriptor, f })
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::ToolError;

    #[test]
    fn a_runtime_error_keeps_its_cause() {
        let cause = serde_json::from_str::<u32>("\"x\"").unwrap_err();
        let text = cause.to_string();
        let e =
            ToolError::runtime_caused("the recorded value of step `a` no longer decodes", cause);
        assert_eq!(
            e.to_string(),
            format!(
                "the task runtime failed: the recorded value of step `a` no longer decodes: {text}"
            )
        );
        assert!(
            e.source()
                .and_then(|s| s.downcast_ref::<serde_json::Error>())
                .is_some()
        );
        let e = ToolError::runtime("the task actor stopped");
        assert_eq!(
            e.to_string(),
            "the task runtime failed: the task actor stopped"
        );
        assert!(e.source().is_none());
    }
}
