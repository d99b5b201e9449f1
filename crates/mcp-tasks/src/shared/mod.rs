//! The state one runtime shares between its dispatcher, its actors and its reaper: the bottom
//! layer above the store, the domain and the tool registry.
//!
//! `Shared` (store, tools, clock, config, live tasks, catalog, request-state codec, quotas),
//! `LiveTasks` (the live tasks by id with their committed snapshots and the messages their
//! actors take), [`RuntimeConfig`], [`RuntimeError`] and the MRTR `requestState` codec. The
//! actors, the dispatcher and the runtime build on this module; it names none of them.

mod changes;
mod config;
mod error;
pub(crate) mod flow;
mod live;
pub(crate) mod request_state;

pub(crate) use changes::{Changes, Recovery};
#[cfg(feature = "console")]
pub(crate) use changes::{TaskChange, tool_error};
pub use config::RuntimeConfig;
pub use error::RuntimeError;
pub(crate) use live::{LiveTask, LiveTasks, SharedCapabilities, TaskMsg};

use std::sync::Arc;

use crate::clock::Clock;
use crate::persist;
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
    /// The client capabilities of the tasks this runtime creates, one value per distinct
    /// declaration (a live task's record holds them for its whole life).
    pub(crate) capabilities: SharedCapabilities,
    pub(crate) catalog: crate::catalog::Catalog,
    pub(crate) request_state: request_state::RequestStateCodec,
    /// Becomes `true` when the runtime shuts down: listen streams end with their result.
    pub(crate) closing: tokio::sync::watch::Receiver<bool>,
    /// Per-owner quota counters.
    pub(crate) quotas: Arc<crate::quota::QuotaTracker>,
    /// Every committed change of a task, for observers of all tasks (the console).
    pub(crate) changes: Changes,
    /// How the last start's rehydration went (set once by the supervisor).
    pub(crate) recovery: std::sync::OnceLock<Recovery>,
    /// Flow control: the running-task limits' slots and queue (this runtime's own).
    pub(crate) flow: Arc<flow::Flow>,
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
        let (bytes, constant_tail) = persist::encode_parts(record)?;
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
            constant_tail,
            live,
            due_ms,
            seq: Some(record.seq),
            expect,
            owner: Some(crate::persist::owner_entry_of(record)),
            listing: Some(crate::persist::listing_of(record)),
        })
    }

    /// Deletes the stored tasks `ids` with their index entries, in one commit: the one way a
    /// running runtime deletes tasks (the reaper's deletions, the console's purge; offline,
    /// `store purge` deletes from the file). Callers delete finished tasks, which are never
    /// written again (so no actor and no other node's lease is involved), and records too
    /// damaged to be tasks; an id not stored is nothing to delete.
    pub(crate) async fn delete(&self, ids: Vec<String>) -> Result<(), crate::store::StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        let count = ids.len();
        let ops = ids.into_iter().map(|id| WriteOp::Delete { id }).collect();
        self.store.commit(ops).await?;
        tracing::debug!(count, "deleted stored tasks");
        Ok(())
    }

    /// Commits `record` durably (group-committed with whatever else is queued).
    pub(crate) async fn commit(&self, record: &TaskRecord) -> Result<(), RuntimeError> {
        let op = self.write_op(record)?;
        self.store.commit(vec![op]).await?;
        self.changes.committed(record);
        Ok(())
    }

    /// [`Shared::load_as`] of any owner's task (the console, the runtime's own tests).
    #[cfg(any(test, feature = "console"))]
    pub(crate) async fn load(&self, id: &TaskId) -> Result<Option<Arc<TaskRecord>>, RuntimeError> {
        self.load_as(id, None).await
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
    ///
    /// With `owner`, a stored record of another owner is not decoded (and not served).
    async fn load_as(
        &self,
        id: &TaskId,
        owner: Option<&Owner>,
    ) -> Result<Option<Arc<TaskRecord>>, RuntimeError> {
        // On a store shared by replicas, another node may have changed the task since this
        // node's actor last committed (it took the task over): the store is the truth, except
        // for a task this node holds a valid lease of, whose record only this node's actor
        // writes: its committed snapshot is the record once no commit of it is in flight
        // (docs/SCALE-OUT.md, "Reads from the lease holder").
        if self.store.is_shared() {
            if self.store.reads_from_memory(id.as_str())
                && let Some(snapshot) = self
                    .live
                    .settled_snapshot(id, std::time::Duration::from_millis(250))
                    .await
                && owner.is_none_or(|o| snapshot.owner.same_as(o))
                // Checked again: the lease must still hold when the answer is chosen.
                && self.store.reads_from_memory(id.as_str())
            {
                return Ok(Some(snapshot));
            }
            return self.load_stored_as(id, owner).await;
        }
        if let Some(snapshot) = self.live.snapshot(id) {
            return Ok(Some(snapshot));
        }
        let stored = self.load_stored_as(id, owner).await?;
        if let Some(snapshot) = self.live.snapshot(id) {
            return Ok(Some(snapshot));
        }
        Ok(stored)
    }

    /// The task `id` as [`Shared::load_as`] serves it, when `owner` owns it; `None` for an
    /// unknown id and for another owner's task alike, after the same work. A live task is
    /// served from memory, which an unknown id cannot be; so a live task of another owner is
    /// read from the store as well, exactly as an unknown id is, and the time of the answer
    /// does not tell the two apart. A stored record is decoded only once its owner, read
    /// from the record's first fields ([`persist::decode_owner`]), is the caller: another
    /// owner's task costs the store read and that header, never the decode of its arguments,
    /// results and journal. Tests: `crates/mcp-tasks-cli/tests/it/runtime.rs`
    /// `a_foreign_task_costs_the_store_read_an_unknown_id_costs` and
    /// `a_foreign_record_is_not_decoded_past_its_owner`.
    pub(crate) async fn load_for(
        &self,
        id: &TaskId,
        owner: &Owner,
    ) -> Result<Option<Arc<TaskRecord>>, RuntimeError> {
        if !self.store.is_shared()
            && let Some(snapshot) = self.live.snapshot(id)
        {
            if snapshot.owner.same_as(owner) {
                return Ok(Some(snapshot));
            }
            let _ = self.load_stored_as(id, Some(owner)).await?;
            let _ = self.live.snapshot(id);
            return Ok(None);
        }
        let record = self.load_as(id, Some(owner)).await?;
        Ok(record.filter(|r| r.owner.same_as(owner)))
    }

    /// The task as the store has it.
    pub(crate) async fn load_stored(
        &self,
        id: &TaskId,
    ) -> Result<Option<Arc<TaskRecord>>, RuntimeError> {
        self.load_stored_as(id, None).await
    }

    /// [`Shared::load_stored`]; with `owner`, the record is decoded only once its owner,
    /// read from its first fields, is `owner` (`None` otherwise, as for an unknown id).
    async fn load_stored_as(
        &self,
        id: &TaskId,
        owner: Option<&Owner>,
    ) -> Result<Option<Arc<TaskRecord>>, RuntimeError> {
        let Some(bytes) = self.store.get(id.as_str()).await? else {
            return Ok(None);
        };
        if let Some(owner) = owner
            && !persist::decode_owner(&bytes)?.same_as(owner)
        {
            return Ok(None);
        }
        Ok(Some(Arc::new(persist::decode(&bytes)?)))
    }
}
