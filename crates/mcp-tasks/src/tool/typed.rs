//! Typed tools and typed elicitation: argument and answer types whose JSON Schema is derived
//! with [`schemars`], so that the schema a client sees and the type the tool reads cannot
//! drift apart.
//!
//! A typed tool's `inputSchema` is derived from its argument type; the runtime still
//! validates every call's arguments against that schema (with the `jsonschema` crate, `-32602`
//! naming the member), then hands the tool the deserialized value. [`ToolContext::elicit`]
//! derives an elicitation's `requestedSchema` from the answer type and returns the answer as
//! that type, or the user's decline or cancel.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use super::{CallToolResult, Tool, ToolContext, ToolDescriptor, ToolError, ToolFuture};
use crate::wire::error::RpcError;

/// The JSON Schema of `T` as a tool's `inputSchema` or `outputSchema` wants it: draft
/// 2020-12, every subschema inlined (no `$ref`), without the `$schema` and `title` members
/// (`tools/list` shows the tool's own name and title).
///
/// ```
/// # use mcp_tasks::tool::schema_for;
/// #[derive(serde::Deserialize, schemars::JsonSchema)]
/// struct Args {
///     /// Where to read from.
///     source: String,
///     limit: Option<u32>,
/// }
/// let schema = schema_for::<Args>();
/// assert_eq!(schema["type"], "object");
/// assert_eq!(schema["required"], serde_json::json!(["source"]));
/// assert_eq!(schema["properties"]["source"]["description"], "Where to read from.");
/// ```
pub fn schema_for<T: JsonSchema>() -> Value {
    let generator = schemars::generate::SchemaSettings::draft2020_12()
        .with(|s| s.inline_subschemas = true)
        .into_generator();
    let mut schema: Value = generator.into_root_schema_for::<T>().into();
    if let Value::Object(members) = &mut schema {
        members.remove("$schema");
        members.remove("title");
    }
    schema
}

/// The `requestedSchema` of a form elicitation for `T`: [`schema_for`], then reduced to what
/// MCP allows there (a flat object of primitive members): an optional member's
/// `["string", "null"]` type becomes `"string"` (it is left out of `required` already), and
/// the integer `format`s schemars adds are dropped.
pub fn elicitation_schema_for<T: JsonSchema>() -> Value {
    let mut schema = schema_for::<T>();
    if let Some(Value::Object(properties)) = schema.get_mut("properties") {
        for property in properties.values_mut() {
            let Value::Object(p) = property else { continue };
            if let Some(Value::Array(types)) = p.get("type") {
                let types: Vec<Value> = types
                    .iter()
                    .filter(|t| t.as_str() != Some("null"))
                    .cloned()
                    .collect();
                if types.len() == 1 {
                    p.insert("type".into(), types[0].clone());
                }
            }
            if matches!(
                p.get("type").and_then(Value::as_str),
                Some("integer" | "number")
            ) {
                p.remove("format");
            }
        }
    }
    schema
}

/// What the user did with a typed elicitation ([`ToolContext::elicit`]): the three actions
/// of an MCP `ElicitResult`, which is why this enum is exhaustive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Elicited<T> {
    /// The user accepted and the answer is `T`.
    Accepted(T),
    /// The user explicitly declined.
    Declined,
    /// The user dismissed the request (also an unreadable answer: the safe outcome).
    Cancelled,
}

impl<T> Elicited<T> {
    /// The answer, if the user accepted.
    pub fn accepted(self) -> Option<T> {
        match self {
            Self::Accepted(v) => Some(v),
            Self::Declined | Self::Cancelled => None,
        }
    }
}

/// Reads a typed value out of JSON the runtime already validated against `T`'s schema; what
/// still does not fit (a constraint the schema cannot say) is `-32602` naming the value.
pub(crate) fn from_validated<T: DeserializeOwned>(
    what: &str,
    value: Value,
) -> Result<T, ToolError> {
    serde_json::from_value(value)
        .map_err(|e| ToolError::Rpc(RpcError::invalid_params(format!("{what}: {e}"))))
}

/// A tool whose arguments are `A`; see [`typed_tool`].
struct TypedTool<A, F> {
    descriptor: ToolDescriptor,
    f: F,
    args: PhantomData<fn() -> A>,
}

impl<A, F, Fut> Tool for TypedTool<A, F>
where
    A: DeserializeOwned + Send + 'static,
    F: Fn(ToolContext, A) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<CallToolResult, ToolError>> + Send + 'static,
{
    fn descriptor(&self) -> &ToolDescriptor {
        &self.descriptor
    }

    fn call(&self, ctx: ToolContext, arguments: Map<String, Value>) -> ToolFuture {
        match from_validated::<A>("invalid arguments", Value::Object(arguments)) {
            Ok(args) => Box::pin((self.f)(ctx, args)),
            Err(e) => Box::pin(async move { Err(e) }),
        }
    }
}

/// Builds a tool whose arguments are the type `A`: its `inputSchema` is derived from `A` (see
/// [`schema_for`]; it replaces the descriptor's), every call's arguments are validated
/// against it and then deserialized into `A` for the closure.
///
/// ```
/// use mcp_tasks::tool::{CallToolResult, ToolDescriptor, typed_tool};
///
/// #[derive(serde::Deserialize, schemars::JsonSchema)]
/// struct Greet {
///     /// Who to greet.
///     name: String,
/// }
///
/// let tool = typed_tool(
///     ToolDescriptor::new("greet", "Greets someone"),
///     |_ctx, Greet { name }: Greet| async move { Ok(CallToolResult::text(format!("Hello, {name}!"))) },
/// );
/// assert_eq!(tool.descriptor().input_schema["required"], serde_json::json!(["name"]));
/// ```
pub fn typed_tool<A, F, Fut>(descriptor: ToolDescriptor, f: F) -> Arc<dyn Tool>
where
    A: DeserializeOwned + JsonSchema + Send + 'static,
    F: Fn(ToolContext, A) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<CallToolResult, ToolError>> + Send + 'static,
{
    Arc::new(TypedTool {
        descriptor: descriptor.input_schema(schema_for::<A>()),
        f,
        args: PhantomData,
    })
}

impl ToolDescriptor {
    /// Sets the `outputSchema` to the one derived from `O` (see [`schema_for`]); return the
    /// value with [`CallToolResult::structured`].
    pub fn output_schema_for<O: JsonSchema>(mut self) -> Self {
        self.output_schema = Some(schema_for::<O>());
        self
    }
}

impl CallToolResult {
    /// A structured result: `structuredContent` is `value`, and one text block carries the
    /// same JSON for clients that read only content blocks (as MCP recommends).
    pub fn structured<O: Serialize>(value: &O) -> Result<Self, ToolError> {
        let value = serde_json::to_value(value).map_err(|e| {
            ToolError::Rpc(RpcError::internal(format!(
                "the structured result does not serialize: {e}"
            )))
        })?;
        Ok(
            Self::new(vec![json!({ "type": "text", "text": value.to_string() })])
                .with_structured(value),
        )
    }
}
