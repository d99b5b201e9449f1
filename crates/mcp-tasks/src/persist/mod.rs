//! Versioned postcard snapshots of [`TaskRecord`]s.
//!
//! Every value stored in the `tasks` table is the postcard encoding of an `Envelope`. The
//! persisted types in this module are separate from the domain types in [`crate::task`] and
//! the two are converted explicitly, so the domain may change without breaking stored bytes.
//!
//! # Why a separate, plain persisted type
//!
//! postcard is not self-describing: the bytes carry no field names and no type tags, only
//! values in declaration order. Consequently
//!
//! - `serde_json::Value`, `#[serde(untagged)]` and `#[serde(flatten)]` cannot be decoded
//!   (they need `deserialize_any`), so every JSON payload is stored as its JSON *text* in a
//!   `String` (produced by `serde_json::to_string`, parsed back by `serde_json::from_str`);
//! - adding, removing, reordering or retyping a field of a persisted struct, or reordering
//!   or removing a variant of a persisted enum, silently changes the meaning of old bytes.
//!
//! # The versioning rule
//!
//! The envelope is a serde enum. postcard writes an enum variant's index as a varint before
//! its content, so the first bytes of every snapshot are the variant index, and that index
//! is the format version: variant index `n` holds format version `n + 1` (`V1` is index 0,
//! the single byte `0x00`).
//!
//! - Once a version has shipped, its snapshot type (`SnapshotV1` and every type it uses:
//!   `StatusV1`, `OutcomeV1`, …) is **frozen**. Never edit it.
//! - A new format appends a variant (`V2(SnapshotV2)`) at the end of `Envelope`, with its
//!   own new types, and raises [`CURRENT_VERSION`]. Variants are never removed or reordered.
//! - [`encode`] always writes the current version. [`decode`] reads every version and
//!   converts older ones forward (`V1 → V2 → … → TaskRecord`), filling new fields with
//!   defaults that are correct for records written before the field existed.
//! - Each version keeps golden files in `crates/mcp-tasks/tests/data/snapshots/` (`v1_*.bin`, …) that are
//!   never regenerated; the tests prove that they still decode to the expected records.
//!
//! Versions: 1 (the first shipped format); 2 = version 1 followed by the task's attempt counter
//! (`TaskRecord::attempts`; a version 1 snapshot reads with 0); 3 = version 2 followed by the
//! attempt each journaled step committed in (`TaskRecord::step_attempts`; versions 1 and 2
//! read with none recorded); 4 = version 3 followed by the transition history
//! (`TaskRecord::history`; versions 1 to 3 read with a reconstructed one, see below); 5 =
//! version 4 with the arguments moved to the end: the snapshot's `arguments` field is empty,
//! the envelope ends with the arguments' length, and their JSON text follows the envelope as
//! the record's last bytes (a record cut short is an error, never other arguments). A task's
//! arguments never change, so a store may keep those last bytes apart and write them once
//! ([`encode_parts`] says how many they are; `WriteOp::Put`'s `constant_tail`).
//!
//! # The history of a record written before version 4
//!
//! Versions 1 to 3 kept no history, only the creation time, the current status and message
//! and the time of the last change. A record read from them gets a history *reconstructed*
//! from these alone, which says no more than they do: the creation (`working` at
//! `created_at_ms`), then, unless the record is as it was created (`working` and never
//! updated), one entry for its current status at `last_updated_at_ms` with its current
//! message. The creation's message is known only in a record never updated (it is the
//! current one); otherwise it is `None`. Whatever happened in between (a wait for input, an
//! earlier message) is not known and not made up; the entry for the current status is at the
//! time of the last change, which may be later than the status was taken (a message changed
//! since). Once such a record changes, the history continues from the reconstructed entries.
//!
//! A snapshot with a variant index this build does not know (written by a newer build)
//! decodes to [`PersistError::UnknownVersion`]; it is never misread as an older version.
//! Decoding never panics on any input: malformed bytes, trailing bytes, invalid JSON text
//! and malformed task ids all become a [`PersistError`].

pub mod command;
mod index;

pub use index::{TaskIndexer, listing_of, owner_entry_of, task_indexer};

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::task::{
    MAX_HISTORY, Owner, TaskError, TaskId, TaskOutcome, TaskRecord, TaskStatus, Transition,
};

/// The format version [`encode`] writes (variant index + 1 of the newest `Envelope`
/// variant).
pub const CURRENT_VERSION: u32 = 5;

/// Why a snapshot could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PersistError {
    /// The record could not be turned into bytes.
    #[error("cannot encode task snapshot: {0}")]
    Encode(String),
    /// The bytes are not a well-formed snapshot (empty, truncated, garbage, trailing bytes).
    #[error("cannot decode task snapshot: {0}")]
    Decode(String),
    /// The snapshot was written in a format version this build does not know (a newer one).
    #[error(
        "task snapshot has format version {0}, newer than this build understands (it reads versions up to {CURRENT_VERSION})"
    )]
    UnknownVersion(u32),
    /// The snapshot is well-formed postcard, but one of its fields holds an invalid value.
    #[error("task snapshot field `{field}` is invalid: {detail}")]
    InvalidField { field: &'static str, detail: String },
}

/// The stored form of a snapshot. Append-only: see the module docs.
#[derive(Debug, Serialize, Deserialize)]
enum Envelope {
    /// Format version 1 (variant index 0).
    V1(SnapshotV1),
    /// Format version 2 (variant index 1): version 1 plus the attempt counter.
    V2(SnapshotV2),
    /// Format version 3 (variant index 2): version 2 plus the attempt of every journaled step.
    V3(SnapshotV3),
    /// Format version 4 (variant index 3): version 3 plus the transition history.
    V4(SnapshotV4),
    /// Format version 5 (variant index 4): version 4 with an empty `arguments` field, the
    /// arguments' JSON text following the envelope.
    V5(SnapshotV5),
}

/// Number of variants of `Envelope`; variant index `i < KNOWN_VARIANTS` is known.
const KNOWN_VARIANTS: u32 = 5;
const _: () = assert!(KNOWN_VARIANTS == CURRENT_VERSION);

/// Format version 1 of a task snapshot. **Frozen**: never change this type.
#[derive(Debug, Serialize, Deserialize)]
struct SnapshotV1 {
    id: String,
    owner_tenant: String,
    owner_principal: String,
    tool: String,
    /// JSON text.
    arguments: String,
    /// JSON text.
    client_capabilities: String,
    status: StatusV1,
    status_message: Option<String>,
    created_at_ms: u64,
    last_updated_at_ms: u64,
    ttl_ms: Option<u64>,
    poll_interval_ms: Option<u64>,
    seq: u64,
    /// Key → JSON text, keys strictly ascending.
    pending_inputs: Vec<(String, String)>,
    /// Keys strictly ascending.
    issued_keys: Vec<String>,
    /// Key → JSON text, keys strictly ascending.
    answers: Vec<(String, String)>,
    /// Step name → JSON text, names strictly ascending.
    journal: Vec<(String, String)>,
    outcome: Option<OutcomeV1>,
    cancel_requested: bool,
}

/// Format version 2 of a task snapshot: every field of version 1 (the frozen [`SnapshotV1`],
/// encoded first), then the attempt counter. **Frozen**: never change this type.
#[derive(Debug, Serialize, Deserialize)]
struct SnapshotV2 {
    base: SnapshotV1,
    /// [`TaskRecord::attempts`].
    attempts: u32,
}

/// Format version 3 of a task snapshot: every field of version 2 (the frozen [`SnapshotV2`],
/// encoded first), then the attempt each journaled step committed in. **Frozen**: never change
/// this type.
#[derive(Debug, Serialize, Deserialize)]
struct SnapshotV3 {
    base: SnapshotV2,
    /// Step name → [`TaskRecord::step_attempts`], names strictly ascending, each one a step
    /// of the journal.
    step_attempts: Vec<(String, u32)>,
}

/// Format version 4 of a task snapshot: every field of version 3 (the frozen [`SnapshotV3`],
/// encoded first), then the transition history. **Frozen**: never change this type.
#[derive(Debug, Serialize, Deserialize)]
struct SnapshotV4 {
    base: SnapshotV3,
    /// [`TaskRecord::history`], oldest first: at most [`MAX_HISTORY`] entries, times
    /// non-decreasing.
    history: Vec<TransitionV1>,
}

/// Format version 5 of a task snapshot: version 4 whose `arguments` is the empty string,
/// then the length of the arguments' JSON text, which follows the envelope (the record's last
/// bytes). **Frozen**.
#[derive(Debug, Serialize, Deserialize)]
struct SnapshotV5 {
    base: SnapshotV4,
    arguments_len: u64,
}

/// A status change of [`TaskRecord::history`], first stored in format version 4. **Frozen.**
#[derive(Debug, Serialize, Deserialize)]
struct TransitionV1 {
    at_ms: u64,
    status: StatusV1,
    message: Option<String>,
}

/// Task status, format version 1. **Frozen.**
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
enum StatusV1 {
    Working,
    InputRequired,
    Completed,
    Failed,
    Cancelled,
}

/// Task outcome, format version 1. **Frozen.**
#[derive(Debug, Serialize, Deserialize)]
enum OutcomeV1 {
    /// JSON text of the `CallToolResult`.
    Result(String),
    /// A JSON-RPC error; `data` is JSON text.
    Error {
        code: i64,
        message: String,
        data: Option<String>,
    },
}

/// Encodes `record` as a snapshot of the [current format version](CURRENT_VERSION).
pub fn encode(record: &TaskRecord) -> Result<Vec<u8>, PersistError> {
    encode_parts(record).map(|(bytes, _)| bytes)
}

/// [`encode`], and how many of the bytes' last ones are the task's arguments: they are the
/// same in every snapshot of the task (its arguments never change), so a store may keep them
/// apart and write them once (`WriteOp::Put`'s `constant_tail`).
pub fn encode_parts(record: &TaskRecord) -> Result<(Vec<u8>, usize), PersistError> {
    // Bytes that `decode` would refuse are never written.
    if let Some(step) = record
        .step_attempts
        .keys()
        .find(|step| !record.journal.contains_key(*step))
    {
        return Err(PersistError::Encode(format!(
            "step_attempts names step `{step}`, which is not in the journal"
        )));
    }
    if let Err(problem) = check_history(&record.history) {
        return Err(PersistError::Encode(format!("history: {problem}")));
    }
    let mut base = SnapshotV1::from_record(record)?;
    let arguments = std::mem::take(&mut base.arguments);
    let snapshot = SnapshotV4 {
        base: SnapshotV3 {
            base: SnapshotV2 {
                base,
                attempts: record.attempts,
            },
            step_attempts: record
                .step_attempts
                .iter()
                .map(|(step, attempt)| (step.clone(), *attempt))
                .collect(),
        },
        history: record.history.iter().map(TransitionV1::from).collect(),
    };
    let mut bytes = postcard::to_stdvec(&Envelope::V5(SnapshotV5 {
        base: snapshot,
        arguments_len: arguments.len() as u64,
    }))
    .map_err(|e| PersistError::Encode(e.to_string()))?;
    bytes.extend_from_slice(arguments.as_bytes());
    Ok((bytes, arguments.len()))
}

/// Decodes a snapshot written by [`encode`] of this or any earlier format version.
pub fn decode(bytes: &[u8]) -> Result<TaskRecord, PersistError> {
    snapshot_version(bytes)?;
    let (envelope, rest) = postcard::take_from_bytes::<Envelope>(bytes)
        .map_err(|e| PersistError::Decode(e.to_string()))?;
    // Only version 5 has bytes after the envelope: the arguments.
    if !rest.is_empty() && !matches!(envelope, Envelope::V5(_)) {
        return Err(PersistError::Decode(format!(
            "{} unexpected trailing byte(s) after the snapshot",
            rest.len()
        )));
    }
    let (v3, history) = match envelope {
        // Written before attempts were counted: 0 (the next restart counts as the first).
        Envelope::V1(base) => {
            return Ok(with_reconstructed_history(base.into_record(0)?));
        }
        // Written before step attempts were recorded: none known.
        Envelope::V2(SnapshotV2 { base, attempts }) => {
            return Ok(with_reconstructed_history(base.into_record(attempts)?));
        }
        // Written before the history was kept: reconstructed (see the module docs).
        Envelope::V3(v3) => (v3, None),
        Envelope::V4(SnapshotV4 { base, history }) => (base, Some(history)),
        Envelope::V5(SnapshotV5 {
            base: SnapshotV4 { mut base, history },
            arguments_len,
        }) => {
            let arguments = &mut base.base.base.arguments;
            if !arguments.is_empty() {
                return Err(PersistError::InvalidField {
                    field: "arguments",
                    detail: "a version 5 snapshot keeps its arguments after the envelope, \
                             not in it"
                        .into(),
                });
            }
            if rest.len() as u64 != arguments_len {
                return Err(PersistError::Decode(format!(
                    "the snapshot's arguments (its last bytes) are {} bytes, not {arguments_len}",
                    rest.len()
                )));
            }
            *arguments = std::str::from_utf8(rest)
                .map_err(|_| PersistError::InvalidField {
                    field: "arguments",
                    detail: "not UTF-8 text".into(),
                })?
                .to_owned();
            (base, Some(history))
        }
    };
    let SnapshotV3 {
        base: SnapshotV2 { base, attempts },
        step_attempts,
    } = v3;
    let mut record = base.into_record(attempts)?;
    record.step_attempts = parse_step_attempts(&record.journal, step_attempts)?;
    match history {
        Some(history) => {
            record.history = parse_history(history)?;
            Ok(record)
        }
        None => Ok(with_reconstructed_history(record)),
    }
}

/// A record read from a snapshot older than format version 4, with the history its fields
/// tell (see the module docs): the creation, and the current status unless the record is as
/// it was created. The entry of the current status is never before the creation, even in a
/// record whose `last_updated_at_ms` is.
fn with_reconstructed_history(mut record: TaskRecord) -> TaskRecord {
    let untouched =
        record.status == TaskStatus::Working && record.last_updated_at_ms == record.created_at_ms;
    record.history = if untouched {
        vec![Transition::new(
            record.created_at_ms,
            TaskStatus::Working,
            record.status_message.as_deref(),
        )]
    } else {
        vec![
            Transition::new(record.created_at_ms, TaskStatus::Working, None),
            Transition::new(
                record.last_updated_at_ms.max(record.created_at_ms),
                record.status,
                record.status_message.as_deref(),
            ),
        ]
    };
    record
}

/// The owner of a snapshot, read from its first fields without decoding the rest: every
/// format version begins with the fields of version 1 (`id`, `owner_tenant`,
/// `owner_principal`, …), so the owner is the second and third string after the version tag
/// whatever the version. What a reader checks before it decodes a record it may not serve
/// (another owner's task costs this, not a full decode). Fails like [`decode`] on bytes
/// whose first fields are malformed; says nothing about the rest of the record.
pub fn decode_owner(bytes: &[u8]) -> Result<Owner, PersistError> {
    snapshot_version(bytes)?;
    let bad = |e: postcard::Error| PersistError::Decode(e.to_string());
    let (_, rest) = postcard::take_from_bytes::<u32>(bytes).map_err(bad)?;
    let (_, rest) = postcard::take_from_bytes::<&str>(rest).map_err(bad)?;
    let (tenant, rest) = postcard::take_from_bytes::<&str>(rest).map_err(bad)?;
    let (principal, _) = postcard::take_from_bytes::<&str>(rest).map_err(bad)?;
    Ok(Owner::new(tenant, principal))
}

/// The format version of a snapshot, read from its first bytes without decoding the rest.
/// Fails with [`PersistError::UnknownVersion`] for a version newer than this build knows.
pub fn snapshot_version(bytes: &[u8]) -> Result<u32, PersistError> {
    if bytes.is_empty() {
        return Err(PersistError::Decode("empty input".into()));
    }
    let (index, _) = postcard::take_from_bytes::<u32>(bytes)
        .map_err(|e| PersistError::Decode(format!("bad version tag: {e}")))?;
    let version = index.saturating_add(1);
    if index >= KNOWN_VARIANTS {
        return Err(PersistError::UnknownVersion(version));
    }
    Ok(version)
}

// ---- conversions: domain → V1 ----

impl SnapshotV1 {
    fn from_record(r: &TaskRecord) -> Result<Self, PersistError> {
        Ok(Self {
            id: r.id.as_str().to_owned(),
            owner_tenant: r.owner.tenant.clone(),
            owner_principal: r.owner.principal.clone(),
            tool: r.tool.clone(),
            arguments: json_text(&r.arguments)?,
            client_capabilities: json_text(&r.client_capabilities)?,
            status: StatusV1::from(r.status),
            status_message: r.status_message.clone(),
            created_at_ms: r.created_at_ms,
            last_updated_at_ms: r.last_updated_at_ms,
            ttl_ms: r.ttl_ms,
            poll_interval_ms: r.poll_interval_ms,
            seq: r.seq,
            pending_inputs: json_map_text(&r.pending_inputs)?,
            issued_keys: r.issued_keys.iter().cloned().collect(),
            answers: json_map_text(&r.answers)?,
            journal: json_map_text(&r.journal)?,
            outcome: r
                .outcome
                .as_ref()
                .map(OutcomeV1::from_outcome)
                .transpose()?,
            cancel_requested: r.cancel_requested,
        })
    }

    fn into_record(self, attempts: u32) -> Result<TaskRecord, PersistError> {
        let id = TaskId::parse(&self.id).map_err(|e| PersistError::InvalidField {
            field: "id",
            detail: e.to_string(),
        })?;
        Ok(TaskRecord {
            id,
            owner: Owner {
                tenant: self.owner_tenant,
                principal: self.owner_principal,
            },
            tool: self.tool,
            arguments: parse_json("arguments", &self.arguments)?,
            client_capabilities: Arc::new(parse_json(
                "client_capabilities",
                &self.client_capabilities,
            )?),
            status: self.status.into(),
            status_message: self.status_message,
            created_at_ms: self.created_at_ms,
            last_updated_at_ms: self.last_updated_at_ms,
            ttl_ms: self.ttl_ms,
            poll_interval_ms: self.poll_interval_ms,
            seq: self.seq,
            pending_inputs: parse_json_map("pending_inputs", self.pending_inputs)?,
            issued_keys: parse_key_set("issued_keys", self.issued_keys)?,
            answers: parse_json_map("answers", self.answers)?,
            journal: parse_json_map("journal", self.journal)?,
            step_attempts: BTreeMap::new(),
            outcome: self.outcome.map(OutcomeV1::into_outcome).transpose()?,
            cancel_requested: self.cancel_requested,
            attempts,
            // Filled in by `decode`: stored (version 4) or reconstructed.
            history: Vec::new(),
        })
    }
}

impl From<TaskStatus> for StatusV1 {
    fn from(status: TaskStatus) -> Self {
        match status {
            TaskStatus::Working => Self::Working,
            TaskStatus::InputRequired => Self::InputRequired,
            TaskStatus::Completed => Self::Completed,
            TaskStatus::Failed => Self::Failed,
            TaskStatus::Cancelled => Self::Cancelled,
        }
    }
}

impl From<StatusV1> for TaskStatus {
    fn from(status: StatusV1) -> Self {
        match status {
            StatusV1::Working => Self::Working,
            StatusV1::InputRequired => Self::InputRequired,
            StatusV1::Completed => Self::Completed,
            StatusV1::Failed => Self::Failed,
            StatusV1::Cancelled => Self::Cancelled,
        }
    }
}

impl From<&Transition> for TransitionV1 {
    fn from(t: &Transition) -> Self {
        Self {
            at_ms: t.at_ms,
            status: t.status.into(),
            message: t.message.clone(),
        }
    }
}

impl From<TransitionV1> for Transition {
    /// As stored: a message is not cut again (whatever was written is read back).
    fn from(t: TransitionV1) -> Self {
        Self {
            at_ms: t.at_ms,
            status: t.status.into(),
            message: t.message,
        }
    }
}

impl OutcomeV1 {
    fn from_outcome(outcome: &TaskOutcome) -> Result<Self, PersistError> {
        Ok(match outcome {
            TaskOutcome::Result(value) => Self::Result(json_text(value)?),
            TaskOutcome::Error(TaskError {
                code,
                message,
                data,
            }) => Self::Error {
                code: *code,
                message: message.clone(),
                data: data.as_ref().map(json_text).transpose()?,
            },
        })
    }

    fn into_outcome(self) -> Result<TaskOutcome, PersistError> {
        Ok(match self {
            Self::Result(text) => TaskOutcome::Result(parse_json("outcome.result", &text)?),
            Self::Error {
                code,
                message,
                data,
            } => TaskOutcome::Error(TaskError {
                code,
                message,
                data: data
                    .map(|text| parse_json("outcome.error.data", &text))
                    .transpose()?,
            }),
        })
    }
}

// ---- helpers ----

fn json_text(value: &Value) -> Result<String, PersistError> {
    serde_json::to_string(value).map_err(|e| PersistError::Encode(e.to_string()))
}

fn json_map_text(map: &BTreeMap<String, Value>) -> Result<Vec<(String, String)>, PersistError> {
    map.iter()
        .map(|(k, v)| Ok((k.clone(), json_text(v)?)))
        .collect()
}

fn parse_json(field: &'static str, text: &str) -> Result<Value, PersistError> {
    serde_json::from_str(text).map_err(|e| PersistError::InvalidField {
        field,
        detail: format!("not valid JSON text: {e}"),
    })
}

/// Rebuilds a map from entries that [`encode`] wrote in strictly ascending key order; any
/// other order (in particular a repeated key) means the bytes are corrupt.
fn parse_json_map(
    field: &'static str,
    entries: Vec<(String, String)>,
) -> Result<BTreeMap<String, Value>, PersistError> {
    let mut map = BTreeMap::new();
    for (key, text) in entries {
        check_ascending(field, map.last_key_value().map(|(k, _)| k), &key)?;
        let value = serde_json::from_str(&text).map_err(|e| PersistError::InvalidField {
            field,
            detail: format!("entry `{key}` is not valid JSON text: {e}"),
        })?;
        map.insert(key, value);
    }
    Ok(map)
}

/// Rebuilds [`TaskRecord::step_attempts`] from entries that [`encode`] wrote in strictly
/// ascending order, each naming a step of `journal`.
fn parse_step_attempts(
    journal: &BTreeMap<String, Value>,
    entries: Vec<(String, u32)>,
) -> Result<BTreeMap<String, u32>, PersistError> {
    const FIELD: &str = "step_attempts";
    let mut map = BTreeMap::new();
    for (step, attempt) in entries {
        check_ascending(FIELD, map.last_key_value().map(|(k, _)| k), &step)?;
        if !journal.contains_key(&step) {
            return Err(PersistError::InvalidField {
                field: FIELD,
                detail: format!("step `{step}` is not in the journal"),
            });
        }
        map.insert(step, attempt);
    }
    Ok(map)
}

/// Rebuilds [`TaskRecord::history`] from the entries [`encode`] wrote.
fn parse_history(entries: Vec<TransitionV1>) -> Result<Vec<Transition>, PersistError> {
    let history: Vec<Transition> = entries.into_iter().map(Transition::from).collect();
    check_history(&history).map_err(|detail| PersistError::InvalidField {
        field: "history",
        detail,
    })?;
    Ok(history)
}

/// What a stored history must be: at most [`MAX_HISTORY`] entries, times non-decreasing.
fn check_history(history: &[Transition]) -> Result<(), String> {
    if history.len() > MAX_HISTORY {
        return Err(format!(
            "{} entries, more than the {MAX_HISTORY} kept",
            history.len()
        ));
    }
    if let Some(i) = (1..history.len()).find(|&i| history[i].at_ms < history[i - 1].at_ms) {
        return Err(format!(
            "entry {i} at {} ms is earlier than the entry before it at {} ms",
            history[i].at_ms,
            history[i - 1].at_ms
        ));
    }
    Ok(())
}

fn parse_key_set(field: &'static str, keys: Vec<String>) -> Result<BTreeSet<String>, PersistError> {
    let mut set = BTreeSet::new();
    for key in keys {
        check_ascending(field, set.last(), &key)?;
        set.insert(key);
    }
    Ok(set)
}

fn check_ascending(
    field: &'static str,
    previous: Option<&String>,
    key: &str,
) -> Result<(), PersistError> {
    match previous {
        Some(prev) if prev.as_str() >= key => Err(PersistError::InvalidField {
            field,
            detail: format!("key `{key}` is repeated or out of order"),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests;
