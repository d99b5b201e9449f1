//! Authentication: who sends an HTTP request, as an [`Identity`] (the [`Owner`] every task is
//! bound to, plus the token's scopes).
//!
//! The HTTP transport asks an [`Authenticator`] about every request before it reads the body.
//! Two verifiers are built in and can be combined ([`Chain`]):
//!
//! - [`StaticTokens`]: a TOML file of bearer-token hashes, each mapped to a tenant and a
//!   principal, reloadable at run time;
//! - `JwtVerifier` (feature `jwt`): an OAuth 2.1 resource server that verifies JWT access tokens against
//!   an issuer's JWKS (RFC 7519, RFC 7517), with the audience bound to this server's
//!   canonical URI (RFC 8707).
//!
//! An embedder brings its own by implementing [`Authenticator`] or with [`from_fn`].
//! Refusals carry what the transport needs for a correct `401`/`403` with
//! `WWW-Authenticate` (RFC 6750 §3); [`ProtectedResource`] is the RFC 9728 metadata document
//! the challenge points at. Tokens are never logged, stored or handed to tools: only the
//! resulting [`Owner`] travels on.

#[cfg(feature = "jwt")]
mod jwt;
mod throttle;
mod tokens;

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;

use axum::http::HeaderMap;
use axum::http::request::Parts;
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};

/// A JWT signature algorithm (`RS256`, `ES256`, `EdDSA`, ...; parses from its name).
#[cfg(feature = "jwt")]
pub use jsonwebtoken::Algorithm as JwtAlgorithm;
#[cfg(feature = "jwt")]
pub use jwt::{JwksSource, JwtConfig, JwtSetupError, JwtVerifier};
pub use throttle::{FailureThrottle, claimed_principal};
pub use tokens::{StaticTokens, TokenFileError};

use crate::task::Owner;

/// An authenticated caller: the owner its tasks belong to and the scopes its credential
/// grants.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Identity {
    /// Who the caller is.
    pub owner: Owner,
    /// The scopes the credential grants.
    pub scopes: BTreeSet<String>,
}

impl Identity {
    /// An identity without scopes.
    pub fn new(owner: Owner) -> Self {
        Self {
            owner,
            scopes: BTreeSet::new(),
        }
    }

    /// Adds scopes.
    pub fn with_scopes(mut self, scopes: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.scopes.extend(scopes.into_iter().map(Into::into));
        self
    }

    /// Whether this caller may only read ([`READ_ONLY_SCOPE`]), on a server that requires
    /// `required` scopes for full access.
    pub fn is_read_only(&self, required: &[String]) -> bool {
        self.scopes.contains(READ_ONLY_SCOPE)
            && (required.is_empty() || required.iter().any(|s| !self.scopes.contains(s)))
    }
}

/// What an authenticated credential may do on a server that requires `required` scopes: the
/// one scope policy of the MCP endpoint and the console.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Access {
    /// Read and change its tasks.
    Full,
    /// Read only ([`READ_ONLY_SCOPE`]): never creates, answers or cancels anything.
    ReadOnly,
}

impl Identity {
    /// What this credential may do on a server that requires `required` scopes, or the
    /// `insufficient_scope` refusal: a credential lacking a required scope is refused unless it
    /// carries [`READ_ONLY_SCOPE`] (then it may read); one carrying [`READ_ONLY_SCOPE`] is
    /// read-only unless it also carries every required scope (see [`Identity::is_read_only`]).
    pub fn access(&self, required: &[String]) -> Result<Access, AuthError> {
        if self.is_read_only(required) {
            return Ok(Access::ReadOnly);
        }
        let missing: Vec<String> = required
            .iter()
            .filter(|s| !self.scopes.contains(*s))
            .cloned()
            .collect();
        if missing.is_empty() {
            Ok(Access::Full)
        } else {
            Err(AuthError::InsufficientScope(missing))
        }
    }
}

/// Whether the JSON-RPC message `message` changes something (a [`WRITE_METHODS`] call, or a
/// response to one of the server's requests, which answers a task's input request).
pub(crate) fn is_write(message: &Value) -> bool {
    match message.get("method") {
        Some(method) => method.as_str().is_some_and(|m| WRITE_METHODS.contains(&m)),
        None => message.get("result").is_some() || message.get("error").is_some(),
    }
}

/// The read-only scope. A credential that carries it may read tasks and follow them
/// (`tasks/get`, `subscriptions/listen`, listings, `server/discover`, legacy `tasks/get`,
/// `tasks/result` and `tasks/list`, ...) but not change anything: `tools/call`,
/// `tasks/update`, `tasks/cancel`, `notifications/cancelled` and a legacy client's answers to
/// the server's input requests are `403` with `error="insufficient_scope"`. It is read-only
/// unless the server requires scopes ([`ProtectedResource::scopes`]) and it carries all of
/// them too; with required scopes, a credential that lacks one of them but carries
/// `tasks:read` is admitted read-only instead of refused.
pub const READ_ONLY_SCOPE: &str = "tasks:read";

/// Methods a read-only credential may not call (they create, answer or cancel work).
pub(crate) const WRITE_METHODS: &[&str] = &[
    "tools/call",
    "tasks/update",
    "tasks/cancel",
    "notifications/cancelled",
];

/// Why a request is not authenticated or not authorized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// No credential at all: `401` with a bare `Bearer` challenge (RFC 6750 §3.1 says no
    /// error code then).
    #[error("the request carries no bearer token")]
    Missing,
    /// A credential that is malformed, unknown, expired, for another audience or issuer, or
    /// badly signed: `401` with `error="invalid_token"`. The detail goes to the client and
    /// the log, never the token itself.
    #[error("the bearer token is not valid: {0}")]
    InvalidToken(String),
    /// A valid credential without a scope this server requires: `403` with
    /// `error="insufficient_scope"`.
    #[error("the bearer token lacks the required scope `{}`", .0.join(" "))]
    InsufficientScope(Vec<String>),
    /// The credential could not be checked right now (the JWKS is unreachable): `503`.
    #[error("the credential cannot be verified right now: {0}")]
    Unavailable(String),
}

/// Decides who sends a request. Runs before the body is read, on the request's head.
pub trait Authenticator: Send + Sync + 'static {
    /// The caller's identity, or why there is none.
    fn authenticate<'a>(&'a self, request: &'a Parts)
    -> BoxFuture<'a, Result<Identity, AuthError>>;

    /// The issuers a client may get tokens from (RFC 9728 `authorization_servers`).
    fn authorization_servers(&self) -> Vec<String> {
        Vec::new()
    }

    /// Whether callers must present a credential (everything but [`Anonymous`]).
    fn requires_credentials(&self) -> bool {
        true
    }
}

/// Every caller is [`Owner::anonymous`]: for a server only its own user can reach (stdio, a
/// loopback port on a single-user host).
#[derive(Debug, Clone, Copy, Default)]
pub struct Anonymous;

impl Authenticator for Anonymous {
    fn authenticate<'a>(&'a self, _: &'a Parts) -> BoxFuture<'a, Result<Identity, AuthError>> {
        futures::future::ready(Ok(Identity::new(Owner::anonymous()))).boxed()
    }

    fn requires_credentials(&self) -> bool {
        false
    }
}

/// An authenticator from a closure over the request head, for an embedder's own scheme
/// (a session cookie, an mTLS identity set by a proxy, ...).
pub fn from_fn<F, Fut>(f: F) -> Arc<dyn Authenticator>
where
    F: Fn(&Parts) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Identity, AuthError>> + Send + 'static,
{
    struct FnAuth<F>(F);
    impl<F, Fut> Authenticator for FnAuth<F>
    where
        F: Fn(&Parts) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Identity, AuthError>> + Send + 'static,
    {
        fn authenticate<'a>(
            &'a self,
            request: &'a Parts,
        ) -> BoxFuture<'a, Result<Identity, AuthError>> {
            (self.0)(request).boxed()
        }
    }
    Arc::new(FnAuth(f))
}

/// Several verifiers tried in order: the first that recognises the token decides. A token
/// that one verifier calls invalid is offered to the next; when all refuse, the last refusal
/// is the answer.
pub struct Chain(Vec<Arc<dyn Authenticator>>);

impl Chain {
    /// Tries each authenticator in order.
    pub fn new(verifiers: Vec<Arc<dyn Authenticator>>) -> Self {
        Self(verifiers)
    }
}

impl Authenticator for Chain {
    fn authenticate<'a>(
        &'a self,
        request: &'a Parts,
    ) -> BoxFuture<'a, Result<Identity, AuthError>> {
        async move {
            let mut last = AuthError::Missing;
            for verifier in &self.0 {
                match verifier.authenticate(request).await {
                    Ok(identity) => return Ok(identity),
                    Err(e @ AuthError::InvalidToken(_)) => last = e,
                    Err(AuthError::Missing) => {}
                    Err(e) => return Err(e),
                }
            }
            Err(last)
        }
        .boxed()
    }

    fn authorization_servers(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for v in &self.0 {
            for s in v.authorization_servers() {
                if !out.contains(&s) {
                    out.push(s);
                }
            }
        }
        out
    }

    fn requires_credentials(&self) -> bool {
        self.0.iter().any(|v| v.requires_credentials())
    }
}

/// The bearer token of a request (RFC 6750 §2.1): `Authorization: Bearer <token>`, the scheme
/// compared case-insensitively. `Ok(None)` when there is no `Authorization` header; another
/// scheme, several headers or an empty token are invalid.
pub fn bearer_token(headers: &HeaderMap) -> Result<Option<&str>, AuthError> {
    let mut values = headers.get_all(axum::http::header::AUTHORIZATION).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(AuthError::InvalidToken(
            "the Authorization header appears more than once".into(),
        ));
    }
    let value = value
        .to_str()
        .map_err(|_| AuthError::InvalidToken("the Authorization header is not ASCII".into()))?;
    let (scheme, token) = value.trim().split_once(' ').unwrap_or((value.trim(), ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(AuthError::InvalidToken(
            "the Authorization scheme must be Bearer".into(),
        ));
    }
    let token = token.trim();
    if token.is_empty() {
        return Err(AuthError::InvalidToken("the bearer token is empty".into()));
    }
    Ok(Some(token))
}

/// Checks a tenant or principal name: non-empty, at most 256 bytes, no control characters
/// (so that it can be logged and compared unambiguously).
pub(crate) fn check_name(what: &str, value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err(format!("the {what} is empty"));
    }
    if value.len() > 256 {
        return Err(format!("the {what} is longer than 256 bytes"));
    }
    if value.chars().any(char::is_control) {
        return Err(format!("the {what} contains a control character"));
    }
    Ok(())
}

/// Checks a tenant and principal pair as [`StaticTokens`] and `JwtVerifier` (feature `jwt`) do.
pub fn check_owner(tenant: &str, principal: &str) -> Result<(), String> {
    check_name("tenant", tenant)?;
    check_name("principal", principal)
}

/// The RFC 9728 protected-resource metadata of this server, and what its challenges say.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProtectedResource {
    /// The canonical URI of the MCP endpoint (`https://mcp.example.com/mcp`): the audience
    /// tokens must be issued for (RFC 8707).
    pub resource: String,
    /// Issuers clients may get tokens from.
    pub authorization_servers: Vec<String>,
    /// Scopes a token must all carry (checked on every request) and that the metadata lists.
    pub scopes: Vec<String>,
}

impl ProtectedResource {
    /// The metadata of the protected resource at `resource` (its canonical URL).
    pub fn new(resource: impl Into<String>) -> Self {
        Self {
            resource: resource.into(),
            authorization_servers: Vec::new(),
            scopes: Vec::new(),
        }
    }

    /// Adds an authorization server (its issuer URL).
    pub fn authorization_server(mut self, issuer: impl Into<String>) -> Self {
        self.authorization_servers.push(issuer.into());
        self
    }

    /// Adds a supported scope.
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.scopes.push(scope.into());
        self
    }

    /// The path of the metadata document for this resource (RFC 9728 §3.1: the well-known
    /// prefix inserted before the resource's path).
    pub fn metadata_path(&self) -> String {
        let path = resource_path(&self.resource);
        format!("/.well-known/oauth-protected-resource{path}")
    }

    /// The absolute URL of the metadata document.
    pub fn metadata_url(&self) -> String {
        let (origin, _) = split_origin(&self.resource);
        format!("{origin}{}", self.metadata_path())
    }

    /// The metadata document.
    pub fn document(&self) -> Value {
        let mut doc = json!({
            "resource": self.resource,
            "bearer_methods_supported": ["header"],
        });
        if !self.authorization_servers.is_empty() {
            doc["authorization_servers"] = json!(self.authorization_servers);
        }
        if !self.scopes.is_empty() {
            doc["scopes_supported"] = json!(self.scopes);
        }
        doc
    }

    /// The `WWW-Authenticate` value for a refusal (RFC 6750 §3, RFC 9728 §5.1).
    pub fn challenge(&self, error: &AuthError) -> String {
        let mut out = format!(
            "Bearer resource_metadata=\"{}\"",
            quote(&self.metadata_url())
        );
        let (code, detail) = match error {
            AuthError::Missing | AuthError::Unavailable(_) => (None, None),
            AuthError::InvalidToken(d) => (Some("invalid_token"), Some(d.as_str())),
            AuthError::InsufficientScope(_) => (Some("insufficient_scope"), None),
        };
        if let Some(code) = code {
            out.push_str(&format!(", error=\"{code}\""));
        }
        if let Some(detail) = detail {
            out.push_str(&format!(", error_description=\"{}\"", quote(detail)));
        }
        let scope = match error {
            AuthError::InsufficientScope(needed) => needed.join(" "),
            _ => self.scopes.join(" "),
        };
        if !scope.is_empty() {
            out.push_str(&format!(", scope=\"{}\"", quote(&scope)));
        }
        out
    }

    /// The scopes of `required` that `identity` lacks.
    pub fn missing_scopes(&self, identity: &Identity) -> Vec<String> {
        self.scopes
            .iter()
            .filter(|s| !identity.scopes.contains(*s))
            .cloned()
            .collect()
    }
}

/// A quoted-string body for an auth-param (RFC 9110 §5.6.4): printable ASCII, `"` and `\`
/// escaped; anything else replaced.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out
}

/// `(scheme://authority, /path)` of an absolute URL; the path without a trailing `/`.
fn split_origin(url: &str) -> (&str, &str) {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    match url[after_scheme..].find('/') {
        Some(i) => url.split_at(after_scheme + i),
        None => (url, ""),
    }
}

fn resource_path(url: &str) -> &str {
    let (_, path) = split_origin(url);
    let path = path.split(['?', '#']).next().unwrap_or_default();
    path.strip_suffix('/').unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn bearer_tokens_are_read_strictly() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer_token(&h), Ok(None));
        h.insert("authorization", HeaderValue::from_static("bearer  abc "));
        assert_eq!(bearer_token(&h), Ok(Some("abc")));
        h.insert("authorization", HeaderValue::from_static("Basic abc"));
        assert!(matches!(bearer_token(&h), Err(AuthError::InvalidToken(_))));
        h.insert("authorization", HeaderValue::from_static("Bearer"));
        assert!(matches!(bearer_token(&h), Err(AuthError::InvalidToken(_))));
        h.insert("authorization", HeaderValue::from_static("Bearer a"));
        h.append("authorization", HeaderValue::from_static("Bearer b"));
        assert!(matches!(bearer_token(&h), Err(AuthError::InvalidToken(_))));
    }

    #[test]
    fn metadata_and_challenges() {
        let r = ProtectedResource::new("https://mcp.example.com/mcp")
            .authorization_server("https://idp.example.com")
            .scope("tasks");
        assert_eq!(
            r.metadata_path(),
            "/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(
            r.metadata_url(),
            "https://mcp.example.com/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(
            r.document(),
            json!({
                "resource": "https://mcp.example.com/mcp",
                "authorization_servers": ["https://idp.example.com"],
                "scopes_supported": ["tasks"],
                "bearer_methods_supported": ["header"],
            })
        );
        assert_eq!(
            r.challenge(&AuthError::Missing),
            "Bearer resource_metadata=\"https://mcp.example.com/.well-known/oauth-protected-resource/mcp\", scope=\"tasks\""
        );
        assert_eq!(
            r.challenge(&AuthError::InvalidToken("it \"expired\"".into())),
            "Bearer resource_metadata=\"https://mcp.example.com/.well-known/oauth-protected-resource/mcp\", error=\"invalid_token\", error_description=\"it \\\"expired\\\"\", scope=\"tasks\""
        );
        assert!(
            r.challenge(&AuthError::InsufficientScope(vec!["tasks".into()]))
                .contains("error=\"insufficient_scope\", scope=\"tasks\"")
        );
        let root = ProtectedResource::new("http://127.0.0.1:8080");
        assert_eq!(
            root.metadata_path(),
            "/.well-known/oauth-protected-resource"
        );
    }

    #[test]
    fn read_only_credentials() {
        let owner = Owner::new("t", "p");
        let reader = Identity::new(owner.clone()).with_scopes([READ_ONLY_SCOPE]);
        let full = Identity::new(owner.clone()).with_scopes(["mcp:tasks"]);
        let both = Identity::new(owner.clone()).with_scopes(["mcp:tasks", READ_ONLY_SCOPE]);
        let none = Identity::new(owner);
        assert!(reader.is_read_only(&[]));
        assert!(both.is_read_only(&[]));
        assert!(!full.is_read_only(&[]));
        assert!(!none.is_read_only(&[]));
        let required = ["mcp:tasks".to_owned()];
        assert!(reader.is_read_only(&required));
        assert!(!both.is_read_only(&required));
        assert!(!full.is_read_only(&required));
        assert!(!none.is_read_only(&required));

        for write in [
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call"}),
            json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/update"}),
            json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/cancel"}),
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled"}),
            json!({"jsonrpc": "2.0", "id": 1, "result": {}}),
            json!({"jsonrpc": "2.0", "id": 1, "error": {"code": 1, "message": "no"}}),
        ] {
            assert!(is_write(&write), "{write}");
        }
        for read in [
            json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/get"}),
            json!({"jsonrpc": "2.0", "id": 1, "method": "subscriptions/listen"}),
            json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/result"}),
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize"}),
            json!([1, 2]),
        ] {
            assert!(!is_write(&read), "{read}");
        }
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("tenant", "acme").is_ok());
        assert!(check_name("tenant", "").is_err());
        assert!(check_name("tenant", "a\u{0}b").is_err());
        assert!(check_name("tenant", &"x".repeat(257)).is_err());
    }
}
