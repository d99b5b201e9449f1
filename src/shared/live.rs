//! The live tasks of one runtime and the messages their actors take.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use ractor::{ActorId, ActorRef, RpcReplyPort};
use serde_json::Value;
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
        if let Some((old, old_bytes, _, _)) =
            map.tasks.insert(id, (owner.clone(), bytes, task, committed))
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
