//! Versioned requests between nodes: a `tasks/update` or `tasks/cancel` one replica records in
//! the shared store for the node that runs the task (`mcp_commands` on PostgreSQL), and that
//! node's answer.
//!
//! These bytes cross processes that may run different builds (a rolling upgrade), so they are
//! a format of their own, fixed per version, like the snapshots in the module above:
//!
//! - **Version 1** (the first shipped; no version field): JSON. A command is
//!   `{"update": {KEY: VALUE, …}}` (the `inputResponses` of a `tasks/update`) or
//!   `{"cancel": true}`; an answer is `{"ok": true}` or
//!   `{"error": {"code": N, "message": "…", "data": …}}` (`data` may be `null`).
//! - A later version writes `"v": N` (N ≥ 2) in the object and only keys of its own:
//!   readers of version 1 (which ignore unknown keys) then find neither `update` nor
//!   `cancel` and answer that the request does not decode, instead of misreading it. A reader
//!   refuses a version it does not know ([`CommandError::UnknownVersion`]).
//!
//! The golden files in `crates/mcp-tasks/tests/data/commands/` hold the bytes of each version; they are never
//! regenerated, and the tests prove that they still decode (and that [`encode_command`] and
//! [`encode_answer`] write exactly version 1's).

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::wire::error::{RpcError, code};

/// The format version [`encode_command`] and [`encode_answer`] write.
pub const COMMAND_VERSION: u32 = 1;

/// Why a request or an answer recorded by another node could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CommandError {
    /// Not a well-formed request or answer of any version.
    #[error("a message between nodes does not decode: {0}")]
    Decode(String),
    /// Written by a newer build, in a version this one does not know.
    #[error(
        "a message between nodes has format version {0}, newer than this build understands (it reads versions up to {COMMAND_VERSION})"
    )]
    UnknownVersion(u64),
}

/// A client's request to a live task, recorded for the node that runs it.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeCommand {
    /// `tasks/update`: input responses by key.
    Update(BTreeMap<String, Value>),
    /// `tasks/cancel`.
    Cancel,
}

/// The bytes of `command` in the current version.
pub fn encode_command(command: &NodeCommand) -> Vec<u8> {
    let value = match command {
        NodeCommand::Update(responses) => json!({ "update": responses }),
        NodeCommand::Cancel => json!({ "cancel": true }),
    };
    // A map of strings to JSON values always serialises.
    serde_json::to_vec(&value).unwrap_or_default()
}

/// Reads a command of any known version.
pub fn decode_command(bytes: &[u8]) -> Result<NodeCommand, CommandError> {
    let object = object_of(bytes, "request")?;
    if let Some(update) = object.get("update") {
        let responses: BTreeMap<String, Value> =
            serde_json::from_value(update.clone()).map_err(|e| {
                CommandError::Decode(format!("`update` is not a map of responses: {e}"))
            })?;
        return Ok(NodeCommand::Update(responses));
    }
    if object.get("cancel") == Some(&Value::Bool(true)) {
        return Ok(NodeCommand::Cancel);
    }
    Err(CommandError::Decode(
        "the request is neither an update nor a cancellation".to_owned(),
    ))
}

/// The bytes of a node's answer to a recorded command, in the current version.
pub fn encode_answer(answer: &Result<(), RpcError>) -> Vec<u8> {
    let value = match answer {
        Ok(()) => json!({ "ok": true }),
        Err(e) => json!({ "error": { "code": e.code, "message": e.message, "data": e.data } }),
    };
    serde_json::to_vec(&value).unwrap_or_default()
}

/// Reads an answer of any known version. An error answer missing its code or message reads
/// as an internal error with a message saying so.
pub fn decode_answer(bytes: &[u8]) -> Result<Result<(), RpcError>, CommandError> {
    let object = object_of(bytes, "answer")?;
    match object.get("error") {
        Some(e) => {
            let mut error = RpcError::new(
                e["code"].as_i64().unwrap_or(code::INTERNAL_ERROR),
                e["message"]
                    .as_str()
                    .unwrap_or("the task's node refused the request"),
            );
            error.data = e.get("data").filter(|d| !d.is_null()).cloned();
            Ok(Err(error))
        }
        None if object.get("ok") == Some(&Value::Bool(true)) => Ok(Ok(())),
        None => Err(CommandError::Decode(
            "the answer is neither ok nor an error".to_owned(),
        )),
    }
}

/// The JSON object of a command or answer, after checking its version.
fn object_of(bytes: &[u8], what: &str) -> Result<Map<String, Value>, CommandError> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| CommandError::Decode(format!("the {what} is not JSON: {e}")))?;
    let Value::Object(object) = value else {
        return Err(CommandError::Decode(format!(
            "the {what} is not a JSON object"
        )));
    };
    match object.get("v") {
        None => Ok(object),
        Some(v) => match v.as_u64() {
            Some(1) => Ok(object),
            Some(n) => Err(CommandError::UnknownVersion(n)),
            None => Err(CommandError::Decode(format!(
                "the {what}'s version is not a number: {v}"
            ))),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn golden(name: &str) -> Vec<u8> {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/commands")
            .join(name);
        std::fs::read(&path)
            .unwrap_or_else(|e| panic!("cannot read golden file {}: {e}", path.display()))
    }

    fn update() -> NodeCommand {
        NodeCommand::Update(BTreeMap::from([
            (
                "k0".to_owned(),
                json!({ "action": "accept", "content": { "name": "Ada", "count": 3 } }),
            ),
            ("k1".to_owned(), json!({ "action": "decline" })),
        ]))
    }

    fn error(code: i64, message: &str, data: Option<Value>) -> Result<(), RpcError> {
        let mut e = RpcError::new(code, message);
        e.data = data;
        Err(e)
    }

    fn answers() -> Vec<(&'static str, Result<(), RpcError>)> {
        vec![
            ("v1_answer_ok.json", Ok(())),
            (
                "v1_answer_error.json",
                error(
                    -32602,
                    "Invalid params: inputResponses names k9, which the task did not ask for",
                    None,
                ),
            ),
            (
                "v1_answer_error_data.json",
                error(
                    -32010,
                    "quota exceeded: tasks per principal",
                    Some(json!({ "limit": "max-tasks-per-principal" })),
                ),
            ),
        ]
    }

    /// The version 1 goldens (frozen) still decode to what they meant.
    #[test]
    fn version_1_goldens_decode() {
        assert_eq!(decode_command(&golden("v1_update.json")), Ok(update()));
        assert_eq!(
            decode_command(&golden("v1_cancel.json")),
            Ok(NodeCommand::Cancel)
        );
        for (name, answer) in answers() {
            assert_eq!(decode_answer(&golden(name)), Ok(answer), "{name}");
        }
    }

    /// Version 1 is the current version: the encoders write exactly its bytes, so replicas of
    /// the builds before this one read what this one records, and the other way round.
    #[test]
    fn the_current_version_writes_the_version_1_bytes() {
        assert_eq!(COMMAND_VERSION, 1);
        assert_eq!(encode_command(&update()), golden("v1_update.json"));
        assert_eq!(
            encode_command(&NodeCommand::Cancel),
            golden("v1_cancel.json")
        );
        for (name, answer) in answers() {
            assert_eq!(encode_answer(&answer), golden(name), "{name}");
        }
    }

    #[test]
    fn a_newer_version_is_refused_not_misread() {
        let newer = br#"{"v":2,"update":{"k0":1}}"#;
        assert_eq!(decode_command(newer), Err(CommandError::UnknownVersion(2)));
        assert_eq!(
            decode_answer(br#"{"v":7,"ok":true}"#),
            Err(CommandError::UnknownVersion(7))
        );
        let message = CommandError::UnknownVersion(2).to_string();
        assert!(
            message.contains("version 2") && message.contains("up to 1"),
            "{message}"
        );
        // An explicit version 1 reads as version 1.
        assert_eq!(
            decode_command(br#"{"v":1,"cancel":true}"#),
            Ok(NodeCommand::Cancel)
        );
    }

    #[test]
    fn malformed_bytes_are_errors() {
        for bad in [
            &b""[..],
            b"not json",
            b"[1,2]",
            b"{}",
            br#"{"cancel":false}"#,
            br#"{"update":[1]}"#,
            br#"{"v":"one","cancel":true}"#,
        ] {
            assert!(
                matches!(decode_command(bad), Err(CommandError::Decode(_))),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        for bad in [&b""[..], b"{}", br#"{"ok":false}"#, b"null"] {
            assert!(
                matches!(decode_answer(bad), Err(CommandError::Decode(_))),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        // An error answer missing its parts still reads as an error.
        let partial = decode_answer(br#"{"error":{}}"#).unwrap().unwrap_err();
        assert_eq!(partial.code, code::INTERNAL_ERROR);
    }

    proptest! {
        /// Decoding never panics on any input.
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode_command(&bytes);
            let _ = decode_answer(&bytes);
        }

        /// Every update round-trips.
        #[test]
        fn updates_round_trip(
            responses in proptest::collection::btree_map("[a-z0-9_]{1,8}", any::<i64>(), 0..6)
        ) {
            let command = NodeCommand::Update(
                responses.into_iter().map(|(k, v)| (k, json!({ "action": "accept", "content": { "n": v } }))).collect(),
            );
            prop_assert_eq!(decode_command(&encode_command(&command)), Ok(command));
        }
    }
}
