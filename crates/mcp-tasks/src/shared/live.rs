//! The live tasks of one runtime and the messages their actors take.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use ractor::{ActorId, ActorRef, RpcReplyPort};
use serde_json::{Map, Value};
use tokio::sync::{Notify, watch};

use crate::task::{Event, Owner, TaskId, TaskRecord};
use crate::telemetry::{ParkedGauge, TaskGauge};
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
    /// The task has waited for input since its commit number `seq` for
    /// [`crate::RuntimeConfig::passivate_after`]: its actor passivates if nothing changed.
    Passivate(u64),
    /// A queued task got its flow-control slot: its tool starts.
    Admitted(super::flow::Slot),
}

/// A live task: its actor and the stream of its committed snapshots.
#[derive(Clone)]
pub(crate) struct LiveTask {
    pub(crate) actor: ActorRef<TaskMsg>,
    pub(crate) snapshots: watch::Receiver<Arc<TaskRecord>>,
    /// Set by the actor before it sends a commit of the task, cleared once the commit is
    /// acknowledged and its snapshot published: while it is set, the store may hold a newer
    /// record than `snapshots` (see [`LiveTasks::settled_snapshot`]). Never cleared again
    /// after a commit that failed with the store's error (its outcome unknown) or an
    /// acknowledgement the store refused (the record moved): that actor is about to fail and
    /// be replaced from the store, and its snapshot must not be served meanwhile.
    pub(crate) unsettled: Arc<std::sync::atomic::AtomicBool>,
}

/// The live tasks of one runtime, by id, with a count per owner (for the live-task quota).
///
/// A live task is either *active* (its actor runs, its tool's future is held) or *parked*
/// (passivated while it waits for input: no actor, no tool future, its latest committed
/// state in the store only; see [`crate::RuntimeConfig::passivate_after`]). A parked task
/// still counts as live for its owner's quota and in the `mcp_tasks_tasks` gauge; readers
/// find no actor and read the store; a command, the reaper or a restart of the runtime gets
/// it an actor again through the supervisor, which replaces the parked entry.
#[derive(Default)]
pub(crate) struct LiveTasks {
    map: Mutex<LiveMap>,
}

#[derive(Default)]
struct LiveMap {
    tasks: HashMap<TaskId, Entry>,
    /// Per owner: live tasks and the bytes of their arguments.
    per_owner: HashMap<Owner, (usize, u64)>,
    /// How many of `tasks` are parked.
    parked: usize,
}

/// A live task with its owner and the size of its arguments.
struct Entry {
    owner: Owner,
    bytes: u64,
    slot: Slot,
}

enum Slot {
    /// The task's actor runs. `committed`: its snapshot is stored (an actor starts while the
    /// commit of its new task is in flight).
    Active { task: LiveTask, committed: bool },
    /// Passivated: no actor until something needs one.
    Parked(Parked),
}

/// What a parked task keeps in memory: its place in the `mcp_tasks_tasks` gauge, and the
/// wake-up of listeners following it (made when the first one waits).
struct Parked {
    _gauge: TaskGauge,
    _parked: ParkedGauge,
    wake: Option<Arc<Notify>>,
}

impl Parked {
    fn wake(self) {
        if let Some(wake) = self.wake {
            wake.notify_waiters();
        }
    }
}

impl Entry {
    fn active(&self) -> Option<&LiveTask> {
        match &self.slot {
            Slot::Active { task, .. } => Some(task),
            Slot::Parked(_) => None,
        }
    }

    fn committed(&self) -> Option<&LiveTask> {
        match &self.slot {
            Slot::Active {
                task,
                committed: true,
            } => Some(task),
            _ => None,
        }
    }
}

impl LiveTasks {
    fn lock(&self) -> std::sync::MutexGuard<'_, LiveMap> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers the actor of a live task (replacing the task's parked entry, whose listeners
    /// are woken). `committed` = its snapshot is stored; `false` for a task whose creation
    /// commit is still in flight: its actor takes messages (they wait in its mailbox until
    /// the commit is acknowledged), but readers do not see it until
    /// [`LiveTasks::mark_committed`].
    pub(crate) fn insert(&self, id: TaskId, task: LiveTask, committed: bool) {
        let (owner, bytes) = counted(&task.snapshots.borrow());
        let slot = Slot::Active { task, committed };
        let old = self.lock().put(id, owner, bytes, slot);
        if let Some(Slot::Parked(parked)) = old {
            parked.wake();
        }
    }

    /// Parks the task `id` whose actor is `actor`, which stops right after: the task stays
    /// live without an actor, and its count in `gauge` moves to the parked entry. `false`
    /// (nothing changed) when the entry is not that actor's.
    pub(crate) fn park(&self, id: &TaskId, actor: ActorId, gauge: &mut TaskGauge) -> bool {
        let mut map = self.lock();
        let Some(entry) = map.tasks.get_mut(id) else {
            return false;
        };
        if entry.active().is_none_or(|t| t.actor.get_id() != actor) {
            return false;
        }
        entry.slot = Slot::Parked(Parked {
            _gauge: gauge.take(),
            _parked: ParkedGauge::new(true),
            wake: None,
        });
        map.parked += 1;
        true
    }

    /// Registers a stored live task as parked without starting its actor (the runtime's
    /// start-up, for tasks waiting for input). `false` when the task already has an entry.
    pub(crate) fn park_stored(&self, record: &TaskRecord) -> bool {
        let mut map = self.lock();
        if map.tasks.contains_key(&record.id) {
            return false;
        }
        let (owner, bytes) = counted(record);
        let slot = Slot::Parked(Parked {
            _gauge: TaskGauge::new(record.status),
            _parked: ParkedGauge::new(false),
            wake: None,
        });
        map.put(record.id.clone(), owner, bytes, slot);
        true
    }

    /// Forgets the parked entry of `id` (this node lost the task's lease); its listeners are
    /// woken to look again. An active entry is left alone.
    pub(crate) fn forget_parked(&self, id: &TaskId) {
        let parked = {
            let mut map = self.lock();
            if map.tasks.get(id).is_none_or(|e| e.active().is_some()) {
                return;
            }
            map.take(id)
        };
        if let Some(Slot::Parked(parked)) = parked {
            parked.wake();
        }
    }

    /// For a listener of a parked task: what wakes it when the task gets an actor again (or
    /// its entry goes). `None` when the task is not parked (it has an actor, or is not live
    /// here). Enable the `Notified` before looking again with [`LiveTasks::is_parked`].
    pub(crate) fn parked_wake(&self, id: &TaskId) -> Option<Arc<Notify>> {
        let mut map = self.lock();
        match &mut map.tasks.get_mut(id)?.slot {
            Slot::Parked(parked) => Some(parked.wake.get_or_insert_with(Default::default).clone()),
            Slot::Active { .. } => None,
        }
    }

    /// Whether `id` is parked.
    pub(crate) fn is_parked(&self, id: &TaskId) -> bool {
        self.lock()
            .tasks
            .get(id)
            .is_some_and(|e| e.active().is_none())
    }

    /// The creation of `id`, whose actor is `actor`, is committed: readers see it from now on.
    pub(crate) fn mark_committed(&self, id: &TaskId, actor: ActorId) {
        if let Some(entry) = self.lock().tasks.get_mut(id)
            && let Slot::Active { task, committed } = &mut entry.slot
            && task.actor.get_id() == actor
        {
            *committed = true;
        }
    }

    /// The live task's actor, for readers: only once its creation is committed; `None` for a
    /// parked task.
    pub(crate) fn get(&self, id: &TaskId) -> Option<LiveTask> {
        self.lock()
            .tasks
            .get(id)
            .and_then(Entry::committed)
            .cloned()
    }

    /// The task's actor, also while its creation commit is in flight (messages wait in its
    /// mailbox until the commit is acknowledged): for commands and the supervisor, never
    /// for reads. `None` for a parked task.
    pub(crate) fn actor_of(&self, id: &TaskId) -> Option<LiveTask> {
        self.lock().tasks.get(id).and_then(Entry::active).cloned()
    }

    /// The latest committed snapshot of a task with an actor.
    pub(crate) fn snapshot(&self, id: &TaskId) -> Option<Arc<TaskRecord>> {
        self.lock()
            .tasks
            .get(id)
            .and_then(Entry::committed)
            .map(|t| t.snapshots.borrow().clone())
    }

    /// The committed snapshot of live task `id` when no commit of it is in flight, waiting
    /// (up to `bound`) for one in flight to end; `None` when the task has no committed actor
    /// here, the commit did not end within `bound`, or it failed (the actor is being replaced
    /// from the store, which may hold the record it tried to write).
    pub(crate) async fn settled_snapshot(
        &self,
        id: &TaskId,
        bound: std::time::Duration,
    ) -> Option<Arc<TaskRecord>> {
        use std::sync::atomic::Ordering;
        let (mut snapshots, unsettled) = {
            let map = self.lock();
            let task = map.tasks.get(id).and_then(Entry::committed)?;
            (task.snapshots.clone(), task.unsettled.clone())
        };
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            snapshots.borrow_and_update();
            if !unsettled.load(Ordering::SeqCst) {
                return Some(snapshots.borrow().clone());
            }
            // A commit in flight: its snapshot is published before the flag clears.
            match tokio::time::timeout_at(deadline, snapshots.changed()).await {
                Ok(Ok(())) => continue,
                _ => return None,
            }
        }
    }

    /// Removes the entry of `id` if it is still actor `actor`'s.
    pub(crate) fn remove_if(&self, id: &TaskId, actor: ActorId) {
        let mut map = self.lock();
        if map
            .tasks
            .get(id)
            .and_then(Entry::active)
            .is_some_and(|t| t.actor.get_id() == actor)
        {
            map.take(id);
        }
    }

    /// Live tasks with an actor.
    pub(crate) fn len(&self) -> usize {
        let map = self.lock();
        map.tasks.len() - map.parked
    }

    /// Live tasks parked without an actor.
    pub(crate) fn parked(&self) -> usize {
        self.lock().parked
    }

    /// The live tasks of `owner` (parked ones included) and the bytes of their arguments.
    pub(crate) fn usage_of(&self, owner: &Owner) -> (usize, u64) {
        self.lock().per_owner.get(owner).copied().unwrap_or((0, 0))
    }
}

/// What a live task counts for in its owner's usage: the owner, and its arguments' bytes.
fn counted(record: &TaskRecord) -> (Owner, u64) {
    (
        record.owner.clone(),
        crate::limits::json_len(&record.arguments) as u64,
    )
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
    /// Sets the entry of `id`; returns the slot it replaced.
    fn put(&mut self, id: TaskId, owner: Owner, bytes: u64, slot: Slot) -> Option<Slot> {
        let entry = self.per_owner.entry(owner.clone()).or_default();
        entry.0 += 1;
        entry.1 += bytes;
        if matches!(slot, Slot::Parked(_)) {
            self.parked += 1;
        }
        let old = self.tasks.insert(id, Entry { owner, bytes, slot })?;
        self.forget_one(&old.owner, old.bytes);
        if matches!(old.slot, Slot::Parked(_)) {
            self.parked -= 1;
        }
        Some(old.slot)
    }

    /// Removes the entry of `id`; returns its slot.
    fn take(&mut self, id: &TaskId) -> Option<Slot> {
        let old = self.tasks.remove(id)?;
        self.forget_one(&old.owner, old.bytes);
        if matches!(old.slot, Slot::Parked(_)) {
            self.parked -= 1;
        }
        Some(old.slot)
    }

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

    fn waiting(n: u8, principal: &str) -> TaskRecord {
        let mut r = TaskRecord::new(
            TaskId::from_bytes([n; 16]),
            Owner::new("t", principal),
            "tool".into(),
            json!({ "x": 1 }),
            json!({}),
            1_767_225_600_000,
            None,
            None,
            None,
        );
        r.status = crate::task::TaskStatus::InputRequired;
        r
    }

    #[test]
    fn parked_tasks_count_as_live_for_their_owner_and_have_no_actor() {
        let live = LiveTasks::default();
        let (a, b) = (waiting(1, "p"), waiting(2, "p"));
        assert!(live.park_stored(&a));
        assert!(live.park_stored(&b));
        assert!(!live.park_stored(&a), "one entry per task");
        assert_eq!((live.parked(), live.len()), (2, 0));
        let args = crate::limits::json_len(&a.arguments) as u64;
        assert_eq!(live.usage_of(&a.owner), (2, 2 * args));
        assert!(live.is_parked(&a.id));
        assert!(live.get(&a.id).is_none() && live.actor_of(&a.id).is_none());
        assert!(live.snapshot(&a.id).is_none(), "readers go to the store");
        live.forget_parked(&a.id);
        assert_eq!((live.parked(), live.len()), (1, 0));
        assert_eq!(live.usage_of(&a.owner), (1, args));
        assert!(!live.is_parked(&a.id));
        live.forget_parked(&b.id);
        assert_eq!(live.usage_of(&b.owner), (0, 0));
        assert_eq!(live.parked(), 0);
    }

    #[tokio::test]
    async fn a_listener_of_a_parked_task_is_woken_when_its_entry_goes() {
        let live = LiveTasks::default();
        let a = waiting(3, "p");
        live.park_stored(&a);
        let wake = live.parked_wake(&a.id).expect("parked");
        let notified = wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        live.forget_parked(&a.id);
        tokio::time::timeout(std::time::Duration::from_secs(5), notified)
            .await
            .expect("woken");
        assert!(live.parked_wake(&a.id).is_none());
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
