//! The live tasks of one runtime and the messages their actors take.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use ractor::{ActorId, ActorRef, RpcReplyPort};
use serde_json::{Map, Value};
use tokio::sync::watch;

use crate::task::{Event, Owner, TaskId, TaskRecord};
use crate::tool::{CallToolResult, ToolError};
use crate::wire::error::RpcError;

/// Messages a task actor handles.
pub(crate) enum TaskMsg {
    /// `tasks/update`: answers for outstanding input keys.
    Update(BTreeMap<String, Value>, RpcReplyPort<Result<(), RpcError>>),
    /// `tasks/cancel`.
    Cancel(RpcReplyPort<Result<(), RpcError>>),
    /// The reaper found the task past its time to live.
    Expire(RpcReplyPort<Result<(), RpcError>>),
    /// An event recorded by the running tool (a step, an input request, a status message).
    Tool(Event, RpcReplyPort<Result<(), RpcError>>),
    /// The tool's future ended.
    ToolExited(Result<CallToolResult, ToolError>),
    /// The tool's future panicked: the actor fails and the supervisor restarts it.
    ToolPanicked(String),
    /// The grace period after a cancellation request ended.
    CancelGraceElapsed,
    /// The node this task was taken over from (counting an attempt) renewed its heartbeat
    /// in the same process: it was paused, not crashed; the attempt is given back.
    RefundLapse,
}

/// A live task: its actor and the stream of its committed snapshots.
#[derive(Clone)]
pub(crate) struct LiveTask {
    pub(crate) actor: ActorRef<TaskMsg>,
    pub(crate) snapshots: watch::Receiver<Arc<TaskRecord>>,
}

/// The live tasks of one runtime, by id, with a count per owner (for the live-task quota).
#[derive(Default)]
pub(crate) struct LiveTasks {
    map: Mutex<LiveMap>,
}

#[derive(Default)]
struct LiveMap {
    /// Each live task with its owner, the size of its arguments and whether its creation is
    /// committed (an actor starts while the commit of its new task is in flight).
    tasks: HashMap<TaskId, (Owner, u64, LiveTask, bool)>,
    /// Per owner: live tasks and the bytes of their arguments.
    per_owner: HashMap<Owner, (usize, u64)>,
}

impl LiveTasks {
    fn lock(&self) -> std::sync::MutexGuard<'_, LiveMap> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers the actor of a live task. `committed` = its snapshot is stored; `false` for
    /// a task whose creation commit is still in flight: its actor takes messages (they wait
    /// in its mailbox until the commit is acknowledged), but readers do not see it until
    /// [`LiveTasks::mark_committed`].
    pub(crate) fn insert(&self, id: TaskId, task: LiveTask, committed: bool) {
        let (owner, bytes) = {
            let record = task.snapshots.borrow();
            (
                record.owner.clone(),
                crate::limits::json_len(&record.arguments) as u64,
            )
        };
        let mut map = self.lock();
        if let Some((old, old_bytes, _, _)) = map
            .tasks
            .insert(id, (owner.clone(), bytes, task, committed))
        {
            map.forget_one(&old, old_bytes);
        }
        let entry = map.per_owner.entry(owner).or_default();
        entry.0 += 1;
        entry.1 += bytes;
    }

    /// The creation of `id`, whose actor is `actor`, is committed: readers see it from now on.
    pub(crate) fn mark_committed(&self, id: &TaskId, actor: ActorId) {
        if let Some(entry) = self.lock().tasks.get_mut(id)
            && entry.2.actor.get_id() == actor
        {
            entry.3 = true;
        }
    }

    /// The live task, for readers: only once its creation is committed.
    pub(crate) fn get(&self, id: &TaskId) -> Option<LiveTask> {
        self.lock()
            .tasks
            .get(id)
            .filter(|e| e.3)
            .map(|(_, _, t, _)| t.clone())
    }

    /// The task's actor, also while its creation commit is in flight (messages wait in its
    /// mailbox until the commit is acknowledged): for commands and the supervisor, never
    /// for reads.
    pub(crate) fn actor_of(&self, id: &TaskId) -> Option<LiveTask> {
        self.lock().tasks.get(id).map(|(_, _, t, _)| t.clone())
    }

    /// The latest committed snapshot of a live task.
    pub(crate) fn snapshot(&self, id: &TaskId) -> Option<Arc<TaskRecord>> {
        self.lock()
            .tasks
            .get(id)
            .filter(|e| e.3)
            .map(|(_, _, t, _)| t.snapshots.borrow().clone())
    }

    /// Removes the entry of `id` if it still belongs to actor `actor`.
    pub(crate) fn remove_if(&self, id: &TaskId, actor: ActorId) {
        let mut map = self.lock();
        if map
            .tasks
            .get(id)
            .is_some_and(|(_, _, t, _)| t.actor.get_id() == actor)
            && let Some((owner, bytes, _, _)) = map.tasks.remove(id)
        {
            map.forget_one(&owner, bytes);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().tasks.len()
    }

    /// The live tasks of `owner` and the bytes of their arguments.
    pub(crate) fn usage_of(&self, owner: &Owner) -> (usize, u64) {
        self.lock().per_owner.get(owner).copied().unwrap_or((0, 0))
    }
}

/// The client capabilities of recently created tasks, so that tasks created with the same
/// declaration share one value instead of a copy each (the same client declares the same
/// capabilities on every request). Bounded: at most [`SharedCapabilities::KEEP`] values, the
/// oldest dropped first; a declaration not among them gets a value of its own.
#[derive(Default)]
pub(crate) struct SharedCapabilities {
    recent: Mutex<Vec<Arc<Value>>>,
}

impl SharedCapabilities {
    const KEEP: usize = 16;

    /// The value for `capabilities`: one already held if it is the same JSON (same keys in the
    /// same order, same values), a new one otherwise.
    pub(crate) fn share(&self, capabilities: &Map<String, Value>) -> Arc<Value> {
        let mut recent = self.lock();
        if let Some(found) = recent
            .iter()
            .find(|v| matches!(&***v, Value::Object(m) if same_map(m, capabilities)))
        {
            return found.clone();
        }
        let value = Arc::new(Value::Object(capabilities.clone()));
        Self::keep(&mut recent, value.clone());
        value
    }

    /// [`SharedCapabilities::share`] for a value already allocated (a record read from the
    /// store): the one held if it is the same JSON, else `capabilities`, now held.
    pub(crate) fn share_arc(&self, capabilities: Arc<Value>) -> Arc<Value> {
        let mut recent = self.lock();
        if let Some(found) = recent.iter().find(|v| same_json(v, &capabilities)) {
            return found.clone();
        }
        Self::keep(&mut recent, capabilities.clone());
        capabilities
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Value>>> {
        self.recent.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn keep(recent: &mut Vec<Arc<Value>>, value: Arc<Value>) {
        if recent.len() >= Self::KEEP {
            recent.remove(0);
        }
        recent.push(value);
    }
}

/// Equal as JSON text would be: objects compare their keys in order (`Value`'s own equality
/// ignores the order of an object's keys, which this crate preserves).
fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => same_map(a, b),
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same_json(a, b))
        }
        _ => a == b,
    }
}

fn same_map(a: &Map<String, Value>, b: &Map<String, Value>) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|((ka, va), (kb, vb))| ka == kb && same_json(va, vb))
}

impl LiveMap {
    fn forget_one(&mut self, owner: &Owner, bytes: u64) {
        if let Some((n, b)) = self.per_owner.get_mut(owner) {
            *n = n.saturating_sub(1);
            *b = b.saturating_sub(bytes);
            if *n == 0 {
                self.per_owner.remove(owner);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!("an object"),
        }
    }

    #[test]
    fn equal_capabilities_share_one_value() {
        let cache = SharedCapabilities::default();
        let caps = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}, "roots": {}});
        let a = cache.share(&map(caps.clone()));
        let b = cache.share(&map(caps.clone()));
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(*a, caps);
        // A record read back from the store gets the value already held.
        let stored = cache.share_arc(Arc::new(caps.clone()));
        assert!(Arc::ptr_eq(&a, &stored));
    }

    #[test]
    fn different_capabilities_or_key_order_get_their_own_value() {
        let cache = SharedCapabilities::default();
        let a = cache.share(&map(json!({"roots": {}, "elicitation": {}})));
        let b = cache.share(&map(json!({"elicitation": {}, "roots": {}})));
        let c = cache.share(&map(
            json!({"roots": {"listChanged": true}, "elicitation": {}}),
        ));
        assert!(!Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
        // Each keeps its keys in the order they were declared.
        assert_eq!(
            serde_json::to_string(&*b).unwrap(),
            r#"{"elicitation":{},"roots":{}}"#
        );
        assert!(Arc::ptr_eq(
            &b,
            &cache.share(&map(json!({"elicitation": {}, "roots": {}})))
        ));
    }

    #[test]
    fn at_most_keep_values_are_held_oldest_dropped_first() {
        let cache = SharedCapabilities::default();
        let first = cache.share(&map(json!({"n": 0})));
        for n in 1..=SharedCapabilities::KEEP {
            cache.share(&map(json!({ "n": n })));
        }
        assert_eq!(cache.lock().len(), SharedCapabilities::KEEP);
        // The first one was dropped from the cache: an equal declaration gets a new value.
        let again = cache.share(&map(json!({"n": 0})));
        assert!(!Arc::ptr_eq(&first, &again));
        assert_eq!(first, again);
    }
}
