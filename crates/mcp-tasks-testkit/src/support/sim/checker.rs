//! The history of a simulation and the one checker every simulation runs.
//!
//! A history is what a client did and saw, tagged with the *incarnation* (server run) it was
//! sent in, plus the durable store as found after each crash ([`Ev::Durable`]) and the log of
//! step executions (side effects). The checker reads nothing else.
//!
//! Safety (checked against every durable snapshot and every observation):
//! - **acknowledged creations** are in every later durable snapshot, and `tasks/get` never
//!   answers "not found" for them;
//! - **acknowledged `tasks/update`s** are in every later snapshot (the answer is recorded, or
//!   the task ended otherwise), **acknowledged `tasks/cancel`s** too (the flag is set, or the
//!   task had ended);
//! - **sequence numbers** never go backwards between snapshots; an equal number means an
//!   identical record; journal, answers and issued keys only grow;
//! - **observed ⇒ durable**: everything a client observed (response or notification) is in the
//!   next durable snapshot or superseded by a later state (its `lastUpdatedAt` is not newer
//!   than the stored one; with the same `lastUpdatedAt` the stored task reads the same);
//! - **legal transitions** between consecutive observed or stored states; **terminal states
//!   never change**; a task is `cancelled` only if a client asked, `failed` only if its tool
//!   was told to fail (or the simulation allows infrastructure failures);
//! - **journaled steps**: a committed step value is the value of the *last* execution of that
//!   step in the side-effect log (nothing ran it again afterwards), and a completed task's
//!   result carries exactly its journal.
//!
//! - **real time** ([`super::linear`]): per task, the acknowledged operations fit one linear
//!   history of its record — no read returns an older state than an operation that completed
//!   before it was sent, and no read sent after an acknowledged answer shows its key still
//!   waiting.
//!
//! Liveness (reported apart): after faults stop, every acknowledged task reached a terminal
//! state within the bound.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::Mutex;

use mcp_tasks::internals::persist;
use mcp_tasks::internals::task::json::detailed_task;
use mcp_tasks::internals::task::{TaskRecord, TaskStatus};
use mcp_tasks::internals::wire::ServerInfo;
use serde_json::{Map, Value, json};

use super::linear::{self, Op, OpSpan, TimedOp};
use crate::sim::{JobSpec, SideEffect};

/// Where an observation came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The `CreateTaskResult` of `tools/call` (task fields only).
    Create,
    /// A `tasks/get` response.
    Get,
    /// A `notifications/tasks` of listen stream `n`.
    Notification(u64),
}

/// One thing that happened. `epoch` is the incarnation the request was sent to (or the stream
/// was opened on).
#[derive(Debug, Clone)]
pub enum Ev {
    /// The creation of `task` (to run `spec`) was acknowledged.
    CreateAcked {
        /// The new task's id.
        task: String,
        /// The incarnation the request was sent to.
        epoch: u32,
        /// What the task was told to do.
        spec: JobSpec,
    },
    /// A client saw `object`, a state of `task`, in a response or a notification.
    Observed {
        /// The task's id.
        task: String,
        /// The incarnation the request was sent to (or the stream was opened on).
        epoch: u32,
        /// Where it was seen.
        source: Source,
        /// The task as received.
        object: Value,
    },
    /// `tasks/get` answered "Task not found".
    NotFound {
        /// The task asked for.
        task: String,
        /// The incarnation the request was sent to.
        epoch: u32,
    },
    /// A `tasks/update` answering `keys` of `task` was sent (answered or not).
    UpdateSent {
        /// The task's id.
        task: String,
        /// The input keys it answers.
        keys: Vec<String>,
    },
    /// A `tasks/update` answering `keys` of `task` was acknowledged.
    UpdateAcked {
        /// The task's id.
        task: String,
        /// The incarnation the request was sent to.
        epoch: u32,
        /// The input keys it answered.
        keys: Vec<String>,
    },
    /// A `tasks/cancel` of `task` was sent (answered or not).
    CancelSent {
        /// The task's id.
        task: String,
    },
    /// A `tasks/cancel` of `task` was acknowledged.
    CancelAcked {
        /// The task's id.
        task: String,
        /// The incarnation the request was sent to.
        epoch: u32,
    },
    /// The store as found after incarnation `epoch` ended (crash, power loss or shutdown).
    Durable {
        /// The incarnation that ended.
        epoch: u32,
        /// The stored tasks that decoded, by id.
        records: BTreeMap<String, TaskRecord>,
        /// Snapshots that did not decode (id, error).
        undecodable: Vec<(String, String)>,
    },
    /// The store could not be opened after incarnation `epoch` ended.
    ReopenFailed {
        /// The incarnation that ended.
        epoch: u32,
        /// Why the store did not open.
        error: String,
    },
    /// After faults stopped, the task was still not terminal at the deadline.
    Unfinished {
        /// The task's id.
        task: String,
        /// The last state seen.
        last: Value,
    },
    /// An acknowledged operation with its real-time interval and the replica that answered,
    /// for the linearizability check ([`super::linear`]).
    Timed {
        /// The task's id.
        task: String,
        /// When it was sent and answered, and by which replica.
        span: OpSpan,
        /// What it did or saw.
        op: Op,
    },
}

/// A shared, append-only history.
#[derive(Default)]
pub struct History {
    events: Mutex<Vec<Ev>>,
}

impl History {
    /// Appends an event.
    pub fn push(&self, ev: Ev) {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ev);
    }

    /// A copy of the events so far, in order.
    pub fn events(&self) -> Vec<Ev> {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Decodes the stored tasks of a durable snapshot.
    pub fn durable(&self, epoch: u32, tasks: Vec<(String, Vec<u8>)>) {
        let mut records = BTreeMap::new();
        let mut undecodable = Vec::new();
        for (id, bytes) in tasks {
            match persist::decode(&bytes) {
                Ok(r) => {
                    records.insert(id, r);
                }
                Err(e) => undecodable.push((id, e.to_string())),
            }
        }
        self.push(Ev::Durable {
            epoch,
            records,
            undecodable,
        });
    }
}

/// What the checker may tolerate.
#[derive(Debug, Clone, Default)]
pub struct Allow {
    /// Tasks may end `failed` with an internal error without being told to (storage faults).
    pub infrastructure_failures: bool,
    /// A step may run again after its result was committed (replicas: a node paused in the
    /// middle of a step finishes it after the new owner committed the same step; its own
    /// commit is refused). The committed value must still come from some execution.
    pub cross_node_step_reexecution: bool,
}

/// What a [`Violation`] broke (the module's list of invariants).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// An acknowledged creation is gone: `tasks/get` answered "not found" for it, or a durable
    /// snapshot lacks it.
    LostCreation,
    /// The answer of an acknowledged `tasks/update` is not in a later durable snapshot.
    LostUpdate,
    /// An acknowledged `tasks/cancel` is not in a later durable snapshot (no flag, task not ended).
    LostCancel,
    /// A stored record went backwards: gone, an older sequence number, or a different record under
    /// the same number.
    SeqBackwards,
    /// Something a client observed is neither in the next durable snapshot nor superseded there.
    ObservedNotDurable,
    /// Consecutive observed or stored states do not follow a legal transition (or a task was
    /// cancelled or failed without cause).
    IllegalTransition,
    /// A terminal state changed.
    TerminalChanged,
    /// A read returned an older state than an operation that completed before it was sent.
    StaleRead,
    /// A read sent after an acknowledged answer still shows its key waiting for input.
    UpdateNotVisible,
    /// A step ran again after its result was committed.
    StepReExecuted,
    /// A journal entry no execution produced (or without its attempt), or a completed result that
    /// does not carry exactly its journal.
    Journal,
    /// The store did not reopen after an incarnation, or a stored snapshot did not decode.
    Reopen,
    /// After faults stopped, a task was not terminal within the bound (the one liveness kind).
    Liveness,
}

/// One broken invariant.
#[derive(Debug, Clone)]
pub struct Violation {
    /// Which invariant.
    pub kind: Kind,
    /// The task it concerns (`-` for the store as a whole).
    pub task: String,
    /// What was seen.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{:?}] task {}: {}", self.kind, self.task, self.detail)
    }
}

/// The checker's verdict on one history.
#[derive(Debug, Default)]
pub struct Report {
    /// Every violation found (one per kind, task and detail).
    pub violations: Vec<Violation>,
    /// Counters for the run's figures.
    pub tasks: usize,
    /// Observations (responses and notifications) checked.
    pub observations: usize,
    /// Durable snapshots checked.
    pub durable_snapshots: usize,
    /// Step executions in the side-effect log.
    pub step_executions: usize,
    /// Acknowledged operations with their real-time interval (the linearizability check's).
    pub timed_operations: usize,
}

impl Report {
    /// The safety violations (every kind but [`Kind::Liveness`]).
    pub fn safety(&self) -> impl Iterator<Item = &Violation> {
        self.violations.iter().filter(|v| v.kind != Kind::Liveness)
    }

    /// The liveness violations.
    pub fn liveness(&self) -> impl Iterator<Item = &Violation> {
        self.violations.iter().filter(|v| v.kind == Kind::Liveness)
    }

    /// Whether nothing was found.
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }

    /// Whether some violation is of `kind`.
    pub fn has(&self, kind: Kind) -> bool {
        self.violations.iter().any(|v| v.kind == kind)
    }

    /// A printable summary (at most `max` violations).
    pub fn summary(&self, max: usize) -> String {
        let mut out = format!(
            "{} safety and {} liveness violation(s) over {} tasks, {} observations, {} timed operations, {} durable snapshots, {} step executions",
            self.safety().count(),
            self.liveness().count(),
            self.tasks,
            self.observations,
            self.timed_operations,
            self.durable_snapshots,
            self.step_executions
        );
        for v in self.violations.iter().take(max) {
            out.push_str("\n  ");
            out.push_str(&v.to_string());
        }
        if self.violations.len() > max {
            out.push_str(&format!("\n  … and {} more", self.violations.len() - max));
        }
        out
    }
}

/// Strips `_meta` everywhere and `resultType` at the top: what is left is the task as the
/// client saw it.
pub fn normalise(v: &Value) -> Value {
    fn strip(v: &Value) -> Value {
        match v {
            Value::Object(m) => Value::Object(
                m.iter()
                    .filter(|(k, _)| k.as_str() != "_meta")
                    .map(|(k, v)| (k.clone(), strip(v)))
                    .collect(),
            ),
            Value::Array(a) => Value::Array(a.iter().map(strip).collect()),
            other => other.clone(),
        }
    }
    let mut v = strip(v);
    if let Some(m) = v.as_object_mut() {
        m.remove("resultType");
    }
    v
}

/// A stored record as a client would read it (`tasks/get`, normalised).
pub fn project(record: &TaskRecord) -> Value {
    normalise(&Value::Object(detailed_task(
        record,
        &ServerInfo::default(),
    )))
}

fn status_of(obj: &Value) -> Option<TaskStatus> {
    TaskStatus::from_wire(obj.get("status")?.as_str()?)
}

/// `lastUpdatedAt` in ms since the epoch.
pub fn updated_ms(obj: &Value) -> Option<u64> {
    let s = obj.get("lastUpdatedAt")?.as_str()?;
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    u64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

/// Whether observation `obs` (normalised) agrees with the projection `full` of a record with
/// the same `lastUpdatedAt`: every field the observation has is equal; a detailed task (from
/// `tasks/get` or a notification) has exactly the same fields.
fn agrees(obs: &Value, source: &Source, full: &Value) -> bool {
    let (Some(o), Some(f)) = (obs.as_object(), full.as_object()) else {
        return false;
    };
    if o.iter().any(|(k, v)| f.get(k) != Some(v)) {
        return false;
    }
    *source == Source::Create || o.len() == f.len()
}

/// The answer a simulated client gives for `key` of `task` (always the same one).
pub fn answer_for(task: &str, key: &str) -> Value {
    json!({ "action": "accept", "content": { "v": format!("{task}/{key}") } })
}

/// Statuses a task may move between (Tasks extension state machine): non-terminal ones freely, into a terminal
/// one once; a terminal one never changes.
fn legal(from: TaskStatus, to: TaskStatus) -> bool {
    !from.is_terminal() || from == to
}

/// Checks a whole history. `effects` is the side-effect log in execution order.
pub fn check(events: &[Ev], effects: &[SideEffect], allow: &Allow) -> Report {
    let mut r = Report {
        step_executions: effects.len(),
        ..Report::default()
    };
    let mut v = |kind: Kind, task: &str, detail: String| {
        r.violations.push(Violation {
            kind,
            task: task.to_owned(),
            detail,
        })
    };

    // Index the history.
    let mut specs: HashMap<&str, (&JobSpec, u32)> = HashMap::new();
    let mut observations: Vec<(&str, u32, &Source, Value)> = Vec::new();
    let mut cancels_sent: BTreeSet<&str> = BTreeSet::new();
    let mut durables: Vec<(u32, &BTreeMap<String, TaskRecord>)> = Vec::new();
    for ev in events {
        match ev {
            Ev::CreateAcked { task, epoch, spec } => {
                specs.insert(task, (spec, *epoch));
            }
            Ev::Observed {
                task,
                epoch,
                source,
                object,
            } => observations.push((task, *epoch, source, normalise(object))),
            Ev::CancelSent { task } => {
                cancels_sent.insert(task);
            }
            Ev::Durable {
                epoch,
                records,
                undecodable,
            } => {
                durables.push((*epoch, records));
                for (id, e) in undecodable {
                    v(
                        Kind::Reopen,
                        id,
                        format!("stored snapshot does not decode after incarnation {epoch}: {e}"),
                    );
                }
            }
            Ev::ReopenFailed { epoch, error } => v(
                Kind::Reopen,
                "-",
                format!("the store did not reopen after incarnation {epoch}: {error}"),
            ),
            Ev::NotFound { task, epoch } => {
                if let Some((_, created)) = specs.get(task.as_str())
                    && *created <= *epoch
                {
                    v(
                        Kind::LostCreation,
                        task,
                        format!(
                            "tasks/get in incarnation {epoch} answered \"not found\" for a task whose creation was acknowledged in incarnation {created}"
                        ),
                    );
                }
            }
            Ev::Unfinished { task, last } => v(
                Kind::Liveness,
                task,
                format!("not terminal within the bound after faults stopped; last seen {last}"),
            ),
            _ => {}
        }
    }
    r.tasks = specs.len();
    r.observations = observations.len();
    r.durable_snapshots = durables.len();
    durables.sort_by_key(|(e, _)| *e);

    // Per task: everything observed (ordered by lastUpdatedAt) must follow legal transitions,
    // and observations with the same lastUpdatedAt must agree.
    let mut by_task: BTreeMap<&str, Vec<(u64, &Source, &Value, u32)>> = BTreeMap::new();
    for (task, epoch, source, obj) in &observations {
        match updated_ms(obj) {
            Some(ms) => by_task
                .entry(task)
                .or_default()
                .push((ms, source, obj, *epoch)),
            None => v(
                Kind::IllegalTransition,
                task,
                format!("observation without a readable lastUpdatedAt: {obj}"),
            ),
        }
    }
    for (task, obs) in &mut by_task {
        obs.sort_by_key(|(ms, ..)| *ms);
        for pair in obs.windows(2) {
            let (a_ms, a_src, a, _) = pair[0];
            let (b_ms, b_src, b, _) = pair[1];
            let (Some(sa), Some(sb)) = (status_of(a), status_of(b)) else {
                continue;
            };
            if a_ms == b_ms {
                let (full, full_src, part, part_src) = if *a_src == Source::Create {
                    (b, b_src, a, a_src)
                } else {
                    (a, a_src, b, b_src)
                };
                if !agrees(part, part_src, full) && !agrees(full, full_src, part) {
                    v(
                        Kind::ObservedNotDurable,
                        task,
                        format!("two different states share lastUpdatedAt {a_ms}: {a} vs {b}"),
                    );
                }
            } else if !legal(sa, sb) {
                let kind = if sa.is_terminal() {
                    Kind::TerminalChanged
                } else {
                    Kind::IllegalTransition
                };
                v(
                    kind,
                    task,
                    format!(
                        "observed {} then {}: {a} then {b}",
                        sa.as_str(),
                        sb.as_str()
                    ),
                );
            }
        }
        // Per listen stream, notifications arrive in order.
        let mut streams: BTreeMap<u64, u64> = BTreeMap::new();
        for (task2, _, source, obj) in &observations {
            if task2 != task {
                continue;
            }
            if let (Source::Notification(n), Some(ms)) = (source, updated_ms(obj)) {
                let last = streams.entry(*n).or_insert(0);
                if ms < *last {
                    v(
                        Kind::ObservedNotDurable,
                        task,
                        format!(
                            "listen stream {n} sent an older snapshot after a newer one: {obj}"
                        ),
                    );
                }
                *last = ms;
            }
        }
    }

    // Outcomes that need a cause.
    let check_cause = |record_or_obs: (&str, TaskStatus, &Value, bool),
                       v: &mut dyn FnMut(Kind, &str, String)| {
        let (task, status, obj, told_to_fail) = record_or_obs;
        match status {
            TaskStatus::Cancelled if !cancels_sent.contains(task) => v(
                Kind::IllegalTransition,
                task,
                format!("cancelled although no client asked: {obj}"),
            ),
            TaskStatus::Failed if !told_to_fail && !allow.infrastructure_failures => v(
                Kind::IllegalTransition,
                task,
                format!("failed although its tool was not told to fail: {obj}"),
            ),
            _ => {}
        }
    };
    for (task, obs) in &by_task {
        if let Some((_, _, obj, _)) = obs.last()
            && let Some(s) = status_of(obj)
        {
            let told = specs.get(task).is_some_and(|(s, _)| s.fail);
            check_cause((task, s, obj, told), &mut v);
        }
    }

    // Step executions by (task, step), in order.
    let mut runs_by_step: HashMap<(&str, &str), Vec<&str>> = HashMap::new();
    for e in effects {
        runs_by_step
            .entry((e.task.as_str(), e.step.as_str()))
            .or_default()
            .push(e.value.as_str());
    }

    // Durable snapshots.
    let mut previous: Option<(u32, &BTreeMap<String, TaskRecord>)> = None;
    for (epoch, records) in &durables {
        let epoch = *epoch;
        for (task, (_, created)) in &specs {
            if *created <= epoch && !records.contains_key(*task) {
                v(
                    Kind::LostCreation,
                    task,
                    format!(
                        "creation acknowledged in incarnation {created} is not in the store after incarnation {epoch}"
                    ),
                );
            }
        }
        for ev in events {
            match ev {
                Ev::UpdateAcked {
                    task,
                    epoch: sent,
                    keys,
                } if *sent <= epoch => {
                    let Some(d) = records.get(task) else { continue };
                    for key in keys {
                        match d.answers.get(key) {
                            Some(a) if *a == answer_for(task, key) => {}
                            Some(a) => v(
                                Kind::LostUpdate,
                                task,
                                format!("stored answer for `{key}` is {a}, not the one sent"),
                            ),
                            None if d.status.is_terminal() && d.status != TaskStatus::Completed => {
                            }
                            None => v(
                                Kind::LostUpdate,
                                task,
                                format!(
                                    "answer for `{key}` acknowledged in incarnation {sent} is not in the store after incarnation {epoch} (status {}, seq {})",
                                    d.status.as_str(),
                                    d.seq
                                ),
                            ),
                        }
                    }
                }
                Ev::CancelAcked { task, epoch: sent } if *sent <= epoch => {
                    let Some(d) = records.get(task) else { continue };
                    if !d.cancel_requested && !d.status.is_terminal() {
                        v(
                            Kind::LostCancel,
                            task,
                            format!(
                                "cancellation acknowledged in incarnation {sent} is not in the store after incarnation {epoch} (status {}, seq {})",
                                d.status.as_str(),
                                d.seq
                            ),
                        );
                    }
                }
                _ => {}
            }
        }
        // Observed ⇒ durable.
        for (task, sent, source, obj) in &observations {
            if *sent > epoch {
                continue;
            }
            let Some(d) = records.get(*task) else {
                if specs.contains_key(*task) {
                    continue; // reported as a lost creation
                }
                v(
                    Kind::ObservedNotDurable,
                    task,
                    format!(
                        "observed in incarnation {sent} but not stored after incarnation {epoch}: {obj}"
                    ),
                );
                continue;
            };
            let Some(ms) = updated_ms(obj) else { continue };
            let full = project(d);
            if ms > d.last_updated_at_ms {
                v(
                    Kind::ObservedNotDurable,
                    task,
                    format!(
                        "observed ({source:?}) in incarnation {sent} a state newer than the store holds after incarnation {epoch}: observed {obj}, stored seq {} {full}",
                        d.seq
                    ),
                );
            } else if ms == d.last_updated_at_ms && !agrees(obj, source, &full) {
                v(
                    Kind::ObservedNotDurable,
                    task,
                    format!(
                        "observed ({source:?}) in incarnation {sent} a state the store does not hold after incarnation {epoch}: observed {obj}, stored seq {} {full}",
                        d.seq
                    ),
                );
            } else if status_of(obj).is_some_and(TaskStatus::is_terminal)
                && !agrees(obj, source, &full)
            {
                v(
                    Kind::TerminalChanged,
                    task,
                    format!("observed terminal {obj}, stored after incarnation {epoch}: {full}"),
                );
            }
        }
        // Records: causes, journal, results.
        for (task, d) in records.iter() {
            // Tasks whose creation was not acknowledged (the client never learnt their id) are
            // checked against the arguments they were stored with.
            let spec = d
                .arguments
                .as_object()
                .map(JobSpec::from_arguments)
                .unwrap_or_else(|| JobSpec::from_arguments(&Map::new()));
            check_cause((task, d.status, &project(d), spec.fail), &mut v);
            check_journal(task, d, &runs_by_step, Some(&spec), &mut v);
        }
        // Monotonic against the previous snapshot.
        if let Some((pe, prev)) = previous {
            for (task, a) in prev {
                let Some(b) = records.get(task) else {
                    v(
                        Kind::SeqBackwards,
                        task,
                        format!(
                            "stored after incarnation {pe} (seq {}), gone after {epoch}",
                            a.seq
                        ),
                    );
                    continue;
                };
                if b.seq < a.seq {
                    v(
                        Kind::SeqBackwards,
                        task,
                        format!(
                            "seq {} after incarnation {pe}, {} after {epoch}",
                            a.seq, b.seq
                        ),
                    );
                } else if b.seq == a.seq && a != b {
                    v(
                        Kind::SeqBackwards,
                        task,
                        format!(
                            "seq {} holds different records after incarnations {pe} and {epoch}",
                            a.seq
                        ),
                    );
                } else if a.status.is_terminal() && a != b {
                    v(
                        Kind::TerminalChanged,
                        task,
                        format!(
                            "terminal {} after incarnation {pe} changed after {epoch}: {} → {}",
                            a.status.as_str(),
                            project(a),
                            project(b)
                        ),
                    );
                } else if !legal(a.status, b.status) {
                    v(
                        Kind::IllegalTransition,
                        task,
                        format!("stored {} then {}", a.status.as_str(), b.status.as_str()),
                    );
                }
                let grows = |x: &BTreeMap<String, Value>, y: &BTreeMap<String, Value>| {
                    x.iter().all(|(k, val)| y.get(k) == Some(val))
                };
                if !grows(&a.journal, &b.journal)
                    || !grows(&a.answers, &b.answers)
                    || !a.issued_keys.is_subset(&b.issued_keys)
                    || (a.cancel_requested && !b.cancel_requested)
                {
                    v(
                        Kind::Journal,
                        task,
                        format!(
                            "journal, answers, issued keys or cancel flag shrank or changed between incarnations {pe} and {epoch}"
                        ),
                    );
                }
            }
        }
        previous = Some((epoch, records));
    }

    // Real time: the acknowledged operations of each task fit one linear history.
    let timed: Vec<TimedOp<'_>> = events
        .iter()
        .filter_map(|ev| match ev {
            Ev::Timed { task, span, op } => Some(TimedOp { task, span, op }),
            _ => None,
        })
        .collect();
    linear::check(&timed, &mut v);
    r.timed_operations = timed.len();

    if allow.cross_node_step_reexecution {
        r.violations.retain(|x| x.kind != Kind::StepReExecuted);
    }
    // One report per (kind, task): a broken invariant repeats in every snapshot.
    let mut seen = BTreeSet::new();
    r.violations.retain(|x| {
        seen.insert((
            x.kind,
            x.task.clone(),
            x.detail.chars().take(60).collect::<String>(),
        ))
    });
    r
}

/// A stored record's journal against the side-effect log, and a completed result against the
/// journal.
fn check_journal(
    task: &str,
    d: &TaskRecord,
    runs_by_step: &HashMap<(&str, &str), Vec<&str>>,
    spec: Option<&JobSpec>,
    v: &mut dyn FnMut(Kind, &str, String),
) {
    for (step, value) in &d.journal {
        // This build records the attempt every step committed in (a run counts from 1).
        if d.step_attempts.get(step).is_none_or(|a| *a == 0) {
            v(
                Kind::Journal,
                task,
                format!(
                    "step `{step}` has no attempt recorded ({:?})",
                    d.step_attempts.get(step)
                ),
            );
        }
        let Some(value) = value.as_str() else {
            v(
                Kind::Journal,
                task,
                format!("step `{step}` recorded a non-string {value}"),
            );
            continue;
        };
        let runs = runs_by_step
            .get(&(task, step.as_str()))
            .map(Vec::as_slice)
            .unwrap_or_default();
        match runs.iter().position(|r| *r == value) {
            None => v(
                Kind::Journal,
                task,
                format!(
                    "step `{step}` recorded value {value} that no execution produced ({} executions)",
                    runs.len()
                ),
            ),
            Some(pos) if pos + 1 < runs.len() => v(
                Kind::StepReExecuted,
                task,
                format!(
                    "step `{step}` executed {} more time(s) after its result {value} was committed",
                    runs.len() - pos - 1
                ),
            ),
            Some(_) => {}
        }
    }
    if d.status == TaskStatus::Completed {
        let structured = match &d.outcome {
            Some(mcp_tasks::internals::task::TaskOutcome::Result(r)) => {
                r.get("structuredContent").cloned()
            }
            _ => None,
        };
        let steps = spec.map_or(d.journal.len() as u32, |s| s.steps);
        let want_steps: Vec<Value> = (0..steps)
            .map(|i| {
                d.journal
                    .get(&crate::sim::step_name(i))
                    .cloned()
                    .unwrap_or(Value::Null)
            })
            .collect();
        let mut want_answers = Map::new();
        if let Some(spec) = spec {
            for i in spec.inputs.iter().filter(|i| **i < spec.steps) {
                let key = crate::sim::input_key(*i);
                want_answers.insert(key.clone(), answer_for(task, &key));
            }
        }
        let want = json!({ "steps": want_steps, "answers": want_answers });
        if structured.as_ref() != Some(&want) {
            v(
                Kind::Journal,
                task,
                format!(
                    "completed with {} but the journal and answers say {want}",
                    structured.unwrap_or(Value::Null)
                ),
            );
        }
    }
}
