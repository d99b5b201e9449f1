//! Prompts, resources, resource templates and completions a host serves beside its tools.
//! Each is advertised in `server/discover` only when something is registered.
//!
//! Prompts run like synchronous tool calls: `prompts/get` hands the prompt a [`ToolContext`]
//! whose [`ToolContext::input`] works through core MRTR (`input_required` results).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::{Map, Value, json};

pub use crate::content::{ResourceBody, ResourceContents};
use crate::task::Owner;
use crate::tool::{ToolContext, ToolError};

/// One declared prompt argument.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptArgument {
    /// The argument's name.
    pub name: String,
    /// What the argument is for.
    pub description: Option<String>,
    /// Whether `prompts/get` must supply it.
    pub required: bool,
}

/// What `prompts/list` shows of a prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptDescriptor {
    /// The prompt's name (unique in the runtime).
    pub name: String,
    /// A human-readable title.
    pub title: Option<String>,
    /// What the prompt is for.
    pub description: Option<String>,
    /// Its declared arguments.
    pub arguments: Vec<PromptArgument>,
}

impl PromptDescriptor {
    /// A prompt with a name and a description and no arguments.
    pub fn new(name: impl Into<String>, description: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            title: None,
            description: Some(description.into()),
            arguments: Vec::new(),
        }
    }

    /// Declares an argument.
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

    /// The `Prompt` object of `prompts/list`.
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
    /// What the prompt produced, for the client.
    pub description: Option<String>,
    /// The `PromptMessage` objects.
    pub messages: Vec<Value>,
}

impl GetPromptResult {
    /// One user message with text content.
    pub fn user_text(text: impl Into<String>) -> Self {
        Self::new(vec![PromptMessage::user(crate::content::text(text))])
    }

    /// A result with these messages (see [`PromptMessage`]).
    pub fn new(messages: Vec<Value>) -> Self {
        Self {
            description: None,
            messages,
        }
    }

    /// Sets the description.
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }

    /// The JSON object, without `resultType` and `_meta` (the wire layer adds both).
    pub fn to_json(&self) -> Value {
        let mut r = Map::new();
        if let Some(d) = &self.description {
            r.insert("description".into(), json!(d));
        }
        r.insert("messages".into(), Value::Array(self.messages.clone()));
        Value::Object(r)
    }
}

/// Builds `PromptMessage`s: a role and one content block (see [`crate::content`]).
pub struct PromptMessage;

impl PromptMessage {
    /// A `user` message.
    pub fn user(content: Value) -> Value {
        json!({ "role": "user", "content": content })
    }

    /// An `assistant` message.
    pub fn assistant(content: Value) -> Value {
        json!({ "role": "assistant", "content": content })
    }
}

/// The boxed future a prompt returns.
pub type PromptFuture = BoxFuture<'static, Result<GetPromptResult, ToolError>>;

/// A prompt a host registers.
pub trait Prompt: Send + Sync + 'static {
    /// The prompt's name, description and arguments, as `prompts/list` shows them.
    fn descriptor(&self) -> &PromptDescriptor;
    /// Renders the prompt for `prompts/get`. Required arguments were checked to be present;
    /// an error becomes the JSON-RPC error of the request.
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

/// A static resource: its `resources/list` entry and its contents (text or binary).
#[derive(Debug, Clone, PartialEq)]
pub struct Resource {
    /// The resource's URI (unique in the runtime).
    pub uri: String,
    /// The resource's name.
    pub name: String,
    /// What the resource is.
    pub description: Option<String>,
    /// Its MIME type.
    pub mime_type: Option<String>,
    /// Its contents.
    pub body: ResourceBody,
}

impl Resource {
    /// A `text/plain` resource.
    pub fn text(uri: impl Into<String>, name: impl Into<String>, text: impl Into<String>) -> Self {
        Self {
            uri: uri.into(),
            name: name.into(),
            description: None,
            mime_type: Some("text/plain".into()),
            body: ResourceBody::Text(text.into()),
        }
    }

    /// A binary resource, read back base64-encoded as `blob`.
    pub fn blob(
        uri: impl Into<String>,
        name: impl Into<String>,
        mime_type: impl Into<String>,
        bytes: Vec<u8>,
    ) -> Self {
        Self {
            uri: uri.into(),
            name: name.into(),
            description: None,
            mime_type: Some(mime_type.into()),
            body: ResourceBody::Blob(bytes),
        }
    }

    /// Sets the description.
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }

    /// Sets the MIME type.
    pub fn mime_type(mut self, mime_type: impl Into<String>) -> Self {
        self.mime_type = Some(mime_type.into());
        self
    }

    /// The `Resource` object of `resources/list`.
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
        ResourceContents {
            uri: self.uri.clone(),
            mime_type: self.mime_type.clone(),
            body: self.body.clone(),
        }
        .to_json()
    }
}

/// A `resources/read` of a URI that matched a [`ResourceTemplate`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ResourceRequest {
    /// The URI as the client sent it.
    pub uri: String,
    /// The template's variables, percent-decoded (`test://items/{id}` read as
    /// `test://items/a%20b` gives `id = "a b"`).
    pub variables: BTreeMap<String, String>,
    /// Who reads.
    pub owner: Owner,
}

/// The boxed future a template reader returns. An empty `Vec` means "no such resource" and
/// is answered like an unknown URI.
pub type ResourceFuture = BoxFuture<'static, Result<Vec<ResourceContents>, ToolError>>;

/// Reads the resources of a template; see [`ResourceTemplate::reader`].
#[derive(Clone)]
pub struct TemplateReader(Arc<dyn Fn(ResourceRequest) -> ResourceFuture + Send + Sync>);

impl std::fmt::Debug for TemplateReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TemplateReader")
    }
}

impl PartialEq for TemplateReader {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// A resource template (RFC 6570 `uriTemplate`), listed by `resources/templates/list`. With a
/// [`reader`](ResourceTemplate::reader), every URI it matches can be read with
/// `resources/read`.
///
/// Templates with a reader support simple string expansion (`{name}`, RFC 6570 level 1): a
/// variable matches one or more characters up to the next literal part of the template, never
/// a `/`. Two variables must be separated by a literal.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceTemplate {
    /// The RFC 6570 URI template.
    pub uri_template: String,
    /// The template's name.
    pub name: String,
    /// What the template's resources are.
    pub description: Option<String>,
    /// The MIME type of its resources.
    pub mime_type: Option<String>,
    /// Reads a URI the template matches; `None` lists the template without making it readable.
    pub reader: Option<TemplateReader>,
}

impl ResourceTemplate {
    /// A template without a reader (listed, not readable).
    pub fn new(uri_template: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            uri_template: uri_template.into(),
            name: name.into(),
            description: None,
            mime_type: None,
            reader: None,
        }
    }

    /// Sets the description.
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }

    /// Sets the MIME type.
    pub fn mime_type(mut self, mime_type: impl Into<String>) -> Self {
        self.mime_type = Some(mime_type.into());
        self
    }

    /// Makes the template readable: `f` gets each matching URI with its variables.
    pub fn reader<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(ResourceRequest) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<ResourceContents>, ToolError>> + Send + 'static,
    {
        self.reader = Some(TemplateReader(Arc::new(move |request| {
            Box::pin(f(request))
        })));
        self
    }

    /// The `ResourceTemplate` object of `resources/templates/list`.
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

/// One part of a parsed URI template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    Variable(String),
}

/// A URI template reduced to literals and simple variables, for matching URIs against it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct UriPattern {
    parts: Vec<Part>,
}

impl UriPattern {
    fn parse(template: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut rest = template;
        while !rest.is_empty() {
            match rest.find('{') {
                Some(0) => {
                    let end = rest
                        .find('}')
                        .ok_or_else(|| "an expression is not closed with `}`".to_owned())?;
                    let name = &rest[1..end];
                    let simple = !name.is_empty()
                        && name
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.');
                    if !simple {
                        return Err(format!(
                            "`{{{name}}}` is not a simple variable (only `{{name}}` expressions can be read)"
                        ));
                    }
                    if matches!(parts.last(), Some(Part::Variable(_))) {
                        return Err("two variables must be separated by a literal".to_owned());
                    }
                    if parts.iter().any(|p| *p == Part::Variable(name.to_owned())) {
                        return Err(format!("the variable `{name}` appears twice"));
                    }
                    parts.push(Part::Variable(name.to_owned()));
                    rest = &rest[end + 1..];
                }
                found => {
                    let end = found.unwrap_or(rest.len());
                    if rest[..end].contains('}') {
                        return Err("a `}` has no matching `{`".to_owned());
                    }
                    parts.push(Part::Literal(rest[..end].to_owned()));
                    rest = &rest[end..];
                }
            }
        }
        Ok(Self { parts })
    }

    /// The variables of `uri` if it matches, percent-decoded.
    fn matches(&self, uri: &str) -> Option<BTreeMap<String, String>> {
        let mut variables = BTreeMap::new();
        let mut rest = uri;
        for (i, part) in self.parts.iter().enumerate() {
            match part {
                Part::Literal(l) => rest = rest.strip_prefix(l.as_str())?,
                Part::Variable(name) => {
                    // The value runs up to the next literal (variables are never adjacent),
                    // or to the end; it never spans a `/`.
                    let end = match self.parts.get(i + 1) {
                        Some(Part::Literal(next)) => rest.find(next.as_str())?,
                        _ => rest.len(),
                    };
                    let raw = &rest[..end];
                    if raw.is_empty() || raw.contains('/') {
                        return None;
                    }
                    variables.insert(name.clone(), percent_decode(raw)?);
                    rest = &rest[end..];
                }
            }
        }
        rest.is_empty().then_some(variables)
    }
}

/// Decodes `%XX` escapes; `None` for a malformed escape (a `%` not followed by two hex
/// digits) or bytes that are not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    // `percent_decode_str` leaves a malformed escape as it is: refuse it first.
    let bytes = s.as_bytes();
    let well_formed = bytes.iter().enumerate().all(|(i, &b)| {
        b != b'%'
            || bytes
                .get(i + 1..i + 3)
                .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
    });
    if !well_formed {
        return None;
    }
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(std::borrow::Cow::into_owned)
}

/// What a completion is for: a prompt's argument or a resource template's variable.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum CompletionRef {
    /// `ref/prompt` with the prompt's name.
    Prompt(String),
    /// `ref/resource` with the template's `uriTemplate`.
    ResourceTemplate(String),
}

/// One `completion/complete` request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompletionRequest {
    /// The prompt or template whose argument is completed.
    pub reference: CompletionRef,
    /// The argument (or template variable) being completed.
    pub argument: String,
    /// What the user typed so far.
    pub value: String,
    /// Arguments already resolved (`context.arguments`).
    pub context: BTreeMap<String, String>,
    /// Who asks.
    pub owner: Owner,
}

/// Completion values for one argument. At most [`Completion::MAX_VALUES`] are sent; beyond
/// that the runtime truncates and sets `hasMore`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Completion {
    /// The values, best first.
    pub values: Vec<String>,
    /// How many values exist in all, if known.
    pub total: Option<u64>,
    /// Whether there are more values than sent.
    pub has_more: bool,
}

impl Completion {
    /// The most values one result carries (MCP).
    pub const MAX_VALUES: usize = 100;

    /// The candidates that start with `prefix` (in the given order), with `total` and
    /// `hasMore` set.
    pub fn matching<I, S>(candidates: I, prefix: &str) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let values: Vec<String> = candidates
            .into_iter()
            .map(Into::into)
            .filter(|c| c.starts_with(prefix))
            .collect();
        let total = values.len();
        Self {
            total: Some(total as u64),
            has_more: false,
            values,
        }
        .capped()
    }

    /// Truncated to [`Completion::MAX_VALUES`], with `hasMore` when values were dropped.
    pub(crate) fn capped(mut self) -> Self {
        if self.values.len() > Self::MAX_VALUES {
            self.values.truncate(Self::MAX_VALUES);
            self.has_more = true;
        }
        self
    }

    /// The `completion` object of a `CompleteResult`.
    pub fn to_json(&self) -> Value {
        let mut c = Map::new();
        c.insert("values".into(), json!(self.values));
        if let Some(t) = self.total {
            c.insert("total".into(), json!(t));
        }
        c.insert("hasMore".into(), json!(self.has_more));
        Value::Object(c)
    }
}

/// The boxed future a completer returns.
pub type CompletionFuture = BoxFuture<'static, Result<Completion, ToolError>>;

/// Completes the arguments of one prompt or template; see [`completer_fn`].
pub type Completer = Arc<dyn Fn(CompletionRequest) -> CompletionFuture + Send + Sync>;

/// Builds a [`Completer`] from an async closure.
pub fn completer_fn<F, Fut>(f: F) -> Completer
where
    F: Fn(CompletionRequest) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Completion, ToolError>> + Send + 'static,
{
    Arc::new(move |request| Box::pin(f(request)))
}

/// Why a catalog entry cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CatalogError {
    /// A resource template with a reader uses a URI-template form the runtime cannot match
    /// request URIs against (a template without a reader is only listed and never parsed).
    #[error("resource template `{template}` cannot be read: {detail}")]
    Template {
        /// The template as registered.
        template: String,
        /// Where and why it does not parse.
        detail: String,
    },
    /// A completer names a prompt or resource template that was not registered.
    #[error("a completer is registered for {0:?}, which is not a registered prompt or template")]
    UnknownCompletionRef(CompletionRef),
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

/// Prompts, resources, resource templates and completers of one runtime.
#[derive(Default)]
pub(crate) struct Catalog {
    prompts: BTreeMap<String, Arc<dyn Prompt>>,
    resources: BTreeMap<String, Resource>,
    templates: Vec<(ResourceTemplate, Option<UriPattern>)>,
    completers: BTreeMap<CompletionRef, Completer>,
}

impl Catalog {
    pub fn add_prompt(&mut self, prompt: Arc<dyn Prompt>) {
        self.prompts
            .insert(prompt.descriptor().name.clone(), prompt);
    }

    pub fn add_resource(&mut self, resource: Resource) {
        self.resources.insert(resource.uri.clone(), resource);
    }

    /// Adds a template. One with a reader must have a template this runtime can match (see
    /// [`ResourceTemplate`]).
    pub fn add_template(&mut self, template: ResourceTemplate) -> Result<(), CatalogError> {
        let pattern = match &template.reader {
            Some(_) => Some(UriPattern::parse(&template.uri_template).map_err(|detail| {
                CatalogError::Template {
                    template: template.uri_template.clone(),
                    detail,
                }
            })?),
            None => None,
        };
        self.templates.push((template, pattern));
        Ok(())
    }

    /// Adds the completer of a prompt's arguments or a template's variables (the prompt or
    /// template must be registered by the time the runtime starts; see [`Catalog::check`]).
    pub fn add_completer(&mut self, reference: CompletionRef, completer: Completer) {
        self.completers.insert(reference, completer);
    }

    /// Checks that every completer refers to a registered prompt or template.
    pub fn check(&self) -> Result<(), CatalogError> {
        for reference in self.completers.keys() {
            let known = match reference {
                CompletionRef::Prompt(name) => self.prompts.contains_key(name),
                CompletionRef::ResourceTemplate(t) => self.template(t).is_some(),
            };
            if !known {
                return Err(CatalogError::UnknownCompletionRef(reference.clone()));
            }
        }
        Ok(())
    }

    pub fn has_prompts(&self) -> bool {
        !self.prompts.is_empty()
    }

    pub fn has_resources(&self) -> bool {
        !self.resources.is_empty() || !self.templates.is_empty()
    }

    pub fn has_completions(&self) -> bool {
        !self.completers.is_empty()
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
        self.templates.iter().map(|(t, _)| t.to_json()).collect()
    }

    /// The template registered under `uri_template`.
    pub fn template(&self, uri_template: &str) -> Option<&ResourceTemplate> {
        self.templates
            .iter()
            .map(|(t, _)| t)
            .find(|t| t.uri_template == uri_template)
    }

    /// The first readable template (in registration order) that matches `uri`, with the
    /// request for its reader.
    pub fn match_template(
        &self,
        uri: &str,
        owner: &Owner,
    ) -> Option<(&TemplateReader, ResourceRequest)> {
        self.templates.iter().find_map(|(t, pattern)| {
            let reader = t.reader.as_ref()?;
            let variables = pattern.as_ref()?.matches(uri)?;
            Some((
                reader,
                ResourceRequest {
                    uri: uri.to_owned(),
                    variables,
                    owner: owner.clone(),
                },
            ))
        })
    }

    /// Reads a URI through a template's reader.
    pub(crate) fn read_template(
        reader: &TemplateReader,
        request: ResourceRequest,
    ) -> ResourceFuture {
        (reader.0)(request)
    }

    pub fn completer(&self, reference: &CompletionRef) -> Option<&Completer> {
        self.completers.get(reference)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn templates_match_simple_variables() {
        let p = UriPattern::parse("test://template/{id}/data").unwrap();
        assert_eq!(
            p.matches("test://template/123/data"),
            Some(vars(&[("id", "123")]))
        );
        assert_eq!(
            p.matches("test://template/a%20b/data"),
            Some(vars(&[("id", "a b")]))
        );
        assert_eq!(p.matches("test://template//data"), None);
        assert_eq!(p.matches("test://template/1/2/data"), None);
        assert_eq!(p.matches("test://template/1/data/more"), None);
        assert_eq!(p.matches("test://template/%zz/data"), None);
        assert_eq!(p.matches("other://template/1/data"), None);
        let p = UriPattern::parse("db://{table}.{row}").unwrap();
        assert_eq!(
            p.matches("db://users.42"),
            Some(vars(&[("table", "users"), ("row", "42")]))
        );
        let p = UriPattern::parse("file://{name}").unwrap();
        assert_eq!(p.matches("file://notes"), Some(vars(&[("name", "notes")])));
        assert_eq!(p.matches("file://"), None);
    }

    #[test]
    fn unreadable_templates_are_refused() {
        for bad in [
            "x://{+path}",
            "x://{a}{b}",
            "x://{a",
            "x://a}",
            "x://{}",
            "x://{a}/{a}",
            "x://{?q}",
        ] {
            assert!(UriPattern::parse(bad).is_err(), "{bad}");
        }
        let mut catalog = Catalog::default();
        let t = ResourceTemplate::new("x://{+path}", "p").reader(|_| async { Ok(Vec::new()) });
        assert!(matches!(
            catalog.add_template(t),
            Err(CatalogError::Template { .. })
        ));
        // Without a reader it is only listed, whatever its syntax.
        assert!(
            catalog
                .add_template(ResourceTemplate::new("x://{+path}", "p"))
                .is_ok()
        );
        assert!(
            catalog
                .match_template("x://a", &Owner::anonymous())
                .is_none()
        );
    }

    #[test]
    fn completions_are_capped() {
        let c = Completion::matching((0..250).map(|i| format!("v{i}")), "v1");
        // v1, v10..v19, v100..v199
        assert_eq!(c.total, Some(111));
        assert_eq!(c.values.len(), Completion::MAX_VALUES);
        assert!(c.has_more);
        let c = Completion::matching(["paris", "park", "london"], "par");
        assert_eq!(c.values, ["paris", "park"]);
        assert!(!c.has_more);
        assert_eq!(
            c.to_json(),
            json!({ "values": ["paris", "park"], "total": 2, "hasMore": false })
        );
    }

    #[test]
    fn completers_need_their_prompt_or_template() {
        let mut catalog = Catalog::default();
        catalog.add_completer(
            CompletionRef::Prompt("p".into()),
            completer_fn(|_| async { Ok(Completion::default()) }),
        );
        assert!(catalog.check().is_err());
        catalog.add_prompt(prompt_fn(PromptDescriptor::new("p", "d"), |_, _| async {
            Ok(GetPromptResult::user_text("x"))
        }));
        assert!(catalog.check().is_ok());
    }
}
