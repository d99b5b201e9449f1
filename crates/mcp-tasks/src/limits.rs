//! Per-call size limits of a runtime ([`Limits`], in [`crate::RuntimeConfig::limits`]).
//!
//! Every value a task keeps is rewritten with its record on each transition, so unbounded
//! arguments, answers, results or journals would make each commit (and the memory of a live
//! task) grow without bound. What a client sends over a limit is refused with `-32602` naming
//! the limit, and nothing is stored; what a tool produces over a limit ends its task `failed`
//! with `-32603` naming the limit.

use serde_json::{Map, Value};

use crate::wire::error::RpcError;

/// Size limits per call and per task. `Default` gives the documented defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// Bytes of a `tools/call`'s `arguments` (as JSON text). Default 1 MiB.
    pub max_argument_bytes: usize,
    /// Bytes of one `tasks/update`'s `inputResponses` (as JSON text). Default 1 MiB.
    pub max_input_response_bytes: usize,
    /// Bytes of a task's result: the tool's `CallToolResult` (as JSON text). Default 4 MiB.
    pub max_result_bytes: usize,
    /// Bytes of a task's step journal: every recorded step value (as JSON text) plus the step
    /// names. Default 4 MiB.
    pub max_journal_bytes: usize,
    /// Journaled steps per task. Default 1,000.
    pub max_steps: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_argument_bytes: 1 << 20,
            max_input_response_bytes: 1 << 20,
            max_result_bytes: 4 << 20,
            max_journal_bytes: 4 << 20,
            max_steps: 1_000,
        }
    }
}

/// The length of `value` as compact JSON text, counted without building the text.
pub(crate) fn json_len<T: serde::Serialize + ?Sized>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 = self.0.saturating_add(buf.len());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => usize::MAX,
    }
}

impl Limits {
    /// `-32602` when a `tools/call`'s `arguments` are over [`Limits::max_argument_bytes`].
    pub fn check_arguments(&self, arguments: &Map<String, Value>) -> Result<(), RpcError> {
        let len = json_len(arguments);
        if len > self.max_argument_bytes {
            return Err(RpcError::invalid_params(format!(
                "`arguments` is {len} bytes; the limit is {} (limits.max_argument_bytes)",
                self.max_argument_bytes
            )));
        }
        Ok(())
    }

    /// `-32602` when a `tasks/update`'s `inputResponses` are over
    /// [`Limits::max_input_response_bytes`].
    pub fn check_input_responses(&self, responses: &Map<String, Value>) -> Result<(), RpcError> {
        let len = json_len(responses);
        if len > self.max_input_response_bytes {
            return Err(RpcError::invalid_params(format!(
                "`inputResponses` is {len} bytes; the limit is {} (limits.max_input_response_bytes)",
                self.max_input_response_bytes
            )));
        }
        Ok(())
    }

    /// The error a task ends with when its tool's result is over [`Limits::max_result_bytes`].
    pub fn check_result(&self, result: &Value) -> Result<(), RpcError> {
        let len = json_len(result);
        if len > self.max_result_bytes {
            return Err(RpcError::internal(format!(
                "the tool's result is {len} bytes; the limit is {} (limits.max_result_bytes)",
                self.max_result_bytes
            )));
        }
        Ok(())
    }

    /// The error a step gets when recording `value` under `name` would take `journal` over
    /// [`Limits::max_steps`] or [`Limits::max_journal_bytes`].
    pub fn check_step(
        &self,
        journal: &std::collections::BTreeMap<String, Value>,
        name: &str,
        value: &Value,
    ) -> Result<(), RpcError> {
        if journal.len() >= self.max_steps {
            return Err(RpcError::internal(format!(
                "step `{name}` would be step {} of the task; the limit is {} (limits.max_steps)",
                journal.len() + 1,
                self.max_steps
            )));
        }
        let size = |k: &String, v: &Value| k.len().saturating_add(json_len(v));
        let len = journal
            .iter()
            .map(|(k, v)| size(k, v))
            .fold(size(&name.to_owned(), value), usize::saturating_add);
        if len > self.max_journal_bytes {
            return Err(RpcError::internal(format!(
                "step `{name}` would make the task's journal {len} bytes; the limit is {} (limits.max_journal_bytes)",
                self.max_journal_bytes
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Map, Value, json};

    use super::*;

    #[test]
    fn json_len_is_the_length_of_the_json_text() {
        for v in [
            json!({}),
            json!({ "a": 1 }),
            json!({ "a": [1, 2], "b\"c": { "d": null }, "é": "ü" }),
        ] {
            let map: Map<String, Value> = v.as_object().unwrap().clone();
            assert_eq!(json_len(&map), serde_json::to_vec(&v).unwrap().len(), "{v}");
        }
    }
}
