//! Prompts and resources a host serves beside its tools. Both are advertised in
//! `server/discover` only when something is registered.
//!
//! Prompts run like synchronous tool calls: `prompts/get` hands the prompt a [`ToolContext`]
//! whose [`ToolContext::input`] works through core MRTR (`input_required` results).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::{Map, Value, json};

use crate::tool::{ToolContext, ToolError};

/// One declared prompt argument.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptArgument {
    pub name: String,
    pub description: Option<String>,
    pub required: bool,
}

/// What `prompts/list` shows of a prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptDescriptor {
    pub name: String,
    pub title: Option<String>,
    pub description: Option<String>,
    pub arguments: Vec<PromptArgument>,
}

impl PromptDescriptor {
    pub fn new(name: impl Into<String>, description: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            title: None,
            description: Some(description.into()),
            arguments: Vec::new(),
        }
    }

    pub fn argument(
        mut self,
        name: impl Into<String>,
        description: impl Into<String>,
        required: bool,
    ) -> Self {
        self.arguments.push(PromptArgument {
            name: name.into(),
            description: Some(description.into()),
            required,
        });
        self
    }

    pub fn to_json(&self) -> Value {
        let mut p = Map::new();
        p.insert("name".into(), json!(self.name));
        if let Some(t) = &self.title {
            p.insert("title".into(), json!(t));
        }
        if let Some(d) = &self.description {
            p.insert("description".into(), json!(d));
        }
        if !self.arguments.is_empty() {
            let args: Vec<Value> = self
                .arguments
                .iter()
                .map(|a| {
                    let mut o = Map::new();
                    o.insert("name".into(), json!(a.name));
                    if let Some(d) = &a.description {
                        o.insert("description".into(), json!(d));
                    }
                    o.insert("required".into(), json!(a.required));
                    Value::Object(o)
                })
                .collect();
            p.insert("arguments".into(), Value::Array(args));
        }
        Value::Object(p)
    }
}

/// The result of `prompts/get`: `messages` (`PromptMessage` objects) and a description.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GetPromptResult {
    pub description: Option<String>,
    pub messages: Vec<Value>,
}

impl GetPromptResult {
    /// One user message with text content.
    pub fn user_text(text: impl Into<String>) -> Self {
        Self {
            description: None,
            messages: vec![
                json!({ "role": "user", "content": { "type": "text", "text": text.into() } }),
            ],
        }
    }

    pub fn to_json(&self) -> Value {
        let mut r = Map::new();
        if let Some(d) = &self.description {
            r.insert("description".into(), json!(d));
        }
        r.insert("messages".into(), Value::Array(self.messages.clone()));
        Value::Object(r)
    }
}

/// The boxed future a prompt returns.
pub type PromptFuture = BoxFuture<'static, Result<GetPromptResult, ToolError>>;

/// A prompt a host registers.
pub trait Prompt: Send + Sync + 'static {
    fn descriptor(&self) -> &PromptDescriptor;
    fn get(&self, ctx: ToolContext, arguments: Map<String, Value>) -> PromptFuture;
}

struct FnPrompt<F> {
    descriptor: PromptDescriptor,
    f: F,
}

impl<F, Fut> Prompt for FnPrompt<F>
where
    F: Fn(ToolContext, Map<String, Value>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<GetPromptResult, ToolError>> + Send + 'static,
{
    fn descriptor(&self) -> &PromptDescriptor {
        &self.descriptor
    }

    fn get(&self, ctx: ToolContext, arguments: Map<String, Value>) -> PromptFuture {
        Box::pin((self.f)(ctx, arguments))
    }
}

/// Builds a prompt from a descriptor and an async closure.
pub fn prompt_fn<F, Fut>(descriptor: PromptDescriptor, f: F) -> Arc<dyn Prompt>
where
    F: Fn(ToolContext, Map<String, Value>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<GetPromptResult, ToolError>> + Send + 'static,
{
    Arc::new(FnPrompt { descriptor, f })
}

/// A static resource: its `resources/list` entry and its contents.
#[derive(Debug, Clone, PartialEq)]
pub struct Resource {
    pub uri: String,
    pub name: String,
    pub description: Option<String>,
    pub mime_type: Option<String>,
    pub text: String,
}

impl Resource {
    pub fn text(uri: impl Into<String>, name: impl Into<String>, text: impl Into<String>) -> Self {
        Self {
            uri: uri.into(),
            name: name.into(),
            description: None,
            mime_type: Some("text/plain".into()),
            text: text.into(),
        }
    }

    pub fn to_json(&self) -> Value {
        listing(
            "uri",
            &self.uri,
            &self.name,
            self.description.as_deref(),
            self.mime_type.as_deref(),
        )
    }

    /// The `contents` entry of `resources/read`.
    pub fn contents(&self) -> Value {
        let mut c = Map::new();
        c.insert("uri".into(), json!(self.uri));
        if let Some(m) = &self.mime_type {
            c.insert("mimeType".into(), json!(m));
        }
        c.insert("text".into(), json!(self.text));
        Value::Object(c)
    }
}

/// A resource template (RFC 6570 `uriTemplate`), listed by `resources/templates/list`.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceTemplate {
    pub uri_template: String,
    pub name: String,
    pub description: Option<String>,
    pub mime_type: Option<String>,
}

impl ResourceTemplate {
    pub fn to_json(&self) -> Value {
        listing(
            "uriTemplate",
            &self.uri_template,
            &self.name,
            self.description.as_deref(),
            self.mime_type.as_deref(),
        )
    }
}

/// The list entry of a resource or template: its address under `key`, name, description and
/// MIME type.
fn listing(
    key: &str,
    address: &str,
    name: &str,
    description: Option<&str>,
    mime: Option<&str>,
) -> Value {
    let mut r = Map::new();
    r.insert(key.into(), json!(address));
    r.insert("name".into(), json!(name));
    if let Some(d) = description {
        r.insert("description".into(), json!(d));
    }
    if let Some(m) = mime {
        r.insert("mimeType".into(), json!(m));
    }
    Value::Object(r)
}

/// Prompts, resources and resource templates of one runtime.
#[derive(Default)]
pub struct Catalog {
    prompts: BTreeMap<String, Arc<dyn Prompt>>,
    resources: BTreeMap<String, Resource>,
    templates: Vec<ResourceTemplate>,
}

impl Catalog {
    pub fn add_prompt(&mut self, prompt: Arc<dyn Prompt>) {
        self.prompts
            .insert(prompt.descriptor().name.clone(), prompt);
    }

    pub fn add_resource(&mut self, resource: Resource) {
        self.resources.insert(resource.uri.clone(), resource);
    }

    pub fn add_template(&mut self, template: ResourceTemplate) {
        self.templates.push(template);
    }

    pub fn has_prompts(&self) -> bool {
        !self.prompts.is_empty()
    }

    pub fn has_resources(&self) -> bool {
        !self.resources.is_empty() || !self.templates.is_empty()
    }

    pub fn prompt(&self, name: &str) -> Option<&Arc<dyn Prompt>> {
        self.prompts.get(name)
    }

    pub fn prompts(&self) -> Vec<Value> {
        self.prompts
            .values()
            .map(|p| p.descriptor().to_json())
            .collect()
    }

    pub fn resource(&self, uri: &str) -> Option<&Resource> {
        self.resources.get(uri)
    }

    pub fn resources(&self) -> Vec<Value> {
        self.resources.values().map(Resource::to_json).collect()
    }

    pub fn templates(&self) -> Vec<Value> {
        self.templates
            .iter()
            .map(ResourceTemplate::to_json)
            .collect()
    }
}
