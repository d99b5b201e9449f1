//! The real-time part of the history check: per task, do the acknowledged operations fit one
//! linear history of the task's record?
//!
//! A task is an object of its own (operations on different tasks never constrain each other),
//! so the check runs per task and stays cheap. Its states form one chain ordered by
//! `lastUpdatedAt`: every change a client can see moves it forward by at least a millisecond,
//! across restarts and takeovers too (the state machine's rule), and two observations with the
//! same stamp must read the same (the main checker checks that, and that consecutive states
//! follow legal transitions). The server's own transitions are writes whose timing the client
//! never sees; what it does see are operations with a real-time interval, from the moment it
//! sent the request ([`OpSpan::invoked`]) to the moment the answer arrived
//! ([`OpSpan::completed`]), measured on the client's one monotonic clock whichever replica
//! answered.
//!
//! Such a history is linearizable (Herlihy and Wing's definition, the one Porcupine and
//! Knossos check) exactly when a linearization point can be chosen inside each interval,
//! consistent with the chain. For a chain of versions that reduces to two rules, each checked
//! in O(n log n) over a task's operations:
//!
//! - **No stale read** ([`Kind::StaleRead`]): a `tasks/get` (or the state a `tools/call`
//!   returned) invoked after another operation completed never returns an older state than
//!   that operation saw. Notifications count as witnesses only: a notification received at
//!   `t` proves its state was committed before `t`, so a read sent after `t` must return it
//!   or a newer one; a listen stream itself may lag (latest snapshot wins), so a late
//!   notification is not a stale read.
//! - **An acknowledged answer is visible** ([`Kind::UpdateNotVisible`]): once a
//!   `tasks/update` was acknowledged, no read sent afterwards shows one of its keys still
//!   waiting for input (input keys are never issued twice, so a key pending after its
//!   acknowledged answer means the answer was dropped — the `LostUpdate` of a stale actor).
//!
//! Operations without an answer (timeouts, transport errors, a dead incarnation) constrain
//! nothing: they may or may not have taken effect. Cancellation is cooperative and has no
//! visible state of its own before the task ends, so acknowledged cancels are checked against
//! the store by the main checker only.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use serde_json::Value;

use super::checker::{Kind, normalise, updated_ms};

/// When an operation was sent and answered (the client's monotonic clock), and the server
/// that answered (a replica's address; `None` in process).
#[derive(Debug, Clone)]
pub struct OpSpan {
    /// When the request was sent.
    pub invoked: Instant,
    /// When the answer arrived.
    pub completed: Instant,
    /// The replica that answered (`None` in process).
    pub replica: Option<String>,
}

impl OpSpan {
    /// A notification received now: it is its own witness, no interval.
    pub fn received(replica: Option<String>) -> Self {
        let now = Instant::now();
        Self {
            invoked: now,
            completed: now,
            replica,
        }
    }
}

/// What an acknowledged operation did or saw.
#[derive(Debug, Clone)]
pub enum Op {
    /// A state returned by `tools/call` (the new task) or `tasks/get`.
    Read(Value),
    /// A state pushed on a listen stream.
    Notified(Value),
    /// An acknowledged `tasks/update` answering these keys.
    Update(Vec<String>),
}

/// One task's operation.
pub struct TimedOp<'a> {
    /// The task's id.
    pub task: &'a str,
    /// When it was sent and answered, and by which replica.
    pub span: &'a OpSpan,
    /// What it did or saw.
    pub op: &'a Op,
}

struct Seen<'a> {
    span: &'a OpSpan,
    ms: u64,
    pending: BTreeSet<String>,
    object: Value,
    read: bool,
}

fn pending(obj: &Value) -> BTreeSet<String> {
    obj.get("inputRequests")
        .and_then(Value::as_object)
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

fn at(base: Instant, t: Instant) -> String {
    format!("+{:.1} ms", t.duration_since(base).as_secs_f64() * 1000.0)
}

fn on(span: &OpSpan) -> String {
    span.replica
        .as_deref()
        .map_or_else(String::new, |r| format!(" on {r}"))
}

/// Checks every task's timed operations; `v` receives each violation.
pub fn check(ops: &[TimedOp<'_>], v: &mut dyn FnMut(Kind, &str, String)) {
    let Some(base) = ops.iter().map(|o| o.span.invoked).min() else {
        return;
    };
    let mut by_task: BTreeMap<&str, Vec<&TimedOp<'_>>> = BTreeMap::new();
    for op in ops {
        by_task.entry(op.task).or_default().push(op);
    }
    for (task, ops) in by_task {
        let mut seen: Vec<Seen<'_>> = Vec::new();
        let mut updates: Vec<(&OpSpan, &[String])> = Vec::new();
        for op in ops {
            match op.op {
                Op::Read(obj) | Op::Notified(obj) => {
                    let Some(ms) = updated_ms(obj) else { continue };
                    seen.push(Seen {
                        span: op.span,
                        ms,
                        pending: pending(obj),
                        object: normalise(obj),
                        read: matches!(op.op, Op::Read(_)),
                    });
                }
                Op::Update(keys) => updates.push((op.span, keys)),
            }
        }
        // Witnesses by completion; for each prefix, the newest state it holds.
        let mut witnesses: Vec<&Seen<'_>> = seen.iter().collect();
        witnesses.sort_by_key(|s| s.span.completed);
        let mut newest: Vec<usize> = Vec::with_capacity(witnesses.len());
        for (i, w) in witnesses.iter().enumerate() {
            let best = match newest.last() {
                Some(&b) if witnesses[b].ms >= w.ms => b,
                _ => i,
            };
            newest.push(best);
        }
        updates.sort_by_key(|(span, _)| span.completed);
        for read in seen.iter().filter(|s| s.read) {
            let before = witnesses.partition_point(|w| w.span.completed < read.span.invoked);
            if before > 0 {
                let w = witnesses[newest[before - 1]];
                if w.ms > read.ms {
                    v(
                        Kind::StaleRead,
                        task,
                        format!(
                            "a read sent at {}{} returned lastUpdatedAt {} ({}), older than the state lastUpdatedAt {} ({}) that an operation completed at {}{} had already seen: {} after {}",
                            at(base, read.span.invoked),
                            on(read.span),
                            read.ms,
                            read.object["status"],
                            w.ms,
                            w.object["status"],
                            at(base, w.span.completed),
                            on(w.span),
                            read.object,
                            w.object
                        ),
                    );
                }
            }
            if read.pending.is_empty() {
                continue;
            }
            let acked = updates.partition_point(|(span, _)| span.completed < read.span.invoked);
            for (span, keys) in &updates[..acked] {
                if let Some(key) = keys.iter().find(|k| read.pending.contains(*k)) {
                    v(
                        Kind::UpdateNotVisible,
                        task,
                        format!(
                            "the answer for `{key}` was acknowledged at {}{}, yet a read sent at {}{} still shows `{key}` waiting for input: {}",
                            at(base, span.completed),
                            on(span),
                            at(base, read.span.invoked),
                            on(read.span),
                            read.object
                        ),
                    );
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;

    fn span(base: Instant, from: u64, to: u64) -> OpSpan {
        OpSpan {
            invoked: base + Duration::from_millis(from),
            completed: base + Duration::from_millis(to),
            replica: None,
        }
    }

    fn state(ms: u64, status: &str, keys: &[&str]) -> Value {
        let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
            .unwrap()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap();
        let requests: serde_json::Map<String, Value> =
            keys.iter().map(|k| ((*k).to_owned(), json!({}))).collect();
        let mut obj = json!({ "taskId": "t", "status": status, "lastUpdatedAt": t });
        if !keys.is_empty() {
            obj["inputRequests"] = Value::Object(requests);
        }
        obj
    }

    fn kinds(ops: &[(OpSpan, Op)]) -> Vec<Kind> {
        let timed: Vec<TimedOp<'_>> = ops
            .iter()
            .map(|(span, op)| TimedOp {
                task: "t",
                span,
                op,
            })
            .collect();
        let mut found = Vec::new();
        check(&timed, &mut |kind, _, _| found.push(kind));
        found
    }

    #[test]
    fn reads_that_overlap_may_see_either_state_but_a_later_read_never_an_older_one() {
        let b = Instant::now();
        // Two overlapping reads: either order is a linearization.
        let overlapping = [
            (span(b, 0, 10), Op::Read(state(2000, "completed", &[]))),
            (span(b, 5, 15), Op::Read(state(1000, "working", &[]))),
        ];
        assert!(kinds(&overlapping).is_empty());
        // The second read starts after the first answered: it must not go back.
        let sequential = [
            (span(b, 0, 10), Op::Read(state(2000, "completed", &[]))),
            (span(b, 11, 15), Op::Read(state(1000, "working", &[]))),
        ];
        assert_eq!(kinds(&sequential), [Kind::StaleRead]);
        // A notification received before the read was sent is a witness too.
        let notified = [
            (span(b, 3, 3), Op::Notified(state(2000, "completed", &[]))),
            (span(b, 4, 9), Op::Read(state(1000, "working", &[]))),
        ];
        assert_eq!(kinds(&notified), [Kind::StaleRead]);
        // A late notification on a lagging stream is not a read.
        let lagging = [
            (span(b, 0, 2), Op::Read(state(2000, "completed", &[]))),
            (span(b, 5, 5), Op::Notified(state(1000, "working", &[]))),
        ];
        assert!(kinds(&lagging).is_empty());
    }

    #[test]
    fn an_acknowledged_answer_is_visible_to_every_later_read() {
        let b = Instant::now();
        let waiting = state(1000, "input_required", &["k1"]);
        let ok = [
            (span(b, 0, 1), Op::Read(waiting.clone())),
            (span(b, 2, 8), Op::Update(vec!["k1".into()])),
            // Overlaps the update: may still see the key.
            (span(b, 3, 4), Op::Read(waiting.clone())),
            (span(b, 9, 10), Op::Read(state(1001, "working", &[]))),
        ];
        assert!(kinds(&ok).is_empty());
        let dropped = [
            (span(b, 0, 1), Op::Read(waiting.clone())),
            (span(b, 2, 8), Op::Update(vec!["k1".into()])),
            (span(b, 9, 10), Op::Read(waiting)),
        ];
        assert_eq!(kinds(&dropped), [Kind::UpdateNotVisible]);
    }

    #[test]
    fn tasks_are_checked_apart() {
        let b = Instant::now();
        let (s1, s2) = (span(b, 0, 1), span(b, 2, 3));
        let (newer, older) = (
            Op::Read(state(2000, "completed", &[])),
            Op::Read(state(1000, "working", &[])),
        );
        let timed = [
            TimedOp {
                task: "a",
                span: &s1,
                op: &newer,
            },
            TimedOp {
                task: "b",
                span: &s2,
                op: &older,
            },
        ];
        let mut found = Vec::new();
        check(&timed, &mut |kind, _, _| found.push(kind));
        assert!(found.is_empty());
    }
}
