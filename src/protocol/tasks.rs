//! `tasks/get`, `tasks/update`, `tasks/cancel`.

use std::collections::BTreeMap;
use std::sync::Arc;

use ractor::rpc::CallResult;
use serde_json::{Map, Value};

use super::{Dispatcher, RequestContext};
use crate::actor::SupervisorMsg;
use crate::shared::TaskMsg;
use crate::wire::error::RpcError;
use crate::task::{TaskId, TaskRecord};
use crate::wire::params::{TaskIdParams, UpdateTaskParams};
use crate::wire::results;

/// A client's request to a live task's actor.
enum Command {
    Update(BTreeMap<String, Value>),
    Cancel,
}

impl Dispatcher {
    /// Resolves a task id for `ctx`'s owner: malformed, unknown, foreign and expired ids are
    /// all `-32602`; a foreign task reads exactly like an unknown one. The owner check comes
    /// after the store read on one code path for every well-formed id, and compares in
    /// constant time; only the owner learns that a task expired.
    async fn resolve(
        &self,
        raw_id: &str,
        ctx: &RequestContext,
    ) -> Result<Arc<TaskRecord>, RpcError> {
        let id = TaskId::parse(raw_id).map_err(RpcError::invalid_params)?;
        let record = self
            .shared
            .load(&id)
            .await?
            .ok_or_else(RpcError::task_not_found)?;
        if !record.owner.same_as(&ctx.owner) {
            return Err(RpcError::task_not_found());
        }
        if record.is_expired(self.shared.now_ms()) {
            return Err(RpcError::task_expired());
        }
        Ok(record)
    }

    pub(super) async fn get_task(
        &self,
        params: Option<&Map<String, Value>>,
        ctx: &RequestContext,
    ) -> Result<Value, RpcError> {
        let p = TaskIdParams::parse(params)?;
        let record = self.resolve(&p.task_id, ctx).await?;
        Ok(crate::task::json::get_task(&record, &self.shared.config.server_info))
    }

    pub(super) async fn update_task(
        &self,
        params: Option<&Map<String, Value>>,
        ctx: &RequestContext,
    ) -> Result<Value, RpcError> {
        let p = UpdateTaskParams::parse(params)?;
        self.shared
            .config
            .limits
            .check_input_responses(&p.input_responses)?;
        let record = self.resolve(&p.task_id, ctx).await?;
        let responses = p.input_responses.into_iter().collect();
        self.command(&record, Command::Update(responses)).await?;
        Ok(results::ack(&self.shared.config.server_info))
    }

    pub(super) async fn cancel_task(
        &self,
        params: Option<&Map<String, Value>>,
        ctx: &RequestContext,
    ) -> Result<Value, RpcError> {
        let p = TaskIdParams::parse(params)?;
        let record = self.resolve(&p.task_id, ctx).await?;
        self.command(&record, Command::Cancel).await?;
        Ok(results::ack(&self.shared.config.server_info))
    }

    /// Delivers a command to the task's actor and waits until it is committed. A finished
    /// task acknowledges without change (late answers and cancels are ignored).
    async fn command(&self, record: &TaskRecord, command: Command) -> Result<(), RpcError> {
        if record.status.is_terminal() {
            return Ok(());
        }
        let store = &self.shared.store;
        for attempt in 0..2 {
            // On a shared store, a task whose lease another node holds, or whose local actor
            // is behind the record just read (another node changed it), is taken over first:
            // the request is applied here to the latest record, durably, and the other node's
            // actor is fenced at its next write. (A stale actor would ignore an answer for a
            // key it never saw issued, and acknowledge it.)
            let take_over = store.is_shared()
                && (!store.holds(record.id.as_str())
                    || self
                        .shared
                        .live
                        .snapshot(&record.id)
                        .is_some_and(|local| local.seq < record.seq));
            let local = if take_over {
                None
            } else {
                self.shared.live.get(&record.id)
            };
            let live = match local {
                Some(live) => live,
                None if attempt == 0 => {
                    // A stored live task without an actor (restarting, or its spawn failed).
                    let id = record.id.clone();
                    let _ = if take_over {
                        self.supervisor
                            .call(|port| SupervisorMsg::TakeOver(id, port), None)
                            .await
                    } else {
                        self.supervisor
                            .call(|port| SupervisorMsg::Ensure(id, port), None)
                            .await
                    };
                    continue;
                }
                None => break,
            };
            let outcome = match &command {
                Command::Update(responses) => {
                    let responses = responses.clone();
                    live.actor
                        .call(|port| TaskMsg::Update(responses, port), None)
                        .await
                }
                Command::Cancel => live.actor.call(TaskMsg::Cancel, None).await,
            };
            match outcome {
                Ok(CallResult::Success(result)) => return result,
                // The actor stopped between lookup and call: look again.
                _ => continue,
            }
        }
        // No actor answered: the task may have just finished, which acknowledges.
        match self.shared.load_stored(&record.id).await? {
            Some(stored) if stored.status.is_terminal() => Ok(()),
            _ => Err(RpcError::internal("the task is restarting; retry shortly")),
        }
    }
}

/// Where a page of [`Dispatcher::owned_tasks`] starts: after this task in (creation time, id)
/// order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct TaskCursor {
    pub(crate) created_at_ms: u64,
    pub(crate) id: String,
}

impl Dispatcher {
    /// One page of `owner`'s unexpired tasks, oldest first, after `after`; and whether more
    /// follow. Reads every stored record (the store has no index by owner): the cost grows
    /// with the number of stored tasks, which expiry and retention bound. Records that do
    /// not decode are skipped (the reaper quarantines them).
    pub(crate) async fn owned_tasks(
        &self,
        owner: &crate::task::Owner,
        after: Option<&TaskCursor>,
        limit: usize,
    ) -> Result<(Vec<TaskRecord>, bool), RpcError> {
        let now = self.shared.now_ms();
        let stored = self.shared.store.tasks().await?;
        let owner = owner.clone();
        let after = after.cloned();
        let mut mine: Vec<TaskRecord> = tokio::task::spawn_blocking(move || {
            stored
                .into_iter()
                .filter_map(|(_, bytes)| crate::persist::decode(&bytes).ok())
                .filter(|r| r.owner.same_as(&owner) && !r.is_expired(now))
                .filter(|r| {
                    after.as_ref().is_none_or(|a| {
                        (r.created_at_ms, r.id.as_str()) > (a.created_at_ms, a.id.as_str())
                    })
                })
                .collect()
        })
        .await
        .map_err(|e| RpcError::internal(format!("listing tasks failed: {e}")))?;
        mine.sort_by(|a, b| {
            (a.created_at_ms, a.id.as_str()).cmp(&(b.created_at_ms, b.id.as_str()))
        });
        // A live task's freshest committed snapshot is its actor's.
        for record in &mut mine {
            if let Some(live) = self.shared.live.snapshot(&record.id)
                && live.seq > record.seq
            {
                *record = (*live).clone();
            }
        }
        let more = mine.len() > limit;
        mine.truncate(limit);
        Ok((mine, more))
    }
}
