//! The actors: one task actor per live task, and the supervisor that spawns, rehydrates and
//! restarts them.
//!
//! Ordering rule for every transition (see ARCHITECTURE.md): compute the next record with
//! the pure [`crate::task::apply`], commit it to the store and wait for the durable ack, then
//! swap the actor's state, reply, and publish the snapshot. Nothing is observable before it
//! is committed.

mod subscriber;
mod supervisor;
mod task;

pub(crate) use subscriber::{OUTPUT_CAPACITY, Subscriber, SubscriberArgs};
pub(crate) use supervisor::{Supervisor, SupervisorMsg};
pub use task::TaskMsg;
pub(crate) use task::{FencedStop, StoreFailure, TaskActor};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ractor::{ActorId, ActorRef};
use tokio::sync::watch;

use crate::clock::Clock;
use crate::error::RuntimeError;
use crate::persist;
use crate::runtime::RuntimeConfig;
use crate::store::{Expect, Store, WriteOp};
use crate::task::{Owner, TaskId, TaskRecord};
use crate::tool::ToolRegistry;

/// What every actor and the dispatcher of one runtime share. Nothing here is global: two
/// runtimes in one process have two of these.
pub(crate) struct Shared {
    pub(crate) store: Store,
    pub(crate) tools: ToolRegistry,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) config: RuntimeConfig,
    pub(crate) live: LiveTasks,
    pub(crate) catalog: crate::catalog::Catalog,
    pub(crate) request_state: crate::protocol::request_state::RequestStateCodec,
    /// Becomes `true` when the runtime shuts down: listen streams end with their result.
    pub(crate) closing: tokio::sync::watch::Receiver<bool>,
    /// Per-owner quota counters.
    pub(crate) quotas: Arc<crate::quota::QuotaTracker>,
}

impl Shared {
    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The store operation that persists `record`, with its live and expiry index entries,
    /// conditional on the store holding its predecessor (sequence number `seq - 1`).
    /// A live task is due at its expiry (the reaper fails it); a finished one is due when its
    /// retention after expiry ends (the reaper deletes it).
    pub(crate) fn write_op(&self, record: &TaskRecord) -> Result<WriteOp, RuntimeError> {
        let bytes = persist::encode(record)?;
        let live = !record.status.is_terminal();
        let retention = self.config.expired_retention.as_millis();
        let due_ms = record.expires_at_ms().map(|at| {
            if live {
                at
            } else {
                at.saturating_add(u64::try_from(retention).unwrap_or(u64::MAX))
            }
        });
        // One writer per task: every record is computed by `apply` from the record at
        // `seq - 1`, so the write is conditional on the store still holding that one. A stale
        // writer (an actor rebuilt while the reaper expired the task, a give-up racing a
        // restart) is refused with `StoreError::Conflict` instead of overwriting.
        let expect = if record.seq <= 1 {
            Expect::Absent
        } else {
            Expect::Seq(record.seq - 1)
        };
        Ok(WriteOp::Put {
            id: record.id.as_str().to_owned(),
            bytes,
            live,
            due_ms,
            seq: Some(record.seq),
            expect,
        })
    }

    /// Commits `record` durably (group-committed with whatever else is queued).
    pub(crate) async fn commit(&self, record: &TaskRecord) -> Result<(), RuntimeError> {
        let op = self.write_op(record)?;
        self.store.commit(vec![op]).await?;
        Ok(())
    }

    /// The snapshot of a task that reads serve: from its live actor when there is one, from
    /// the store otherwise.
    ///
    /// Reads never go backwards. A task actor commits a transition before it publishes it,
    /// so while a commit is in flight the store is one step ahead of the actor's snapshot. A
    /// read that found no actor and went to the store can therefore see a record that an
    /// actor started meanwhile has committed but not yet published; serving it, and the
    /// actor's older snapshot at the next read, would move the task backwards (a `failed`
    /// task served `working` again). So after the store read the live map is looked at
    /// again, and an actor found there wins: its snapshot is what every later read serves.
    /// An actor is registered before its first commit and removed after its last one, so a
    /// stored record served because no actor is registered any more is never followed by an
    /// older one. Test: `runtime::tests::expiry_and_give_up_racing_restarts_never_change_a_terminal_state`.
    pub(crate) async fn load(&self, id: &TaskId) -> Result<Option<Arc<TaskRecord>>, RuntimeError> {
        // On a store shared by replicas, another node may have changed the task since this
        // node's actor last committed (it took the task over): the store is the truth.
        if self.store.is_shared() {
            return self.load_stored(id).await;
        }
        if let Some(snapshot) = self.live.snapshot(id) {
            return Ok(Some(snapshot));
        }
        let stored = self.load_stored(id).await?;
        if let Some(snapshot) = self.live.snapshot(id) {
            return Ok(Some(snapshot));
        }
        Ok(stored)
    }

    /// The task as the store has it.
    pub(crate) async fn load_stored(
        &self,
        id: &TaskId,
    ) -> Result<Option<Arc<TaskRecord>>, RuntimeError> {
        match self.store.get(id.as_str()).await? {
            Some(bytes) => Ok(Some(Arc::new(persist::decode(&bytes)?))),
            None => Ok(None),
        }
    }
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
    /// Each live task with its owner and the size of its arguments.
    tasks: HashMap<TaskId, (Owner, u64, LiveTask)>,
    /// Per owner: live tasks and the bytes of their arguments.
    per_owner: HashMap<Owner, (usize, u64)>,
}

impl LiveTasks {
    fn lock(&self) -> std::sync::MutexGuard<'_, LiveMap> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn insert(&self, id: TaskId, task: LiveTask) {
        let (owner, bytes) = {
            let record = task.snapshots.borrow();
            (
                record.owner.clone(),
                crate::limits::json_len(&record.arguments) as u64,
            )
        };
        let mut map = self.lock();
        if let Some((old, old_bytes, _)) = map.tasks.insert(id, (owner.clone(), bytes, task)) {
            map.forget_one(&old, old_bytes);
        }
        let entry = map.per_owner.entry(owner).or_default();
        entry.0 += 1;
        entry.1 += bytes;
    }

    pub(crate) fn get(&self, id: &TaskId) -> Option<LiveTask> {
        self.lock().tasks.get(id).map(|(_, _, t)| t.clone())
    }

    pub(crate) fn snapshot(&self, id: &TaskId) -> Option<Arc<TaskRecord>> {
        self.lock()
            .tasks
            .get(id)
            .map(|(_, _, t)| t.snapshots.borrow().clone())
    }

    /// Removes the entry of `id` if it still belongs to actor `actor`.
    pub(crate) fn remove_if(&self, id: &TaskId, actor: ActorId) {
        let mut map = self.lock();
        if map
            .tasks
            .get(id)
            .is_some_and(|(_, _, t)| t.actor.get_id() == actor)
            && let Some((owner, bytes, _)) = map.tasks.remove(id)
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
