//! Content blocks (MCP `ContentBlock`) and resource contents, for tool results, prompt
//! messages and `resources/read`.
//!
//! Binary data is given as bytes and sent base64-encoded, as the protocol requires; the
//! builders return the wire JSON, so they fit [`crate::tool::CallToolResult::content`] and
//! [`crate::catalog::PromptMessage`] alike.

use base64::Engine as _;
use serde_json::{Map, Value, json};

/// Base64 (standard alphabet, padded) of `bytes`, the encoding of every binary field of MCP.
pub fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A `text` content block.
pub fn text(text: impl Into<String>) -> Value {
    json!({ "type": "text", "text": text.into() })
}

/// An `image` content block: `data` is the image itself (sent base64-encoded).
pub fn image(data: &[u8], mime_type: impl Into<String>) -> Value {
    json!({ "type": "image", "data": base64(data), "mimeType": mime_type.into() })
}

/// An `audio` content block: `data` is the audio itself (sent base64-encoded).
pub fn audio(data: &[u8], mime_type: impl Into<String>) -> Value {
    json!({ "type": "audio", "data": base64(data), "mimeType": mime_type.into() })
}

/// A `resource_link` content block: a resource the client may read itself.
pub fn resource_link(uri: impl Into<String>, name: impl Into<String>) -> Value {
    json!({ "type": "resource_link", "uri": uri.into(), "name": name.into() })
}

/// A `resource` content block embedding a resource's contents.
pub fn embedded(contents: &ResourceContents) -> Value {
    json!({ "type": "resource", "resource": contents.to_json() })
}

/// The contents of one resource: text or binary, with its URI and MIME type
/// (`TextResourceContents` / `BlobResourceContents`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceContents {
    /// The resource's URI.
    pub uri: String,
    /// Its MIME type.
    pub mime_type: Option<String>,
    /// Its text or bytes.
    pub body: ResourceBody,
}

/// The body of a resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResourceBody {
    /// UTF-8 text, sent as `text`.
    Text(String),
    /// Bytes, sent base64-encoded as `blob`.
    Blob(Vec<u8>),
}

impl ResourceContents {
    /// Text contents.
    pub fn text(
        uri: impl Into<String>,
        mime_type: impl Into<String>,
        text: impl Into<String>,
    ) -> Self {
        Self {
            uri: uri.into(),
            mime_type: Some(mime_type.into()),
            body: ResourceBody::Text(text.into()),
        }
    }

    /// Binary contents.
    pub fn blob(uri: impl Into<String>, mime_type: impl Into<String>, bytes: Vec<u8>) -> Self {
        Self {
            uri: uri.into(),
            mime_type: Some(mime_type.into()),
            body: ResourceBody::Blob(bytes),
        }
    }

    /// The wire object: `uri`, `mimeType` when known, and `text` or `blob`.
    pub fn to_json(&self) -> Value {
        let mut c = Map::new();
        c.insert("uri".into(), json!(self.uri));
        if let Some(m) = &self.mime_type {
            c.insert("mimeType".into(), json!(m));
        }
        match &self.body {
            ResourceBody::Text(t) => c.insert("text".into(), json!(t)),
            ResourceBody::Blob(b) => c.insert("blob".into(), json!(base64(b))),
        };
        Value::Object(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks() {
        assert_eq!(text("hi"), json!({ "type": "text", "text": "hi" }));
        assert_eq!(
            image(b"\x89PNG", "image/png"),
            json!({ "type": "image", "data": "iVBORw==", "mimeType": "image/png" })
        );
        assert_eq!(
            audio(b"RIFF", "audio/wav"),
            json!({ "type": "audio", "data": "UklGRg==", "mimeType": "audio/wav" })
        );
        assert_eq!(
            embedded(&ResourceContents::blob(
                "test://b",
                "application/octet-stream",
                vec![0, 255]
            )),
            json!({ "type": "resource", "resource": {
                "uri": "test://b", "mimeType": "application/octet-stream", "blob": "AP8=" } })
        );
        assert_eq!(
            embedded(&ResourceContents::text("test://t", "text/plain", "x")),
            json!({ "type": "resource", "resource": {
                "uri": "test://t", "mimeType": "text/plain", "text": "x" } })
        );
        assert_eq!(
            resource_link("test://r", "r"),
            json!({ "type": "resource_link", "uri": "test://r", "name": "r" })
        );
    }
}
