//! Tests of the snapshot envelope: golden files per format version, malformed input, and
//! property tests (round trip of random records; no panic on arbitrary bytes).
//!
//! Golden files live in `crates/mcp-tasks/tests/data/snapshots/`. Files of a shipped version are frozen: the
//! tests never overwrite an existing `.bin`. A missing one is created only when the tests run
//! with `MCP_TASKS_BLESS=1`. When a new format version is added, the `v1_*` files keep
//! proving that old bytes still decode to the same records (check (b)); check (a), that
//! `encode` writes exactly these bytes, then moves to the new version's goldens (today
//! `v5_*`; `v1_*` to `v4_*` are checked with (b) only).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::task::{
    MAX_HISTORY, Owner, TaskError, TaskId, TaskOutcome, TaskRecord, TaskStatus, Transition,
};

// ---- canonical records ----

/// 2026-01-01T00:00:00Z in ms.
const T0: u64 = 1_767_225_600_000;

fn canonical_id(last: u8) -> TaskId {
    TaskId::from_bytes([
        0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32,
        last,
    ])
}

/// JSON whose object keys are deliberately not sorted: the snapshot must keep their order
/// (serde_json is built with `preserve_order`).
fn canonical_arguments() -> Value {
    json!({
        "zeta": "last letter first",
        "alpha": [true, false, null, 0, -7, 18446744073709551615u64, 1.5, -2.25e-8, "ünïcødé ✓"],
        "nested": { "b": { "deep": [] }, "a": {} },
    })
}

fn elicit(message: &str, field: &str) -> Value {
    json!({
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": message,
            "requestedSchema": {
                "type": "object",
                "properties": { field: { "type": "string" } },
                "required": [field],
            },
        },
    })
}

fn base(last: u8) -> TaskRecord {
    let mut r = TaskRecord::new(
        canonical_id(last),
        Owner::new("acme", "alice@example.com"),
        "long_job".into(),
        canonical_arguments(),
        json!({ "elicitation": { "form": {} }, "sampling": {} }),
        T0,
        Some(3_600_000),
        Some(5_000),
        Some("The operation is now in progress.".into()),
    );
    r.journal.insert(
        "download".into(),
        json!({ "bytes": 1024, "etag": "\"abc\"" }),
    );
    r.seq = 2;
    r.last_updated_at_ms = T0 + 1_500;
    r
}

fn working() -> TaskRecord {
    base(0x01)
}

fn input_required() -> TaskRecord {
    let mut r = base(0x02);
    r.status = TaskStatus::InputRequired;
    r.status_message = Some("Waiting for your input.".into());
    r.issued_keys = ["name", "confirm", "color"]
        .map(String::from)
        .into_iter()
        .collect();
    r.answers.insert(
        "name".into(),
        json!({ "action": "accept", "content": { "name": "Ada" } }),
    );
    r.pending_inputs
        .insert("confirm".into(), elicit("Proceed?", "ok"));
    r.pending_inputs
        .insert("color".into(), elicit("Pick a colour.", "color"));
    r.seq = 5;
    r.last_updated_at_ms = T0 + 4_000;
    r
}

fn completed() -> TaskRecord {
    let mut r = base(0x03);
    r.status = TaskStatus::Completed;
    r.status_message = None;
    r.ttl_ms = None;
    r.poll_interval_ms = None;
    r.issued_keys = ["name"].map(String::from).into_iter().collect();
    r.answers.insert(
        "name".into(),
        json!({ "action": "accept", "content": { "name": "Ada" } }),
    );
    r.journal.insert("render".into(), json!("ok"));
    r.outcome = Some(TaskOutcome::Result(json!({
        "resultType": "complete",
        "content": [{ "type": "text", "text": "Hello, Ada!" }],
        "isError": false,
    })));
    r.seq = 7;
    r.last_updated_at_ms = T0 + 9_000;
    r
}

fn failed() -> TaskRecord {
    let mut r = base(0x04);
    r.status = TaskStatus::Failed;
    r.status_message = Some("upstream exploded".into());
    r.outcome = Some(TaskOutcome::Error(TaskError {
        code: -32603,
        message: "upstream exploded".into(),
        data: Some(json!({ "retryable": false, "detail": "ünïcødé ✓", "attempts": [1, 2, 3] })),
    }));
    r.seq = 4;
    r.last_updated_at_ms = T0 + 6_000;
    r
}

fn cancelled() -> TaskRecord {
    let mut r = base(0x05);
    r.status = TaskStatus::Cancelled;
    r.status_message = Some("Cancelled while waiting for input.".into());
    r.cancel_requested = true;
    r.issued_keys = ["confirm"].map(String::from).into_iter().collect();
    r.seq = 4;
    r.last_updated_at_ms = T0 + 3_000;
    r
}

/// The canonical records as the current format version (5) stores them: the records of
/// version 4 (version 5 only moved the arguments to the end of the bytes).
fn canonical() -> Vec<(&'static str, TaskRecord)> {
    canonical_v4()
        .into_iter()
        .map(|(name, record)| {
            let name = match name {
                "v4_working" => "v5_working",
                "v4_input_required" => "v5_input_required",
                "v4_completed" => "v5_completed",
                "v4_failed" => "v5_failed",
                "v4_cancelled" => "v5_cancelled",
                other => unreachable!("{other}"),
            };
            (name, record)
        })
        .collect()
}

/// The canonical records of format version 4: version 3's (attempt counts, the attempt each
/// journaled step committed in) with their transition histories.
fn canonical_v4() -> Vec<(&'static str, TaskRecord)> {
    const STARTED: Option<&str> = Some("The operation is now in progress.");
    const WAITING: Option<&str> = Some("Waiting for your input.");
    let v4 =
        |name: &'static str, mut r: TaskRecord, history: &[(u64, TaskStatus, Option<&str>)]| {
            r.history = history
                .iter()
                .map(|(at, status, message)| Transition::new(T0 + at, *status, *message))
                .collect();
            (name, r)
        };
    let [working, input_required, completed, failed, cancelled] = canonical_v3().map(|(_, r)| r);
    use TaskStatus::*;
    vec![
        v4(
            "v4_working",
            working,
            &[
                (0, Working, STARTED),
                (500, InputRequired, WAITING),
                (1_200, Working, STARTED),
            ],
        ),
        v4(
            "v4_input_required",
            input_required,
            &[
                (0, Working, STARTED),
                (1_000, InputRequired, WAITING),
                (2_000, Working, STARTED),
                (4_000, InputRequired, WAITING),
            ],
        ),
        v4(
            "v4_completed",
            completed,
            &[
                (0, Working, STARTED),
                (2_000, InputRequired, Some("Wie heißt du? ✓")),
                (5_000, Working, STARTED),
                (9_000, Completed, None),
            ],
        ),
        v4(
            "v4_failed",
            failed,
            &[
                (0, Working, STARTED),
                (6_000, Failed, Some("upstream exploded")),
            ],
        ),
        v4(
            "v4_cancelled",
            cancelled,
            &[
                (0, Working, STARTED),
                (1_000, InputRequired, WAITING),
                (3_000, Cancelled, Some("Cancelled while waiting for input.")),
            ],
        ),
    ]
}

/// The history a record of a format version before 4 reads with (every canonical record
/// changed after its creation): the creation, with no message (it is not known), and the
/// current status at the last update, with the current message.
fn reconstructed(mut r: TaskRecord) -> TaskRecord {
    r.history = vec![
        Transition::new(r.created_at_ms, TaskStatus::Working, None),
        Transition::new(r.last_updated_at_ms, r.status, r.status_message.as_deref()),
    ];
    r
}

/// The canonical records of format version 3: attempt counts and step attempts, no history
/// (it reads as reconstructed).
fn canonical_v3() -> [(&'static str, TaskRecord); 5] {
    let v3 = |mut r: TaskRecord, n: u32, steps: &[(&str, u32)]| {
        r.attempts = n;
        r.step_attempts = steps.iter().map(|(s, a)| ((*s).to_owned(), *a)).collect();
        reconstructed(r)
    };
    [
        ("v3_working", v3(working(), 1, &[("download", 1)])),
        (
            "v3_input_required",
            v3(input_required(), 1, &[("download", 2)]),
        ),
        (
            "v3_completed",
            v3(completed(), 2, &[("download", 1), ("render", 3)]),
        ),
        ("v3_failed", v3(failed(), 4, &[("download", 1)])),
        ("v3_cancelled", v3(cancelled(), 1, &[])),
    ]
}

/// The canonical records of format version 2: attempt counts, no step attempts (they read as
/// none recorded), no history (it reads as reconstructed).
fn canonical_v2() -> Vec<(&'static str, TaskRecord)> {
    let attempts = |mut r: TaskRecord, n: u32| {
        r.attempts = n;
        reconstructed(r)
    };
    vec![
        ("v2_working", attempts(working(), 1)),
        ("v2_input_required", attempts(input_required(), 1)),
        ("v2_completed", attempts(completed(), 2)),
        ("v2_failed", attempts(failed(), 4)),
        ("v2_cancelled", attempts(cancelled(), 1)),
    ]
}

/// The canonical records of format version 1: no attempt counter (it reads as 0), no history
/// (it reads as reconstructed).
fn canonical_v1() -> Vec<(&'static str, TaskRecord)> {
    let v1 = |mut r: TaskRecord| {
        r.attempts = 0;
        reconstructed(r)
    };
    vec![
        ("v1_working", v1(working())),
        ("v1_input_required", v1(input_required())),
        ("v1_completed", v1(completed())),
        ("v1_failed", v1(failed())),
        ("v1_cancelled", v1(cancelled())),
    ]
}

// ---- golden files ----

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/snapshots")
}

fn blessing() -> bool {
    std::env::var("MCP_TASKS_BLESS").is_ok_and(|v| v == "1")
}

/// A human-readable description written beside each golden file (documentation only; the
/// `.bin` is the authority).
fn describe(name: &str, record: &TaskRecord, bytes: &[u8]) -> Value {
    let map = |m: &BTreeMap<String, Value>| Value::Object(m.clone().into_iter().collect());
    json!({
        "golden": format!("{name}.bin"),
        "format_version": CURRENT_VERSION,
        "bytes": bytes.len(),
        "note": "postcard Envelope::V5(SnapshotV5 { base: SnapshotV4 { base: SnapshotV3 { base: SnapshotV2 { base: SnapshotV1 (arguments empty), attempts }, step_attempts }, history }, arguments_len }) followed by the arguments' JSON text (src/persist/mod.rs); JSON payloads are stored as JSON text",
        "record": {
            "id": record.id.as_str(),
            "owner": { "tenant": record.owner.tenant, "principal": record.owner.principal },
            "tool": record.tool,
            "arguments": record.arguments,
            "client_capabilities": *record.client_capabilities,
            "status": record.status.as_str(),
            "status_message": record.status_message,
            "created_at_ms": record.created_at_ms,
            "last_updated_at_ms": record.last_updated_at_ms,
            "ttl_ms": record.ttl_ms,
            "poll_interval_ms": record.poll_interval_ms,
            "seq": record.seq,
            "pending_inputs": map(&record.pending_inputs),
            "issued_keys": record.issued_keys,
            "answers": map(&record.answers),
            "journal": map(&record.journal),
            "outcome": match &record.outcome {
                None => Value::Null,
                Some(TaskOutcome::Result(v)) => json!({ "result": v }),
                Some(TaskOutcome::Error(e)) =>
                    json!({ "error": { "code": e.code, "message": e.message, "data": e.data } }),
            },
            "cancel_requested": record.cancel_requested,
            "attempts": record.attempts,
            "step_attempts": record.step_attempts,
            "history": record.history.iter().map(|t| json!({
                "at_ms": t.at_ms,
                "status": t.status.as_str(),
                "message": t.message,
            })).collect::<Vec<_>>(),
        },
    })
}

/// Goldens of an older format version (frozen, written by an earlier build) still decode to
/// the same records; written again, they become the current version.
fn check_frozen_goldens(version: u32, records: Vec<(&'static str, TaskRecord)>) {
    let dir = golden_dir();
    for (name, record) in records {
        let bin = dir.join(format!("{name}.bin"));
        let golden = std::fs::read(&bin)
            .unwrap_or_else(|e| panic!("cannot read golden file {}: {e}", bin.display()));
        assert_eq!(snapshot_version(&golden), Ok(version));
        // The owner is read from the first fields of every version.
        assert_eq!(
            decode_owner(&golden),
            Ok(record.owner.clone()),
            "{name}.bin"
        );
        assert_eq!(
            decode(&golden).unwrap_or_else(|e| panic!("{name}.bin no longer decodes: {e}")),
            record,
            "{name}.bin decodes to a different record"
        );
        let again = encode(&record).unwrap();
        assert_eq!(snapshot_version(&again), Ok(CURRENT_VERSION));
        assert_eq!(decode(&again).unwrap(), record);
    }
}

/// Version 1 goldens decode with an attempt counter of 0, no step attempts and a
/// reconstructed history.
#[test]
fn golden_files_v1() {
    check_frozen_goldens(1, canonical_v1());
}

/// Version 2 goldens decode with their attempt counter, no step attempts and a reconstructed
/// history.
#[test]
fn golden_files_v2() {
    check_frozen_goldens(2, canonical_v2());
}

/// Version 3 goldens decode with their attempt counter and step attempts and a reconstructed
/// history.
#[test]
fn golden_files_v3() {
    check_frozen_goldens(3, canonical_v3().into());
}

/// Version 4 goldens decode with their attempt counter, step attempts and history (the
/// arguments inside the envelope).
#[test]
fn golden_files_v4() {
    check_frozen_goldens(4, canonical_v4());
}

#[test]
fn golden_files_v5() {
    let dir = golden_dir();
    let bless = blessing();
    let mut missing = Vec::new();
    for (name, record) in canonical() {
        let encoded = encode(&record).expect("canonical records encode");
        let bin = dir.join(format!("{name}.bin"));
        let golden = match std::fs::read(&bin) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if !bless {
                    missing.push(bin.display().to_string());
                    continue;
                }
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&bin, &encoded).unwrap();
                let text =
                    serde_json::to_string_pretty(&describe(name, &record, &encoded)).unwrap();
                std::fs::write(dir.join(format!("{name}.json")), text + "\n").unwrap();
                encoded.clone()
            }
            Err(e) => panic!("cannot read golden file {}: {e}", bin.display()),
        };
        // (b) old bytes still decode to the canonical record.
        assert_eq!(
            decode(&golden).unwrap_or_else(|e| panic!("{name}.bin no longer decodes: {e}")),
            record,
            "{name}.bin decodes to a different record"
        );
        // (a) the current encoder writes exactly the golden bytes.
        assert!(
            encoded == golden,
            "encode() of the canonical `{name}` record differs from {}: a format version that \
             has shipped is frozen. Change the format by adding a new Envelope variant (see the \
             docs of src/persist/mod.rs), never by regenerating goldens.",
            bin.display()
        );
        assert_eq!(snapshot_version(&golden), Ok(5));
        // The last bytes are the arguments' JSON text, as `encode_parts` says.
        let (parts, tail) = encode_parts(&record).unwrap();
        assert_eq!(parts, golden);
        assert_eq!(
            &golden[golden.len() - tail..],
            serde_json::to_string(&record.arguments).unwrap().as_bytes(),
            "{name}"
        );
    }
    assert!(
        missing.is_empty(),
        "missing golden snapshot file(s): {missing:?}\ncreate them once with \
         `MCP_TASKS_BLESS=1 cargo test --lib persist` and commit them; existing files are never \
         overwritten"
    );
}

#[test]
fn canonical_records_round_trip() {
    for (name, record) in canonical() {
        let bytes = encode(&record).unwrap();
        assert_eq!(bytes[0], 4, "{name}: V5 is variant index 4");
        assert_eq!(decode(&bytes).unwrap(), record, "{name}");
    }
}

#[test]
fn object_key_order_survives() {
    let record = working();
    let decoded = decode(&encode(&record).unwrap()).unwrap();
    let keys: Vec<&String> = decoded.arguments.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["zeta", "alpha", "nested"]);
}

#[test]
fn awkward_numbers_round_trip_exactly() {
    let mut record = working();
    record.arguments = json!([
        0.1,
        1.0,
        -0.0,
        f64::MAX,
        f64::MIN_POSITIVE,
        5e-324,
        f64::from_bits(0x000f_ffff_ffff_ffff), // largest subnormal
        0.30000000000000004,
        9007199254740993u64,
        i64::MIN,
        u64::MAX,
    ]);
    let decoded = decode(&encode(&record).unwrap()).unwrap();
    assert_eq!(decoded, record);
    // Value equality of floats is numeric; also compare the exact bit patterns.
    let bits = |v: &Value| -> Vec<Option<u64>> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_f64().map(f64::to_bits))
            .collect()
    };
    assert_eq!(bits(&decoded.arguments), bits(&record.arguments));
}

// ---- malformed input ----

#[test]
fn empty_input_is_an_error() {
    assert!(matches!(decode(&[]), Err(PersistError::Decode(_))));
    assert!(matches!(
        snapshot_version(&[]),
        Err(PersistError::Decode(_))
    ));
}

#[test]
fn unknown_versions_are_reported_as_such() {
    let mut bytes = encode(&working()).unwrap();
    bytes[0] = 7;
    assert_eq!(decode(&bytes), Err(PersistError::UnknownVersion(8)));
    assert_eq!(decode(&[5]), Err(PersistError::UnknownVersion(6)));
    // A multi-byte varint tag (index 300).
    assert_eq!(
        decode(&[0xac, 0x02, 0, 0]),
        Err(PersistError::UnknownVersion(301))
    );
    // u32::MAX as index does not overflow.
    assert_eq!(
        decode(&[0xff, 0xff, 0xff, 0xff, 0x0f]),
        Err(PersistError::UnknownVersion(u32::MAX))
    );
    // An over-long varint is not a version at all.
    assert!(matches!(decode(&[0xff; 8]), Err(PersistError::Decode(_))));
    let message = PersistError::UnknownVersion(8).to_string();
    assert!(message.contains("version 8"), "{message}");
}

#[test]
fn every_truncation_is_an_error() {
    for (name, record) in canonical() {
        let bytes = encode(&record).unwrap();
        for len in 0..bytes.len() {
            assert!(
                decode(&bytes[..len]).is_err(),
                "{name} truncated to {len} bytes decoded"
            );
        }
    }
}

#[test]
fn trailing_bytes_are_an_error() {
    // Before version 5 nothing follows the envelope.
    let mut bytes = v4_bytes(Vec::new());
    bytes.push(0);
    let err = decode(&bytes).unwrap_err();
    assert!(
        matches!(&err, PersistError::Decode(m) if m.contains("trailing")),
        "{err}"
    );
    // In version 5 the arguments do, and nothing after them.
    let mut bytes = encode(&working()).unwrap();
    bytes.push(b' ');
    let err = decode(&bytes).unwrap_err();
    assert!(
        matches!(&err, PersistError::Decode(m) if m.contains("arguments")),
        "{err}"
    );
}

/// A version 5 snapshot needs its arguments after the envelope (a store that kept them apart
/// and lost them is caught, not read as empty), and only there.
#[test]
fn version_5_arguments_are_the_last_bytes_and_only_there() {
    let record = working();
    let (bytes, tail) = encode_parts(&record).unwrap();
    let head = &bytes[..bytes.len() - tail];
    let err = decode(head).unwrap_err();
    assert!(
        matches!(&err, PersistError::Decode(m) if m.contains("arguments")),
        "{err}"
    );
    // The owner reads from the head alone.
    assert_eq!(decode_owner(head), Ok(record.owner.clone()));
    let mut inside = SnapshotV1::from_record(&record).unwrap();
    inside.arguments = "{}".into();
    let twice = SnapshotV5 {
        base: SnapshotV4 {
            base: SnapshotV3 {
                base: SnapshotV2 {
                    base: inside,
                    attempts: 0,
                },
                step_attempts: Vec::new(),
            },
            history: Vec::new(),
        },
        arguments_len: 2,
    };
    let mut bytes = postcard::to_stdvec(&Envelope::V5(twice)).unwrap();
    bytes.extend_from_slice(b"{}");
    assert_eq!(invalid_field(&bytes), "arguments");
    let mut bytes = head.to_vec();
    bytes.extend_from_slice(&vec![0xff; tail]);
    assert_eq!(invalid_field(&bytes), "arguments");
}

#[test]
fn garbage_is_an_error() {
    for bytes in [
        &b"\x00garbage"[..],
        b"\x00\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
        b"{}",
    ] {
        assert!(decode(bytes).is_err(), "{bytes:?}");
    }
}

fn snapshot_bytes(edit: impl FnOnce(&mut SnapshotV1)) -> Vec<u8> {
    let mut snapshot = SnapshotV1::from_record(&input_required()).unwrap();
    edit(&mut snapshot);
    postcard::to_stdvec(&Envelope::V1(snapshot)).unwrap()
}

fn invalid_field(bytes: &[u8]) -> &'static str {
    match decode(bytes) {
        Err(PersistError::InvalidField { field, .. }) => field,
        other => panic!("expected InvalidField, got {other:?}"),
    }
}

#[test]
fn malformed_task_id_is_an_invalid_field() {
    assert_eq!(
        invalid_field(&snapshot_bytes(|s| s.id = "gate-test".into())),
        "id"
    );
    assert_eq!(
        invalid_field(&snapshot_bytes(|s| s.id.make_ascii_uppercase())),
        "id"
    );
}

#[test]
fn invalid_json_text_is_an_invalid_field() {
    assert_eq!(
        invalid_field(&snapshot_bytes(|s| s.arguments = "{".into())),
        "arguments"
    );
    assert_eq!(
        invalid_field(&snapshot_bytes(|s| s.client_capabilities = String::new())),
        "client_capabilities"
    );
    assert_eq!(
        invalid_field(&snapshot_bytes(|s| s.pending_inputs[0].1 = "nope".into())),
        "pending_inputs"
    );
    assert_eq!(
        invalid_field(&snapshot_bytes(|s| s.answers[0].1 = "[1,".into())),
        "answers"
    );
    assert_eq!(
        invalid_field(&snapshot_bytes(|s| s.journal[0].1 = "x".into())),
        "journal"
    );
    assert_eq!(
        invalid_field(&snapshot_bytes(
            |s| s.outcome = Some(OutcomeV1::Result("{]".into()))
        )),
        "outcome.result"
    );
    assert_eq!(
        invalid_field(&snapshot_bytes(|s| {
            s.outcome = Some(OutcomeV1::Error {
                code: 1,
                message: "m".into(),
                data: Some("?".into()),
            })
        })),
        "outcome.error.data"
    );
    let err = decode(&snapshot_bytes(|s| s.arguments = "{".into())).unwrap_err();
    assert!(err.to_string().contains("`arguments`"), "{err}");
}

#[test]
fn repeated_or_unsorted_keys_are_an_invalid_field() {
    assert_eq!(
        invalid_field(&snapshot_bytes(|s| {
            let first = s.pending_inputs[0].clone();
            s.pending_inputs.push(first);
        })),
        "pending_inputs"
    );
    assert_eq!(
        invalid_field(&snapshot_bytes(|s| s.issued_keys.reverse())),
        "issued_keys"
    );
    assert_eq!(
        invalid_field(&snapshot_bytes(|s| s.issued_keys.push("name".into()))),
        "issued_keys"
    );
}

#[test]
fn invalid_enum_and_bool_bytes_are_errors() {
    // The cancel_requested flag is the last byte of a V1 snapshot (and the byte before the
    // one-byte attempt count of a V2 one); only 0 and 1 are booleans.
    let mut bytes = snapshot_bytes(|_| {});
    *bytes.last_mut().unwrap() = 2;
    assert!(matches!(decode(&bytes), Err(PersistError::Decode(_))));
    let record = canonical_v2()[0].1.clone();
    let v2 = SnapshotV2 {
        base: SnapshotV1::from_record(&record).unwrap(),
        attempts: record.attempts,
    };
    let mut bytes = postcard::to_stdvec(&Envelope::V2(v2)).unwrap();
    let at = bytes.len() - 2;
    bytes[at] = 2;
    assert!(matches!(decode(&bytes), Err(PersistError::Decode(_))));
}

fn v3_bytes(steps: Vec<(&str, u32)>) -> Vec<u8> {
    let record = completed();
    let snapshot = SnapshotV3 {
        base: SnapshotV2 {
            base: SnapshotV1::from_record(&record).unwrap(),
            attempts: 1,
        },
        step_attempts: steps.into_iter().map(|(s, a)| (s.to_owned(), a)).collect(),
    };
    postcard::to_stdvec(&Envelope::V3(snapshot)).unwrap()
}

#[test]
fn step_attempts_must_be_sorted_journal_steps() {
    assert!(decode(&v3_bytes(vec![("download", 1), ("render", 2)])).is_ok());
    assert_eq!(
        invalid_field(&v3_bytes(vec![("render", 2), ("download", 1)])),
        "step_attempts"
    );
    assert_eq!(
        invalid_field(&v3_bytes(vec![("download", 1), ("download", 2)])),
        "step_attempts"
    );
    assert_eq!(
        invalid_field(&v3_bytes(vec![("upload", 1)])),
        "step_attempts"
    );
    // What decode would refuse is never written.
    let mut record = completed();
    record.step_attempts.insert("upload".into(), 1);
    assert!(matches!(encode(&record), Err(PersistError::Encode(_))));
}

fn v4_bytes(history: Vec<TransitionV1>) -> Vec<u8> {
    let record = completed();
    let snapshot = SnapshotV4 {
        base: SnapshotV3 {
            base: SnapshotV2 {
                base: SnapshotV1::from_record(&record).unwrap(),
                attempts: 1,
            },
            step_attempts: Vec::new(),
        },
        history,
    };
    postcard::to_stdvec(&Envelope::V4(snapshot)).unwrap()
}

fn entry(at_ms: u64) -> TransitionV1 {
    TransitionV1 {
        at_ms,
        status: StatusV1::Working,
        message: None,
    }
}

#[test]
fn history_must_be_bounded_and_in_time_order() {
    let full: Vec<TransitionV1> = (0..MAX_HISTORY as u64).map(entry).collect();
    assert_eq!(decode(&v4_bytes(full)).unwrap().history.len(), MAX_HISTORY);
    // Equal times are allowed, an empty history too.
    assert!(decode(&v4_bytes(vec![entry(5), entry(5)])).is_ok());
    assert!(decode(&v4_bytes(Vec::new())).is_ok());
    let too_long: Vec<TransitionV1> = (0..=MAX_HISTORY as u64).map(entry).collect();
    assert_eq!(invalid_field(&v4_bytes(too_long)), "history");
    assert_eq!(
        invalid_field(&v4_bytes(vec![entry(5), entry(7), entry(6)])),
        "history"
    );
    // What decode would refuse is never written.
    let mut record = completed();
    record.history = vec![
        Transition::new(T0 + 1, TaskStatus::Working, None),
        Transition::new(T0, TaskStatus::Completed, None),
    ];
    assert!(matches!(encode(&record), Err(PersistError::Encode(_))));
    record.history = vec![Transition::new(T0, TaskStatus::Working, None); MAX_HISTORY + 1];
    assert!(matches!(encode(&record), Err(PersistError::Encode(_))));
}

/// A record of a version before 4 that is as it was created reads with the creation alone,
/// with its message; one whose last update is before its creation (not written by `apply`)
/// still reads with a history in time order.
#[test]
fn reconstructed_histories_tell_only_what_the_record_does() {
    let v3 = |record: &TaskRecord| {
        let snapshot = SnapshotV3 {
            base: SnapshotV2 {
                base: SnapshotV1::from_record(record).unwrap(),
                attempts: record.attempts,
            },
            step_attempts: Vec::new(),
        };
        postcard::to_stdvec(&Envelope::V3(snapshot)).unwrap()
    };
    let mut fresh = working();
    fresh.journal.clear();
    fresh.seq = 1;
    fresh.last_updated_at_ms = fresh.created_at_ms;
    assert_eq!(
        decode(&v3(&fresh)).unwrap().history,
        [Transition::new(
            T0,
            TaskStatus::Working,
            Some("The operation is now in progress.")
        )]
    );
    // Only the message changed since (or also the status, and back): not known which.
    let mut updated = fresh.clone();
    updated.last_updated_at_ms = T0 + 10;
    assert_eq!(
        decode(&v3(&updated)).unwrap().history,
        [
            Transition::new(T0, TaskStatus::Working, None),
            Transition::new(
                T0 + 10,
                TaskStatus::Working,
                Some("The operation is now in progress.")
            ),
        ]
    );
    let mut skewed = failed();
    skewed.last_updated_at_ms = T0 - 1;
    let history = decode(&v3(&skewed)).unwrap().history;
    assert_eq!(
        history,
        [
            Transition::new(T0, TaskStatus::Working, None),
            Transition::new(T0, TaskStatus::Failed, Some("upstream exploded")),
        ]
    );
    // Reconstructed messages are cut like the ones `apply` records.
    let mut long = failed();
    long.status_message = Some("é".repeat(200));
    let history = decode(&v3(&long)).unwrap().history;
    assert_eq!(
        history[1].message.as_deref(),
        Some("é".repeat(120).as_str())
    );
    // Encoded again, the reconstructed history is stored as it is.
    let again = decode(&v3(&long)).unwrap();
    assert_eq!(decode(&encode(&again).unwrap()).unwrap(), again);
}

/// How many bytes the history adds to the canonical snapshots, over the same record in
/// format version 3 (printed with `--nocapture`).
#[test]
fn history_size_of_the_canonical_records() {
    for (name, record) in canonical() {
        let v4 = encode(&record).unwrap().len();
        let v3 = postcard::to_stdvec(&Envelope::V3(SnapshotV3 {
            base: SnapshotV2 {
                base: SnapshotV1::from_record(&record).unwrap(),
                attempts: record.attempts,
            },
            step_attempts: record
                .step_attempts
                .iter()
                .map(|(s, a)| (s.clone(), *a))
                .collect(),
        }))
        .unwrap()
        .len();
        println!(
            "{name}: {v4} bytes, {v3} in version 3: the history ({} entries) adds {}",
            record.history.len(),
            v4 - v3
        );
        // The entry count, then per entry a time (at most 10 bytes), a status, an option tag,
        // the message's length and the message.
        let bound: usize = 1 + record
            .history
            .iter()
            .map(|t| 13 + t.message.as_ref().map_or(0, String::len))
            .sum::<usize>();
        assert!(v4 - v3 <= bound, "{name}");
    }
}

// ---- property tests ----

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((".{0,6}", inner), 0..6)
                .prop_map(|entries| Value::Object(entries.into_iter().collect())),
        ]
    })
}

fn arb_json_map() -> impl Strategy<Value = BTreeMap<String, Value>> {
    prop::collection::btree_map(".{0,8}", arb_json(), 0..4)
}

fn arb_status() -> impl Strategy<Value = TaskStatus> {
    prop_oneof![
        Just(TaskStatus::Working),
        Just(TaskStatus::InputRequired),
        Just(TaskStatus::Completed),
        Just(TaskStatus::Failed),
        Just(TaskStatus::Cancelled),
    ]
}

/// A history as `decode` accepts it: up to [`MAX_HISTORY`] entries, times non-decreasing
/// (equal times included) from any start.
fn arb_history() -> impl Strategy<Value = Vec<Transition>> {
    (
        any::<u64>(),
        prop::collection::vec(
            (
                prop_oneof![Just(0u64), 0u64..10_000, any::<u64>()],
                arb_status(),
                prop::option::of(".{0,16}"),
            ),
            0..=MAX_HISTORY,
        ),
    )
        .prop_map(|(start, entries)| {
            let mut at = start;
            entries
                .into_iter()
                .map(|(step, status, message)| {
                    at = at.saturating_add(step);
                    Transition {
                        at_ms: at,
                        status,
                        message,
                    }
                })
                .collect()
        })
}

fn arb_outcome() -> impl Strategy<Value = Option<TaskOutcome>> {
    prop::option::of(prop_oneof![
        arb_json().prop_map(TaskOutcome::Result),
        (any::<i64>(), ".{0,16}", prop::option::of(arb_json())).prop_map(
            |(code, message, data)| TaskOutcome::Error(TaskError {
                code,
                message,
                data
            })
        ),
    ])
}

prop_compose! {
    fn arb_record()(
        id in any::<[u8; 16]>(),
        tenant in ".{0,8}",
        principal in ".{0,8}",
        tool in ".{0,12}",
        arguments in arb_json(),
        client_capabilities in arb_json(),
        status in arb_status(),
        status_message in prop::option::of(".{0,16}"),
        times in any::<(u64, u64, Option<u64>, Option<u64>, u64)>(),
        pending_inputs in arb_json_map(),
        issued_keys in prop::collection::btree_set(".{0,8}", 0..6),
        answers in arb_json_map(),
        journal in arb_json_map(),
        step_attempts in prop::collection::vec(prop::option::of(any::<u32>()), 4),
        outcome in arb_outcome(),
        cancel_requested in any::<bool>(),
        attempts in any::<u32>(),
        history in arb_history(),
    ) -> TaskRecord {
        // Some of the journal's steps have a recorded attempt, as in records of every age.
        let step_attempts = journal
            .keys()
            .zip(step_attempts)
            .filter_map(|(step, attempt)| Some((step.clone(), attempt?)))
            .collect();
        let (created_at_ms, last_updated_at_ms, ttl_ms, poll_interval_ms, seq) = times;
        TaskRecord {
            id: TaskId::from_bytes(id),
            owner: Owner { tenant, principal },
            tool,
            arguments,
            client_capabilities: client_capabilities.into(),
            status,
            status_message,
            created_at_ms,
            last_updated_at_ms,
            ttl_ms,
            poll_interval_ms,
            seq,
            pending_inputs,
            issued_keys: issued_keys.into_iter().collect::<BTreeSet<_>>(),
            answers,
            journal,
            step_attempts,
            outcome,
            cancel_requested,
            attempts,
            history,
        }
    }
}

proptest! {
    #[test]
    fn random_records_round_trip(record in arb_record()) {
        let bytes = encode(&record).unwrap();
        prop_assert_eq!(snapshot_version(&bytes), Ok(CURRENT_VERSION));
        prop_assert_eq!(decode_owner(&bytes), Ok(record.owner.clone()));
        // The owner's fields come first (a dozen fields follow them): a record cut short
        // still names its owner, though it no longer decodes.
        let cut = &bytes[..bytes.len() - 1];
        prop_assert!(decode(cut).is_err());
        prop_assert_eq!(decode_owner(cut), Ok(record.owner.clone()));
        prop_assert_eq!(decode(&bytes).unwrap(), record);
        // Decoding is the inverse of encoding on everything encode produces.
        prop_assert_eq!(encode(&decode(&bytes).unwrap()).unwrap(), bytes);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode(&bytes);
        let _ = decode_owner(&bytes);
        let _ = snapshot_version(&bytes);
    }

    #[test]
    fn corrupted_snapshots_never_panic(
        record in arb_record(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = encode(&record).unwrap();
        for (at, byte) in flips {
            let i = at.index(bytes.len());
            bytes[i] = byte;
        }
        let _ = decode(&bytes);
        let _ = decode_owner(&bytes);
        let len = cut.index(bytes.len() + 1);
        let _ = decode(&bytes[..len]);
        let _ = decode_owner(&bytes[..len]);
    }
}
