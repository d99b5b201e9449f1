//! Unit tests of [`apply`] per event, and property tests that run random event sequences
//! against a small reference model and check the invariants of the state machine after every
//! step (ARCHITECTURE.md's invariants: monotonic sequence, terminal is final, input keys).

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::task::{MAX_HISTORY, MAX_HISTORY_MESSAGE, Owner, TaskId, Transition};

const T0: u64 = 1_767_225_600_000;

fn record(ttl_ms: Option<u64>) -> TaskRecord {
    TaskRecord::new(
        TaskId::from_bytes([7; 16]),
        Owner::new("t", "p"),
        "tool".into(),
        json!({ "x": 1 }),
        json!({ "elicitation": {} }),
        T0,
        ttl_ms,
        Some(1_000),
        Some("started".into()),
    )
}

fn elicit(key: &str) -> Value {
    json!({ "method": "elicitation/create", "params": { "message": key, "requestedSchema": {
        "type": "object", "properties": {} } } })
}

fn requests(keys: &[&str]) -> BTreeMap<String, Value> {
    keys.iter().map(|k| (k.to_string(), elicit(k))).collect()
}

fn responses(entries: &[(&str, Value)]) -> BTreeMap<String, Value> {
    entries
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

fn accept() -> Value {
    json!({ "action": "accept", "content": { "v": 1 } })
}

fn request_inputs(keys: &[&str]) -> Event {
    Event::RequestInputs {
        requests: requests(keys),
        status_message: None,
    }
}

/// Applies an event that must produce a new record, and checks the common bookkeeping.
fn step(r: &TaskRecord, event: Event, now: u64) -> TaskRecord {
    let next = apply(r, event.clone(), now)
        .unwrap_or_else(|e| panic!("{event:?} refused: {e}"))
        .unwrap_or_else(|| panic!("{event:?} changed nothing"));
    assert_eq!(next.seq, r.seq + 1);
    if matches!(event, Event::Restarted | Event::RestartRefunded) {
        assert_eq!(next.last_updated_at_ms, r.last_updated_at_ms);
    } else {
        assert_eq!(next.last_updated_at_ms, now.max(r.last_updated_at_ms + 1));
    }
    next
}

fn waiting(keys: &[&str]) -> TaskRecord {
    step(&record(None), request_inputs(keys), T0 + 10)
}

fn finished_records() -> Vec<TaskRecord> {
    let r = record(Some(100));
    vec![
        step(
            &r,
            Event::Finish(TaskOutcome::Result(json!({ "content": [] }))),
            T0 + 1,
        ),
        step(
            &r,
            Event::Finish(TaskOutcome::Error(TaskError {
                code: -1,
                message: "m".into(),
                data: None,
            })),
            T0 + 1,
        ),
        step(
            &r,
            Event::Cancelled {
                status_message: None,
            },
            T0 + 1,
        ),
        step(&r, Event::Expire, T0 + 100),
        step(&waiting(&["k"]), Event::RequestCancel, T0 + 20),
    ]
}

// ---- unit tests, one event at a time ----

#[test]
fn new_record_is_working_at_seq_1() {
    let r = record(None);
    assert_eq!(r.status, TaskStatus::Working);
    assert_eq!(r.seq, 1);
    assert_eq!(r.last_updated_at_ms, T0);
}

#[test]
fn status_message_sets_and_clears() {
    let r = record(None);
    let next = step(&r, Event::StatusMessage(Some("half way".into())), T0 + 5);
    assert_eq!(next.status_message.as_deref(), Some("half way"));
    assert_eq!(next.status, TaskStatus::Working);
    let cleared = step(&next, Event::StatusMessage(None), T0 + 6);
    assert_eq!(cleared.status_message, None);
    assert_eq!(
        apply(&cleared, Event::StatusMessage(None), T0 + 7),
        Ok(None)
    );
    assert_eq!(
        apply(&r, Event::StatusMessage(Some("started".into())), T0 + 7),
        Ok(None)
    );
}

#[test]
fn status_message_keeps_input_required() {
    let r = waiting(&["a"]);
    let next = step(
        &r,
        Event::StatusMessage(Some("still waiting".into())),
        T0 + 20,
    );
    assert_eq!(next.status, TaskStatus::InputRequired);
    assert_eq!(next.pending_inputs, r.pending_inputs);
}

#[test]
fn step_completed_is_journaled_once() {
    let r = record(None);
    let next = step(
        &r,
        Event::StepCompleted {
            name: "s".into(),
            value: json!(42),
        },
        T0 + 1,
    );
    assert_eq!(next.journal.get("s"), Some(&json!(42)));
    assert_eq!(
        apply(
            &next,
            Event::StepCompleted {
                name: "s".into(),
                value: json!(43)
            },
            T0 + 2
        ),
        Err(TransitionError::StepAlreadyRecorded("s".into()))
    );
    let waiting = step(&next, request_inputs(&["k"]), T0 + 3);
    let again = step(
        &waiting,
        Event::StepCompleted {
            name: "t".into(),
            value: json!(null),
        },
        T0,
    );
    assert_eq!(again.status, TaskStatus::InputRequired);
    assert_eq!(again.journal.len(), 2);
}

#[test]
fn a_step_records_the_attempt_it_committed_in() {
    let step_done = |r: &TaskRecord, name: &str| {
        step(
            r,
            Event::StepCompleted {
                name: name.into(),
                value: json!(name),
            },
            T0 + 1,
        )
    };
    let first = step_done(&record(None), "a");
    assert_eq!(first.step_attempts.get("a"), Some(&1));
    // Two runs lost to crashes before the next step committed: it may have run three times.
    let crashed = step(&step(&first, Event::Restarted, T0), Event::Restarted, T0);
    assert_eq!(crashed.attempts, 3);
    let second = step_done(&crashed, "b");
    assert_eq!(second.step_attempts.get("b"), Some(&3));
    assert_eq!(second.step_attempts.get("a"), Some(&1));
    // Progress starts the count again.
    assert_eq!(second.attempts, 1);
    assert_eq!(step_done(&second, "c").step_attempts.get("c"), Some(&1));
}

/// A takeover found to follow a pause, not a crash, gives its counted attempt back: one at a
/// time, never below the first run, as bookkeeping (no `lastUpdatedAt` change), and never on
/// a finished task.
#[test]
fn a_refunded_restart_gives_one_attempt_back() {
    let first = record(None);
    assert_eq!(first.attempts, 1);
    assert_eq!(apply(&first, Event::RestartRefunded, T0 + 5), Ok(None));
    let twice = step(&step(&first, Event::Restarted, T0), Event::Restarted, T0);
    assert_eq!(twice.attempts, 3);
    let refunded = step(&twice, Event::RestartRefunded, T0 + 5);
    assert_eq!(refunded.attempts, 2);
    assert_eq!(refunded.last_updated_at_ms, twice.last_updated_at_ms);
    let done = step(
        &refunded,
        Event::Finish(TaskOutcome::Result(json!({ "content": [] }))),
        T0 + 6,
    );
    assert_eq!(
        apply(&done, Event::RestartRefunded, T0 + 7),
        Err(TransitionError::Terminal("completed"))
    );
}

#[test]
fn request_inputs_waits_for_input() {
    let r = record(None);
    let next = step(
        &r,
        Event::RequestInputs {
            requests: requests(&["a", "b"]),
            status_message: Some("need input".into()),
        },
        T0 + 1,
    );
    assert_eq!(next.status, TaskStatus::InputRequired);
    assert_eq!(next.status_message.as_deref(), Some("need input"));
    assert_eq!(next.pending_inputs, requests(&["a", "b"]));
    assert_eq!(
        next.issued_keys,
        BTreeSet::from(["a".to_string(), "b".to_string()])
    );
    // Without a message the previous one stays.
    let more = step(&next, request_inputs(&["c"]), T0 + 2);
    assert_eq!(more.status_message.as_deref(), Some("need input"));
    assert_eq!(more.pending_inputs.len(), 3);
}

#[test]
fn request_inputs_refuses_empty_and_reissued_keys() {
    let r = record(None);
    assert_eq!(
        apply(&r, request_inputs(&[]), T0),
        Err(TransitionError::NoInputRequests)
    );
    let w = waiting(&["a"]);
    // Pending key.
    assert_eq!(
        apply(&w, request_inputs(&["b", "a"]), T0 + 20),
        Err(TransitionError::DuplicateInputKey("a".into()))
    );
    // Answered key.
    let answered = step(
        &w,
        Event::ProvideInputs {
            responses: responses(&[("a", accept())]),
        },
        T0,
    );
    assert_eq!(answered.status, TaskStatus::Working);
    assert_eq!(
        apply(&answered, request_inputs(&["a"]), T0 + 30),
        Err(TransitionError::DuplicateInputKey("a".into()))
    );
}

#[test]
fn full_answer_resumes_work() {
    let w = waiting(&["a", "b"]);
    let next = step(
        &w,
        Event::ProvideInputs {
            responses: responses(&[("a", accept()), ("b", json!({ "action": "decline" }))]),
        },
        T0 + 20,
    );
    assert_eq!(next.status, TaskStatus::Working);
    assert!(next.pending_inputs.is_empty());
    assert_eq!(next.answers.keys().collect::<Vec<_>>(), ["a", "b"]);
}

#[test]
fn partial_answer_keeps_input_required() {
    let w = waiting(&["a", "b"]);
    let next = step(
        &w,
        Event::ProvideInputs {
            responses: responses(&[("b", accept())]),
        },
        T0,
    );
    assert_eq!(next.status, TaskStatus::InputRequired);
    assert_eq!(next.pending_inputs.keys().collect::<Vec<_>>(), ["a"]);
    assert_eq!(next.answers.get("b"), Some(&accept()));
    // Answering the answered key again is ignored.
    assert_eq!(
        apply(
            &next,
            Event::ProvideInputs {
                responses: responses(&[("b", json!({ "action": "decline" }))])
            },
            T0
        ),
        Ok(None)
    );
}

#[test]
fn unknown_and_answered_keys_are_ignored() {
    let w = waiting(&["a"]);
    // Unknown keys are ignored even when their value is not an InputResponse object.
    let only_unknown = responses(&[("unknown-key", json!({ "ignored": true })), ("z", json!(3))]);
    assert_eq!(
        apply(
            &w,
            Event::ProvideInputs {
                responses: only_unknown
            },
            T0
        ),
        Ok(None)
    );
    assert_eq!(
        apply(
            &w,
            Event::ProvideInputs {
                responses: BTreeMap::new()
            },
            T0
        ),
        Ok(None)
    );
    let mixed = responses(&[("a", accept()), ("zz", json!("not an object"))]);
    let next = step(&w, Event::ProvideInputs { responses: mixed }, T0 + 11);
    assert_eq!(next.status, TaskStatus::Working);
    assert!(!next.answers.contains_key("zz"));
    // A working task without pending inputs ignores answers.
    assert_eq!(
        apply(
            &record(None),
            Event::ProvideInputs {
                responses: responses(&[("a", accept())])
            },
            T0
        ),
        Ok(None)
    );
}

#[test]
fn non_object_answer_for_a_pending_key_is_refused() {
    let w = waiting(&["a", "b"]);
    for bad in [json!("x"), json!(1), json!(null), json!([]), json!(true)] {
        assert_eq!(
            apply(
                &w,
                Event::ProvideInputs {
                    responses: responses(&[("a", accept()), ("b", bad)])
                },
                T0
            ),
            Err(TransitionError::InvalidInputResponse {
                key: "b".into(),
                reason: "must be a JSON object".into()
            })
        );
    }
}

#[test]
fn cancel_while_working_flags_once() {
    let r = record(None);
    let next = step(&r, Event::RequestCancel, T0 + 1);
    assert!(next.cancel_requested);
    assert_eq!(next.status, TaskStatus::Working);
    assert_eq!(apply(&next, Event::RequestCancel, T0 + 2), Ok(None));
    let done = step(
        &next,
        Event::Cancelled {
            status_message: None,
        },
        T0 + 3,
    );
    assert_eq!(done.status, TaskStatus::Cancelled);
    assert_eq!(done.status_message.as_deref(), Some("Cancelled."));
}

#[test]
fn cancel_while_waiting_for_input_cancels_at_once() {
    let w = waiting(&["a", "b"]);
    let next = step(&w, Event::RequestCancel, T0 + 20);
    assert_eq!(next.status, TaskStatus::Cancelled);
    assert!(next.cancel_requested);
    assert!(next.pending_inputs.is_empty());
    assert_eq!(next.issued_keys, w.issued_keys);
    assert_eq!(
        next.status_message.as_deref(),
        Some("Cancelled while waiting for input.")
    );
}

#[test]
fn cancel_requested_before_input_request_still_cancels_the_wait() {
    let flagged = step(&record(None), Event::RequestCancel, T0 + 1);
    let w = step(&flagged, request_inputs(&["a"]), T0 + 2);
    assert_eq!(w.status, TaskStatus::InputRequired);
    let next = step(&w, Event::RequestCancel, T0 + 3);
    assert_eq!(next.status, TaskStatus::Cancelled);
}

#[test]
fn finish_with_result_completes() {
    let w = waiting(&["a"]);
    let result = json!({ "content": [{ "type": "text", "text": "hi" }], "isError": true });
    let next = step(
        &w,
        Event::Finish(TaskOutcome::Result(result.clone())),
        T0 + 30,
    );
    assert_eq!(next.status, TaskStatus::Completed);
    assert_eq!(next.outcome, Some(TaskOutcome::Result(result)));
    assert!(next.pending_inputs.is_empty());
}

#[test]
fn finish_with_error_fails() {
    let error = TaskError {
        code: -32603,
        message: "boom".into(),
        data: Some(json!({ "a": 1 })),
    };
    let next = step(
        &record(None),
        Event::Finish(TaskOutcome::Error(error.clone())),
        T0 + 30,
    );
    assert_eq!(next.status, TaskStatus::Failed);
    assert_eq!(next.status_message.as_deref(), Some("boom"));
    assert_eq!(next.outcome, Some(TaskOutcome::Error(error)));
}

#[test]
fn cancelled_keeps_a_given_message() {
    let next = step(
        &waiting(&["a"]),
        Event::Cancelled {
            status_message: Some("stopped by tool".into()),
        },
        T0 + 30,
    );
    assert_eq!(next.status, TaskStatus::Cancelled);
    assert_eq!(next.status_message.as_deref(), Some("stopped by tool"));
    assert!(next.pending_inputs.is_empty());
    assert_eq!(next.outcome, None);
}

#[test]
fn expire_only_after_the_ttl() {
    let r = record(Some(1_000));
    assert_eq!(
        apply(&r, Event::Expire, T0),
        Err(TransitionError::NotExpired)
    );
    assert_eq!(
        apply(&r, Event::Expire, T0 + 999),
        Err(TransitionError::NotExpired)
    );
    assert_eq!(
        apply(&r, Event::Expire, 0),
        Err(TransitionError::NotExpired)
    );
    let next = step(&r, Event::Expire, T0 + 1_000);
    assert_eq!(next.status, TaskStatus::Failed);
    assert!(matches!(next.outcome, Some(TaskOutcome::Error(_))));
    assert_eq!(
        apply(&record(None), Event::Expire, u64::MAX),
        Err(TransitionError::NotExpired)
    );
    // A TTL past the end of the clock expires only at its end.
    let huge = TaskRecord {
        ttl_ms: Some(u64::MAX),
        ..record(None)
    };
    assert_eq!(
        apply(&huge, Event::Expire, u64::MAX - 1),
        Err(TransitionError::NotExpired)
    );
}

#[test]
fn expire_while_waiting_drops_pending_inputs() {
    let w = step(&record(Some(50)), request_inputs(&["a"]), T0 + 1);
    let next = step(&w, Event::Expire, T0 + 60);
    assert_eq!(next.status, TaskStatus::Failed);
    assert!(next.pending_inputs.is_empty());
    assert!(next.issued_keys.contains("a"));
}

#[test]
fn terminal_records_never_change() {
    for done in finished_records() {
        assert!(done.status.is_terminal());
        let events = [
            Event::StatusMessage(Some("late".into())),
            Event::StepCompleted {
                name: "late".into(),
                value: json!(1),
            },
            request_inputs(&["late"]),
            Event::ProvideInputs {
                responses: responses(&[("k", accept()), ("x", json!(1))]),
            },
            Event::RequestCancel,
            Event::Finish(TaskOutcome::Result(json!({}))),
            Event::Cancelled {
                status_message: None,
            },
            Event::Expire,
        ];
        for event in events {
            match apply(&done, event.clone(), u64::MAX) {
                Ok(None) => {
                    assert!(matches!(
                        event,
                        Event::ProvideInputs { .. } | Event::RequestCancel
                    ))
                }
                Err(TransitionError::Terminal(s)) => assert_eq!(s, done.status.as_str()),
                other => panic!(
                    "{event:?} on a {} task gave {other:?}",
                    done.status.as_str()
                ),
            }
        }
    }
}

/// `lastUpdatedAt` orders a task's states (the wire has no sequence number): every change a
/// client can see is strictly later than the record it replaces, also when two changes fall
/// in one millisecond and when the writing node's clock is behind the node that wrote the
/// record before (a task taken over by another replica).
#[test]
fn last_updated_at_is_later_after_every_visible_change() {
    let r = step(
        &record(None),
        Event::StatusMessage(Some("a".into())),
        T0 + 100,
    );
    assert_eq!(r.last_updated_at_ms, T0 + 100);
    // The same millisecond.
    let same = step(&r, Event::StatusMessage(Some("b".into())), T0 + 100);
    assert_eq!(same.last_updated_at_ms, T0 + 101);
    // A clock behind the record.
    let behind = step(&same, Event::StatusMessage(Some("c".into())), T0 + 50);
    assert_eq!(behind.last_updated_at_ms, T0 + 102);
    // A clock ahead of it: the clock's time.
    let ahead = step(&behind, Event::StatusMessage(None), T0 + 500);
    assert_eq!(ahead.last_updated_at_ms, T0 + 500);
    // A restart is not a change a client sees: the time stays.
    let restarted = apply(&ahead, Event::Restarted, T0 + 900).unwrap().unwrap();
    assert_eq!(restarted.last_updated_at_ms, T0 + 500);
}

// ---- the transition history ----

fn entry(at_ms: u64, status: TaskStatus, message: Option<&str>) -> Transition {
    Transition::new(at_ms, status, message)
}

/// The timeline of a task that asks for approval, gets it and finishes: one entry per change
/// of status, at the record's new `lastUpdatedAt`, with the message it set.
#[test]
fn history_follows_the_status_changes() {
    let r = record(None);
    assert_eq!(r.history, [entry(T0, TaskStatus::Working, Some("started"))]);
    let asking = step(
        &r,
        Event::RequestInputs {
            requests: requests(&["plan"]),
            status_message: Some("Approve the plan?".into()),
        },
        T0 + 2_000,
    );
    let reminded = step(
        &asking,
        Event::StatusMessage(Some("Still waiting for approval.".into())),
        T0 + 60_000,
    );
    // The answer comes through a node whose clock is behind: the entry is at the record's
    // time (one millisecond after the reminder), not at the clock's.
    let approved = step(
        &reminded,
        Event::ProvideInputs {
            responses: responses(&[("plan", accept())]),
        },
        T0 + 59_000,
    );
    let stepped = step(
        &approved,
        Event::StepCompleted {
            name: "apply".into(),
            value: json!(true),
        },
        T0 + 129_000,
    );
    let done = step(
        &stepped,
        Event::Finish(TaskOutcome::Result(json!({ "content": [] }))),
        T0 + 130_000,
    );
    assert_eq!(
        done.history,
        [
            entry(T0, TaskStatus::Working, Some("started")),
            entry(
                T0 + 2_000,
                TaskStatus::InputRequired,
                Some("Approve the plan?")
            ),
            // Working again with the message the task had then.
            entry(
                T0 + 60_001,
                TaskStatus::Working,
                Some("Still waiting for approval.")
            ),
            entry(T0 + 130_000, TaskStatus::Completed, None),
        ]
    );
    assert_eq!(
        approved.history.last().unwrap().at_ms,
        approved.last_updated_at_ms
    );
    // The reminder (a message alone) and the step added nothing.
    assert_eq!(asking.history.len(), 2);
    assert_eq!(reminded.history, asking.history);
    assert_eq!(stepped.history, approved.history);
}

/// Each way a task ends is one entry, with the final message.
#[test]
fn history_ends_with_how_the_task_ended() {
    let last = |r: &TaskRecord| r.history.last().cloned().unwrap();
    let [completed, failed, cancelled, expired, cancelled_waiting] =
        <[TaskRecord; 5]>::try_from(finished_records()).unwrap();
    assert_eq!(last(&completed), entry(T0 + 1, TaskStatus::Completed, None));
    assert_eq!(last(&failed), entry(T0 + 1, TaskStatus::Failed, Some("m")));
    assert_eq!(
        last(&cancelled),
        entry(T0 + 1, TaskStatus::Cancelled, Some("Cancelled."))
    );
    assert_eq!(
        last(&expired),
        entry(T0 + 100, TaskStatus::Failed, Some("Task has expired."))
    );
    assert_eq!(
        cancelled_waiting.history,
        [
            entry(T0, TaskStatus::Working, Some("started")),
            entry(T0 + 10, TaskStatus::InputRequired, Some("started")),
            entry(
                T0 + 20,
                TaskStatus::Cancelled,
                Some("Cancelled while waiting for input.")
            ),
        ]
    );
}

/// Changes that keep the status (a message, a step, a cancellation flag, more input requests,
/// a partial answer, restarts) add nothing, and neither do events that change nothing.
#[test]
fn only_status_changes_enter_the_history() {
    let r = record(Some(1_000_000));
    let created = r.history.clone();
    let mut current = r;
    for (event, now) in [
        (Event::StatusMessage(Some("half way".into())), T0 + 1),
        (Event::StatusMessage(None), T0 + 2),
        (
            Event::StepCompleted {
                name: "s".into(),
                value: json!(1),
            },
            T0 + 3,
        ),
        (Event::Restarted, T0 + 4),
        (Event::Restarted, T0 + 5),
        (Event::RestartRefunded, T0 + 6),
        (Event::RequestCancel, T0 + 7),
    ] {
        current = step(&current, event, now);
        assert_eq!(current.history, created);
    }
    let waiting = step(&current, request_inputs(&["a", "b"]), T0 + 10);
    assert_eq!(waiting.history.len(), 2);
    let mut current = waiting.clone();
    for (event, now) in [
        (request_inputs(&["c"]), T0 + 11),
        (Event::StatusMessage(Some("still".into())), T0 + 12),
        (
            Event::ProvideInputs {
                responses: responses(&[("a", accept())]),
            },
            T0 + 13,
        ),
    ] {
        current = step(&current, event, now);
        assert_eq!(current.status, TaskStatus::InputRequired);
        assert_eq!(current.history, waiting.history);
    }
    // Events that change nothing leave the record, history included, as it was.
    for event in [
        Event::StatusMessage(Some("still".into())),
        Event::ProvideInputs {
            responses: responses(&[("a", accept()), ("unknown", accept())]),
        },
        Event::RestartRefunded,
    ] {
        assert_eq!(apply(&current, event, T0 + 14), Ok(None));
    }
}

/// A finished task's history is final: the events it accepts are no-ops.
#[test]
fn terminal_no_ops_add_nothing_to_the_history() {
    for done in finished_records() {
        for event in [
            Event::RequestCancel,
            Event::ProvideInputs {
                responses: responses(&[("k", accept())]),
            },
        ] {
            assert_eq!(apply(&done, event, u64::MAX), Ok(None));
        }
        for event in [
            Event::StatusMessage(Some("late".into())),
            Event::Finish(TaskOutcome::Result(json!({}))),
            Event::Restarted,
        ] {
            assert!(apply(&done, event, u64::MAX).is_err());
        }
    }
}

/// Past [`MAX_HISTORY`] entries the oldest after the creation goes: the creation and the
/// latest changes stay, in order.
#[test]
fn history_keeps_the_creation_and_the_latest_changes() {
    let mut current = record(None);
    let mut everything = current.history.clone();
    for round in 0..40u64 {
        let key = format!("k{round}");
        current = step(
            &current,
            Event::RequestInputs {
                requests: requests(&[key.as_str()]),
                status_message: Some(format!("question {round}")),
            },
            T0 + 10 * round + 1,
        );
        everything.push(current.history.last().unwrap().clone());
        current = step(
            &current,
            Event::ProvideInputs {
                responses: responses(&[(key.as_str(), accept())]),
            },
            T0 + 10 * round + 2,
        );
        everything.push(current.history.last().unwrap().clone());
        assert!(current.history.len() <= MAX_HISTORY);
    }
    assert_eq!(everything.len(), 81);
    assert_eq!(current.history.len(), MAX_HISTORY);
    assert_eq!(
        current.history[0],
        entry(T0, TaskStatus::Working, Some("started"))
    );
    assert_eq!(
        current.history[1..],
        everything[everything.len() - (MAX_HISTORY - 1)..]
    );
    let done = step(
        &current,
        Event::Finish(TaskOutcome::Result(json!({}))),
        T0 + 1_000,
    );
    assert_eq!(done.history.len(), MAX_HISTORY);
    assert_eq!(done.history[0], current.history[0]);
    assert_eq!(done.history[1..MAX_HISTORY - 1], current.history[2..]);
    assert_eq!(
        done.history.last(),
        Some(&entry(T0 + 1_000, TaskStatus::Completed, None))
    );
}

/// A long message is cut in the history at a char boundary; the record keeps all of it.
#[test]
fn long_messages_are_cut_in_the_history_only() {
    assert_eq!(MAX_HISTORY_MESSAGE, 240);
    let cut = |m: &str| {
        Transition::new(0, TaskStatus::Working, Some(m))
            .message
            .unwrap()
    };
    assert_eq!(cut(&"a".repeat(240)), "a".repeat(240));
    assert_eq!(cut(&"a".repeat(241)), "a".repeat(240));
    assert_eq!(cut("short ✓"), "short ✓");
    assert_eq!(cut(""), "");
    // 'é' is two bytes: 240 falls on a boundary.
    assert_eq!(cut(&"é".repeat(121)), "é".repeat(120));
    // '€' is three bytes after one ASCII byte: boundaries at 238 and 241, so 238.
    let euros = format!("a{}", "€".repeat(100));
    assert_eq!(cut(&euros), format!("a{}", "€".repeat(79)));
    assert_eq!(cut(&euros).len(), 238);
    // A four-byte char across the limit.
    let emoji = format!("{}{}", "b".repeat(238), "🦀🦀");
    assert_eq!(cut(&emoji), "b".repeat(238));

    let long = format!("Approve the plan? {}", "ü".repeat(300));
    let r = TaskRecord::new(
        TaskId::from_bytes([7; 16]),
        Owner::new("t", "p"),
        "tool".into(),
        json!({}),
        json!({}),
        T0,
        None,
        None,
        Some(long.clone()),
    );
    assert_eq!(r.status_message.as_deref(), Some(long.as_str()));
    let created = r.history[0].message.as_deref().unwrap();
    assert!(created.len() <= MAX_HISTORY_MESSAGE && long.starts_with(created));
    let asking = step(
        &r,
        Event::RequestInputs {
            requests: requests(&["a"]),
            status_message: Some(long.clone()),
        },
        T0 + 1,
    );
    assert_eq!(asking.status_message.as_deref(), Some(long.as_str()));
    let message = asking.history[1].message.as_deref().unwrap();
    assert_eq!(message.len(), 240);
    assert!(long.starts_with(message));
}

#[test]
fn errors_name_the_problem() {
    assert!(
        TransitionError::DuplicateInputKey("k".into())
            .to_string()
            .contains("`k`")
    );
    assert!(
        TransitionError::Terminal("completed")
            .to_string()
            .contains("completed")
    );
}

// ---- property tests against a reference model ----

const KEYS: [&str; 5] = ["a", "b", "c", "d", "e"];
const STEPS: [&str; 3] = ["s1", "s2", "s3"];
const MESSAGES: [&str; 2] = ["x", "y"];

/// What the model expects `apply` to return.
#[derive(Debug, PartialEq)]
enum Expect {
    Changed,
    Unchanged,
    Refused(TransitionError),
}

/// A reference model of the task state machine, written from the rules rather than from
/// the code: only the parts the tests compare.
#[derive(Debug, Clone)]
struct Model {
    status: TaskStatus,
    status_message: Option<String>,
    pending: BTreeMap<String, Value>,
    issued: BTreeSet<String>,
    answers: BTreeMap<String, Value>,
    journal: BTreeMap<String, Value>,
    step_attempts: BTreeMap<String, u32>,
    cancel_requested: bool,
    expires_at: Option<u64>,
    has_outcome: bool,
    attempts: u32,
}

impl Model {
    fn of(r: &TaskRecord) -> Self {
        Self {
            status: r.status,
            status_message: r.status_message.clone(),
            pending: r.pending_inputs.clone(),
            issued: r.issued_keys.clone(),
            answers: r.answers.clone(),
            journal: r.journal.clone(),
            step_attempts: r.step_attempts.clone(),
            cancel_requested: r.cancel_requested,
            expires_at: r.ttl_ms.map(|t| r.created_at_ms.saturating_add(t)),
            has_outcome: r.outcome.is_some(),
            attempts: r.attempts,
        }
    }

    fn end(&mut self, status: TaskStatus, message: Option<String>, outcome: bool) {
        self.status = status;
        self.status_message = message;
        self.pending.clear();
        self.has_outcome = outcome;
    }

    /// Applies `event` to the model, returning what `apply` must answer.
    fn step(&mut self, event: &Event, now: u64) -> Expect {
        use Expect::*;
        if self.status.is_terminal() {
            return match event {
                Event::ProvideInputs { .. } | Event::RequestCancel => Unchanged,
                _ => Refused(TransitionError::Terminal(self.status.as_str())),
            };
        }
        match event {
            Event::StatusMessage(m) => {
                if *m == self.status_message {
                    return Unchanged;
                }
                self.status_message = m.clone();
            }
            Event::StepCompleted { name, value } => {
                if self.journal.contains_key(name) {
                    return Refused(TransitionError::StepAlreadyRecorded(name.clone()));
                }
                self.journal.insert(name.clone(), value.clone());
                // The step committed in the run that was current.
                self.step_attempts.insert(name.clone(), self.attempts);
            }
            Event::RequestInputs {
                requests,
                status_message,
            } => {
                if requests.is_empty() {
                    return Refused(TransitionError::NoInputRequests);
                }
                if let Some(k) = requests.keys().find(|k| self.issued.contains(*k)) {
                    return Refused(TransitionError::DuplicateInputKey(k.clone()));
                }
                self.issued.extend(requests.keys().cloned());
                self.pending.extend(requests.clone());
                self.status = TaskStatus::InputRequired;
                if status_message.is_some() {
                    self.status_message = status_message.clone();
                }
            }
            Event::ProvideInputs { responses } => {
                let relevant: Vec<(&String, &Value)> = responses
                    .iter()
                    .filter(|(k, _)| self.pending.contains_key(*k))
                    .collect();
                if let Some((k, _)) = relevant.iter().find(|(_, v)| !v.is_object()) {
                    return Refused(TransitionError::InvalidInputResponse {
                        key: (*k).clone(),
                        reason: "must be a JSON object".into(),
                    });
                }
                if relevant.is_empty() {
                    return Unchanged;
                }
                for (k, v) in relevant {
                    self.pending.remove(k);
                    self.answers.insert(k.clone(), v.clone());
                }
                if self.pending.is_empty() {
                    self.status = TaskStatus::Working;
                }
            }
            Event::RequestCancel => match self.status {
                TaskStatus::InputRequired => {
                    self.cancel_requested = true;
                    self.end(
                        TaskStatus::Cancelled,
                        Some("Cancelled while waiting for input.".into()),
                        false,
                    );
                }
                _ if self.cancel_requested => return Unchanged,
                _ => self.cancel_requested = true,
            },
            Event::Finish(TaskOutcome::Result(_)) => {
                // A completed task keeps no status message of an earlier state.
                self.end(TaskStatus::Completed, None, true);
            }
            Event::Finish(TaskOutcome::Error(e)) => {
                self.end(TaskStatus::Failed, Some(e.message.clone()), true)
            }
            Event::Cancelled { status_message } => {
                let message = status_message
                    .clone()
                    .unwrap_or_else(|| "Cancelled.".into());
                self.end(TaskStatus::Cancelled, Some(message), false);
            }
            Event::Expire => {
                if self.expires_at.is_none_or(|at| now < at) {
                    return Refused(TransitionError::NotExpired);
                }
                self.end(TaskStatus::Failed, Some("Task has expired.".into()), true);
            }
            Event::Restarted => self.attempts += 1,
            Event::RestartRefunded => {
                if self.attempts <= 1 {
                    return Unchanged;
                }
                self.attempts -= 1;
            }
        }
        if matches!(
            event,
            Event::StepCompleted { .. } | Event::RequestInputs { .. }
        ) {
            self.attempts = 1;
        }
        Changed
    }

    fn check(&self, r: &TaskRecord) -> Result<(), TestCaseError> {
        prop_assert_eq!(r.status, self.status);
        prop_assert_eq!(&r.status_message, &self.status_message);
        prop_assert_eq!(&r.pending_inputs, &self.pending);
        prop_assert_eq!(&r.issued_keys, &self.issued);
        prop_assert_eq!(&r.answers, &self.answers);
        prop_assert_eq!(&r.journal, &self.journal);
        prop_assert_eq!(&r.step_attempts, &self.step_attempts);
        prop_assert_eq!(r.cancel_requested, self.cancel_requested);
        prop_assert_eq!(r.outcome.is_some(), self.has_outcome);
        prop_assert_eq!(r.attempts, self.attempts);
        Ok(())
    }
}

fn arb_key() -> impl Strategy<Value = String> {
    prop::sample::select(&KEYS[..]).prop_map(String::from)
}

fn arb_message() -> impl Strategy<Value = Option<String>> {
    prop::option::of(prop::sample::select(&MESSAGES[..]).prop_map(String::from))
}

fn arb_response() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => Just(accept()),
        2 => Just(json!({ "action": "decline" })),
        1 => Just(json!("text")),
        1 => Just(json!(7)),
        1 => Just(Value::Null),
        1 => Just(json!([accept()])),
    ]
}

fn arb_event() -> impl Strategy<Value = Event> {
    prop_oneof![
        3 => arb_message().prop_map(Event::StatusMessage),
        3 => (prop::sample::select(&STEPS[..]), any::<u8>())
            .prop_map(|(name, v)| Event::StepCompleted { name: name.into(), value: json!(v) }),
        4 => (prop::collection::btree_set(arb_key(), 0..3), arb_message()).prop_map(
            |(keys, status_message)| Event::RequestInputs {
                requests: keys.into_iter().map(|k| { let v = elicit(&k); (k, v) }).collect(),
                status_message,
            }
        ),
        6 => prop::collection::btree_map(
                prop_oneof![4 => arb_key(), 1 => Just("unknown".to_string())],
                arb_response(),
                0..4,
            ).prop_map(|responses| Event::ProvideInputs { responses }),
        2 => Just(Event::RequestCancel),
        1 => prop_oneof![
            any::<u8>().prop_map(|n| TaskOutcome::Result(json!({ "content": [], "n": n }))),
            (any::<i64>(), prop::sample::select(&MESSAGES[..]), prop::option::of(any::<u8>()))
                .prop_map(|(code, message, data)| TaskOutcome::Error(TaskError {
                    code,
                    message: message.into(),
                    data: data.map(|d| json!(d)),
                })),
        ].prop_map(Event::Finish),
        1 => arb_message().prop_map(|status_message| Event::Cancelled { status_message }),
        2 => Just(Event::Expire),
        1 => Just(Event::Restarted),
        1 => Just(Event::RestartRefunded),
    ]
}

fn arb_start() -> impl Strategy<Value = TaskRecord> {
    prop::option::of(prop_oneof![
        Just(0u64),
        Just(5_000),
        Just(50_000),
        Just(u64::MAX)
    ])
    .prop_map(record)
}

/// Times around creation, not monotone (clocks of different instances disagree).
fn arb_now() -> impl Strategy<Value = u64> {
    (0u64..70_000).prop_map(|offset| T0 - 10_000 + offset)
}

fn run_sequence(start: TaskRecord, events: Vec<(Event, u64)>) -> Result<(), TestCaseError> {
    let mut current = start;
    let mut model = Model::of(&current);
    for (event, now) in events {
        let before = current.clone();
        let expected = model.clone().step(&event, now);
        let got = apply(&current, event.clone(), now);
        match (&got, &expected) {
            (Ok(Some(_)), Expect::Changed) | (Ok(None), Expect::Unchanged) => {}
            (Err(e), Expect::Refused(want)) => prop_assert_eq!(e, want),
            _ => prop_assert!(
                false,
                "{:?} at {} on {:?}: got {:?}, model expects {:?}",
                event,
                now,
                before.status,
                got,
                expected
            ),
        }
        if before.status.is_terminal() {
            prop_assert!(
                !matches!(got, Ok(Some(_))),
                "a terminal task changed on {:?}",
                event
            );
        }
        if let Ok(Some(next)) = got {
            model.step(&event, now);
            // Sequence numbers grow by exactly one.
            prop_assert_eq!(next.seq, before.seq + 1);
            // Only legal transitions.
            prop_assert!(before.status.may_become(next.status));
            if matches!(event, Event::Restarted | Event::RestartRefunded) {
                // A restart is bookkeeping: not an update a client sees.
                prop_assert_eq!(next.last_updated_at_ms, before.last_updated_at_ms);
            } else {
                // Every change a client sees is later than the one before, whatever the clock.
                prop_assert!(next.last_updated_at_ms > before.last_updated_at_ms);
                prop_assert_eq!(
                    next.last_updated_at_ms,
                    now.max(before.last_updated_at_ms + 1)
                );
            }
            // Identity and creation data never change.
            prop_assert_eq!(&next.id, &before.id);
            prop_assert_eq!(&next.owner, &before.owner);
            prop_assert_eq!(&next.tool, &before.tool);
            prop_assert_eq!(&next.arguments, &before.arguments);
            prop_assert_eq!(next.created_at_ms, before.created_at_ms);
            prop_assert_eq!(next.ttl_ms, before.ttl_ms);
            // Issued keys, answers and the journal only grow; recorded values never change.
            prop_assert!(next.issued_keys.is_superset(&before.issued_keys));
            for (k, v) in &before.answers {
                prop_assert_eq!(next.answers.get(k), Some(v));
            }
            for (k, v) in &before.journal {
                prop_assert_eq!(next.journal.get(k), Some(v));
            }
            // A cancellation request is never withdrawn.
            prop_assert!(next.cancel_requested || !before.cancel_requested);
            // The history grows by one entry exactly when the status changes: the new status
            // at the new time with the new message; past the bound the oldest one after the
            // creation goes.
            if next.status == before.status {
                prop_assert_eq!(&next.history, &before.history);
            } else {
                let mut expected = before.history.clone();
                expected.push(Transition::new(
                    next.last_updated_at_ms,
                    next.status,
                    next.status_message.as_deref(),
                ));
                if expected.len() > MAX_HISTORY {
                    expected.remove(1);
                }
                prop_assert_eq!(&next.history, &expected);
            }
            // Newly pending keys are fresh; answered keys left pending for answers.
            for k in next.pending_inputs.keys() {
                prop_assert!(
                    before.pending_inputs.contains_key(k) || !before.issued_keys.contains(k),
                    "key {} was re-issued",
                    k
                );
            }
            for k in next
                .answers
                .keys()
                .filter(|k| !before.answers.contains_key(*k))
            {
                prop_assert!(before.pending_inputs.contains_key(k));
                prop_assert!(!next.pending_inputs.contains_key(k));
            }
            current = next;
        } else {
            // Err and None leave the record as it was (the caller keeps `before`).
            prop_assert_eq!(&current, &before);
        }
        // Structural invariants of every record.
        let keys: BTreeSet<&String> = current.pending_inputs.keys().collect();
        prop_assert!(keys.iter().all(|k| current.issued_keys.contains(*k)));
        prop_assert!(
            current
                .answers
                .keys()
                .all(|k| current.issued_keys.contains(k))
        );
        prop_assert!(current.answers.keys().all(|k| !keys.contains(k)));
        if current.status.is_terminal() {
            prop_assert!(current.pending_inputs.is_empty());
        } else {
            prop_assert_eq!(
                current.status == TaskStatus::InputRequired,
                !current.pending_inputs.is_empty()
            );
            prop_assert!(current.outcome.is_none());
        }
        match current.status {
            TaskStatus::Completed => {
                prop_assert!(matches!(current.outcome, Some(TaskOutcome::Result(_))))
            }
            TaskStatus::Failed => {
                prop_assert!(matches!(current.outcome, Some(TaskOutcome::Error(_))))
            }
            _ => prop_assert!(current.outcome.is_none()),
        }
        // The history: bounded, starting with the creation, times non-decreasing, ending
        // with the record's status.
        prop_assert!(current.history.len() <= MAX_HISTORY);
        prop_assert_eq!(
            current.history.first(),
            Some(&Transition::new(
                current.created_at_ms,
                TaskStatus::Working,
                Some("started")
            ))
        );
        prop_assert!(current.history.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
        prop_assert_eq!(
            current.history.last().map(|t| t.status),
            Some(current.status)
        );
        prop_assert!(current.history.last().unwrap().at_ms <= current.last_updated_at_ms);
        model.check(&current)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_event_sequences_follow_the_model(
        start in arb_start(),
        events in prop::collection::vec((arb_event(), arb_now()), 0..40),
    ) {
        run_sequence(start, events)?;
    }

    /// Mostly input traffic, so long input_required phases with partial answers happen.
    #[test]
    fn input_heavy_sequences_follow_the_model(
        start in arb_start(),
        events in prop::collection::vec(
            (
                prop_oneof![
                    3 => arb_event(),
                    3 => (prop::collection::btree_set(arb_key(), 1..3)).prop_map(|keys| {
                        Event::RequestInputs {
                            requests: keys.into_iter().map(|k| { let v = elicit(&k); (k, v) }).collect(),
                            status_message: None,
                        }
                    }),
                    4 => prop::collection::btree_map(arb_key(), Just(accept()), 1..2)
                        .prop_map(|responses| Event::ProvideInputs { responses }),
                ],
                arb_now(),
            ),
            0..60,
        ),
    ) {
        run_sequence(start, events)?;
    }

    /// Once terminal, nothing changes the record any more, whatever comes next.
    #[test]
    fn terminal_is_final(
        which in 0usize..5,
        events in prop::collection::vec((arb_event(), any::<u64>()), 1..30),
    ) {
        let done = finished_records().swap_remove(which);
        for (event, now) in events {
            let got = apply(&done, event.clone(), now);
            prop_assert!(!matches!(got, Ok(Some(_))), "{:?} changed a terminal task", event);
        }
    }
}
