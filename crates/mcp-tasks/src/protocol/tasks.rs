//! `tasks/get`, `tasks/update`, `tasks/cancel`.

use std::sync::Arc;

use ractor::rpc::CallResult;
use serde_json::{Map, Value};
use tokio::sync::watch;

use super::{Dispatcher, RequestContext};
use crate::actor::SupervisorMsg;
use crate::persist::command::{self as node_command, NodeCommand};
use crate::shared::TaskMsg;
use crate::store::{Cluster, RemoteCommand};
use crate::task::{TaskId, TaskRecord};
use crate::wire::error::RpcError;
use crate::wire::params::{TaskIdParams, UpdateTaskParams};
use crate::wire::results;

impl Dispatcher {
    /// Resolves a task id for `ctx`'s owner: malformed, unknown, foreign and expired ids are
    /// all `-32602`; a foreign task reads exactly like an unknown one, after the same work (a
    /// store read, also for another owner's live task: [`crate::shared::Shared::load_for`]).
    /// The owner check compares in constant time; only the owner learns that a task expired.
    async fn resolve(
        &self,
        raw_id: &str,
        ctx: &RequestContext,
    ) -> Result<Arc<TaskRecord>, RpcError> {
        let id = TaskId::parse(raw_id).map_err(RpcError::invalid_params)?;
        let record = self
            .shared
            .load_for(&id, &ctx.owner)
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
    ) -> Result<Arc<TaskRecord>, RpcError> {
        let p = TaskIdParams::parse(params)?;
        self.resolve(&p.task_id, ctx).await
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
        self.command(&record, NodeCommand::Update(responses))
            .await?;
        Ok(results::ack(&self.shared.config.server_info))
    }

    pub(super) async fn cancel_task(
        &self,
        params: Option<&Map<String, Value>>,
        ctx: &RequestContext,
    ) -> Result<Value, RpcError> {
        let p = TaskIdParams::parse(params)?;
        let record = self.resolve(&p.task_id, ctx).await?;
        self.command(&record, NodeCommand::Cancel).await?;
        Ok(results::ack(&self.shared.config.server_info))
    }

    /// Delivers a command to the task's actor and waits until it is committed. A finished
    /// task acknowledges without change (late answers and cancels are ignored).
    ///
    /// On a store shared by replicas, a task that another live node runs gets the command
    /// through the store: it is recorded durably for that node, which is woken by a
    /// notification (or finds it at its next poll), applies it through its actor and records
    /// the answer; this request acknowledges once that answer is there, so the ack follows the
    /// durable write of the task, as on one node.
    ///
    /// A local actor that refuses the command because this node lost the task's lease, or
    /// because the record moved under it (see `TaskActor::confirm_unchanged`), leaves it
    /// unapplied: the command is then given once more, from a fresh read of the record, to
    /// the node holding the task (or to a takeover here).
    async fn command(&self, record: &TaskRecord, command: NodeCommand) -> Result<(), RpcError> {
        self.command_once(record, &command, true).await
    }

    /// [`Dispatcher::command`]; `retry` = a refusal by a stale local actor is retried once.
    fn command_once<'a>(
        &'a self,
        record: &'a TaskRecord,
        command: &'a NodeCommand,
        retry: bool,
    ) -> futures::future::BoxFuture<'a, Result<(), RpcError>> {
        Box::pin(self.command_inner(record, command, retry))
    }

    async fn command_inner(
        &self,
        record: &TaskRecord,
        command: &NodeCommand,
        retry: bool,
    ) -> Result<(), RpcError> {
        if record.status.is_terminal() {
            return Ok(());
        }
        let store = &self.shared.store;
        if let Some(cluster) = store.cluster()
            && !store.holds(record.id.as_str())
            && let Some(answer) = self.send_to_owner(cluster, &record.id, command).await?
        {
            return answer;
        }
        // On a shared store, a task whose lease no live node holds, or whose local actor is
        // behind the record just read (another node changed it), is taken over first: the
        // request is applied here to the latest record, durably, and the other node's actor
        // is fenced at its next write. (A stale actor would ignore an answer for a key it
        // never saw issued, and acknowledge it.)
        let take_over =
            store.is_shared() && (!store.holds(record.id.as_str()) || self.is_behind(record));
        if let Some(answer) = self.deliver(&record.id, command, take_over).await {
            if let Err(e) = &answer
                && retry
                && store.is_shared()
                && let Some(fresh) = self.shared.load_stored(&record.id).await?
            {
                let stale = !store.holds(record.id.as_str())
                    || self
                        .shared
                        .live
                        .snapshot(&record.id)
                        .is_none_or(|local| local.seq < fresh.seq);
                if fresh.status.is_terminal() {
                    return Ok(());
                }
                if stale {
                    tracing::info!(task = %record.id, error = %e.message,
                        "a request refused by a stale local actor goes to the task's current holder");
                    return self.command_once(&fresh, command, false).await;
                }
            }
            return answer;
        }
        // No actor answered: the task may have just finished, which acknowledges.
        match self.shared.load_stored(&record.id).await? {
            Some(stored) if stored.status.is_terminal() => Ok(()),
            _ => Err(RpcError::internal("the task is restarting; retry shortly")),
        }
    }

    /// Whether this node's actor for the task is behind `record` (read from the store): another
    /// node changed the task since the actor last committed.
    fn is_behind(&self, record: &TaskRecord) -> bool {
        #[cfg(feature = "failpoints")]
        if crate::failpoints::breaker("break::skip_is_behind") {
            // Deliberately broken (test-only): the check-then-act window taken every time.
            return false;
        }
        self.shared
            .live
            .snapshot(&record.id)
            .is_some_and(|local| local.seq < record.seq)
    }

    /// Gives `command` to the task's local actor (started first if the task has none;
    /// `take_over` = claimed for this node first) and returns its answer; `None` when no
    /// actor answered.
    async fn deliver(
        &self,
        id: &TaskId,
        command: &NodeCommand,
        take_over: bool,
    ) -> Option<Result<(), RpcError>> {
        // Three looks: an actor found may stop before it takes the command (it finished, or
        // was passivated with the command in its mailbox), and a parked task is started.
        for attempt in 0..3 {
            let local = if take_over && attempt == 0 {
                None
            } else {
                // Also an actor whose task's creation commit is in flight: the command waits
                // in its mailbox until the commit is acknowledged.
                self.shared.live.actor_of(id)
            };
            let live = match local {
                Some(live) => live,
                None if attempt < 2 => {
                    // A stored live task without an actor (parked, restarting, or its spawn
                    // failed).
                    let id = id.clone();
                    let started = if take_over && attempt == 0 {
                        self.supervisor
                            .call(|port| SupervisorMsg::TakeOver(id, port), None)
                            .await
                    } else {
                        self.supervisor
                            .call(|port| SupervisorMsg::Ensure(id, port), None)
                            .await
                    };
                    // A takeover refused by the store (the row is locked by a paused
                    // replica's transaction: busy) is the answer: nothing was taken over.
                    if take_over
                        && attempt == 0
                        && let Ok(CallResult::Success(Err(e))) = started
                    {
                        return Some(Err(e));
                    }
                    continue;
                }
                None => break,
            };
            let outcome = match command {
                NodeCommand::Update(responses) => {
                    let responses = responses.clone();
                    live.actor
                        .call(|port| TaskMsg::Update(responses, port), None)
                        .await
                }
                NodeCommand::Cancel => live.actor.call(TaskMsg::Cancel, None).await,
            };
            match outcome {
                Ok(CallResult::Success(result)) => return Some(result),
                // The actor stopped between lookup and call: look again.
                _ => continue,
            }
        }
        None
    }

    /// Records `command` for the live node that holds task `id` and waits for its answer.
    /// `Ok(None)`: no other live node holds it (nothing was recorded; take it over).
    async fn send_to_owner(
        &self,
        cluster: &dyn Cluster,
        id: &TaskId,
        command: &NodeCommand,
    ) -> Result<Option<Result<(), RpcError>>, RpcError> {
        // Watching before recording: an answer that comes before the wait is kept.
        let wake = cluster.watch_task(id.as_str());
        let Some(seq) = cluster
            .send_command(id.as_str(), node_command::encode_command(command))
            .await?
        else {
            return Ok(None);
        };
        let poll = cluster.poll_interval();
        // Long enough for the task to be taken over from a node that died or paused (the
        // new owner answers the recorded command).
        let limit = cluster.lease_ttl() * 2 + poll;
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(answer) = cluster.take_answer(seq).await? {
                return Ok(Some(decode_answer(&answer)));
            }
            // Finished (or gone) without answering: a finished task acknowledges.
            match self.shared.load_stored(id).await? {
                Some(stored) if !stored.status.is_terminal() => {}
                _ => {
                    cluster.forget_command(seq).await?;
                    return Ok(Some(Ok(())));
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return self.give_up_waiting(cluster, id, seq, limit).await;
            }
            tokio::select! {
                _ = wake.notified() => {}
                _ = tokio::time::sleep(poll) => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    /// The sender of command `seq` stops waiting: a definite answer when there can be one.
    /// A command no node has taken yet is withdrawn (no node will ever apply it); one a node
    /// took but did not answer in time may or may not have been applied, and the node holding
    /// the task still applies it (at its next poll) if it was not.
    async fn give_up_waiting(
        &self,
        cluster: &dyn Cluster,
        id: &TaskId,
        seq: u64,
        limit: std::time::Duration,
    ) -> Result<Option<Result<(), RpcError>>, RpcError> {
        let secs = limit.as_secs();
        match cluster.withdraw_command(seq).await {
            Ok(true) => Err(RpcError::internal(format!(
                "no node running task {id} took this request within {secs} s; it was withdrawn and not applied: send it again"
            ))),
            Ok(false) => match cluster.take_answer(seq).await {
                Ok(Some(answer)) => Ok(Some(decode_answer(&answer))),
                _ => Err(RpcError::internal(format!(
                    "the node running task {id} took this request but did not answer within {secs} s: it may have been applied (read the task before sending it again); if it was not, the node holding the task applies it"
                ))),
            },
            Err(e) => Err(RpcError::internal(format!(
                "the node running task {id} did not answer this request within {secs} s, and withdrawing it failed ({e}): it may still be applied (read the task before sending it again)"
            ))),
        }
    }

    /// On a store shared by replicas: answers the commands other nodes recorded for the tasks
    /// this node runs, when woken by a notification and every poll interval, until `stop`.
    pub(crate) async fn serve_inbox(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let Some(cluster) = self.shared.store.cluster() else {
            return;
        };
        let wake = cluster.watch_inbox();
        let poll = cluster.poll_interval();
        loop {
            if *stop.borrow() {
                return;
            }
            match cluster.inbox().await {
                Ok(commands) => {
                    for c in commands {
                        self.answer_remote(cluster, c).await;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reading requests other nodes recorded for this node failed; retrying")
                }
            }
            tokio::select! {
                _ = wake.notified() => {}
                _ = tokio::time::sleep(poll) => {}
                _ = stop.changed() => return,
            }
        }
    }

    async fn answer_remote(&self, cluster: &dyn Cluster, c: RemoteCommand) {
        // Not (or no longer) this node's: the node holding the task answers it.
        if !self.shared.store.holds(&c.task_id) {
            return;
        }
        // Taken first: a command its sender withdrew (it stopped waiting) is never applied.
        match cluster.take_command(c.seq).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(_) => return, // asked again at the next poll
        }
        let answer = match (
            TaskId::parse(&c.task_id),
            node_command::decode_command(&c.body),
        ) {
            (Ok(id), Ok(command)) => {
                // As for a request made here: an actor behind the stored record (another node
                // changed the task meanwhile) would ignore an answer for a key it never saw
                // issued and acknowledge it; the task is taken over first instead.
                let take_over = match self.shared.load_stored(&id).await {
                    Ok(Some(stored)) => self.is_behind(&stored),
                    Ok(None) => false,
                    Err(_) => return, // asked again at the next poll
                };
                self.answer_here(&id, &command, take_over).await
            }
            (Err(e), _) => Some(Err(RpcError::internal(format!("invalid task id: {e}")))),
            (_, Err(e)) => Some(Err(RpcError::internal(e.to_string()))),
        };
        let Some(answer) = answer else { return };
        // Fenced meanwhile (another node took the task over): that node answers it.
        if answer.is_err() && !self.shared.store.holds(&c.task_id) {
            return;
        }
        if let Err(e) = cluster
            .answer_command(c.seq, &c.task_id, node_command::encode_answer(&answer))
            .await
        {
            tracing::warn!(task = %c.task_id, error = %e, "recording the answer of another node's request failed; it is applied again at the next poll");
        }
    }

    /// A recorded command applied by this node's actor; `None` while the task restarts (it is
    /// asked again at the next poll).
    async fn answer_here(
        &self,
        id: &TaskId,
        command: &NodeCommand,
        take_over: bool,
    ) -> Option<Result<(), RpcError>> {
        match self.deliver(id, command, take_over).await {
            // Refused by a stale actor (fenced, or behind the record under this node's own
            // lease; see `TaskActor::confirm_unchanged`): not answered now. The command is
            // asked again at the next poll, of the node holding the task then (this node's
            // actor rebuilt from the store, or another node).
            Some(Err(e)) => match self.shared.load_stored(id).await {
                Ok(Some(stored)) if stored.status.is_terminal() => Some(Ok(())),
                Ok(Some(stored))
                    if !self.shared.store.holds(id.as_str())
                        || self
                            .shared
                            .live
                            .snapshot(id)
                            .is_none_or(|local| local.seq < stored.seq) =>
                {
                    None
                }
                _ => Some(Err(e)),
            },
            Some(answer) => Some(answer),
            None => match self.shared.load_stored(id).await {
                Ok(Some(stored)) if !stored.status.is_terminal() => None, // restarting
                Ok(_) => Some(Ok(())),
                Err(_) => None,
            },
        }
    }
}

/// A node's answer recorded by another node, as the error its client gets when it does not
/// decode.
fn decode_answer(bytes: &[u8]) -> Result<(), RpcError> {
    node_command::decode_answer(bytes).unwrap_or_else(|e| Err(RpcError::internal(e.to_string())))
}

/// Where a page of [`Dispatcher::owned_tasks`] starts: after this task in (creation time, id)
/// order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct TaskCursor {
    pub(crate) created_at_ms: u64,
    pub(crate) id: String,
}

impl Dispatcher {
    /// One page of `owner`'s unexpired tasks, oldest first, after `after`; and where the
    /// next page starts, when more may follow. Pages through the store's owner index
    /// ([`crate::store::Store::owned`]): only this owner's records are read, at most
    /// `limit + 1` of them and, past the first, none once [`crate::store::MAX_PAGE_BYTES`]
    /// of record bytes are held, so neither the cost nor the memory depends on what other
    /// owners store or on how large the records are. A page cut by bytes may be shorter
    /// than `limit` (even empty, when every record read was expired), its cursor is the
    /// last record read, and the page after it may be empty. Records that do not decode
    /// are skipped (the reaper quarantines them), and so are expired ones.
    pub(crate) async fn owned_tasks(
        &self,
        owner: &crate::task::Owner,
        after: Option<&TaskCursor>,
        limit: usize,
    ) -> Result<(Vec<TaskRecord>, Option<TaskCursor>), RpcError> {
        let now = self.shared.now_ms();
        let key = crate::store::owner_key(&owner.tenant, &owner.principal);
        let limit = limit.clamp(1, crate::store::MAX_PAGE - 1);
        let mut cursor = after.map(|a| crate::store::OwnedCursor {
            created_ms: a.created_at_ms,
            id: a.id.clone(),
        });
        let mut mine: Vec<TaskRecord> = Vec::with_capacity(limit + 1);
        let mut held = 0usize;
        // Whether the last store page ended the owner's tasks.
        let ended = loop {
            let want = limit + 1 - mine.len();
            let page = self.shared.store.owned(&key, cursor.clone(), want).await?;
            let Some(last) = page.last().map(|r| crate::store::OwnedCursor {
                created_ms: r.created_ms,
                id: r.id.clone(),
            }) else {
                break true;
            };
            let bytes: usize = page.iter().map(|r| r.bytes.len()).sum();
            held = held.saturating_add(bytes);
            // Short of both bounds: the store had no more.
            let short = page.len() < want && bytes < crate::store::MAX_PAGE_BYTES;
            let owner = owner.clone();
            let decoded: Vec<TaskRecord> = tokio::task::spawn_blocking(move || {
                page.into_iter()
                    .filter_map(|r| crate::persist::decode(&r.bytes).ok())
                    .filter(|r| r.owner.same_as(&owner) && !r.is_expired(now))
                    .collect()
            })
            .await
            .map_err(|e| RpcError::internal(format!("listing tasks failed: {e}")))?;
            mine.extend(decoded);
            cursor = Some(last);
            if short {
                break true;
            }
            if mine.len() > limit || held >= crate::store::MAX_PAGE_BYTES {
                break false;
            }
        };
        // A live task's freshest committed snapshot is its actor's.
        for record in &mut mine {
            if let Some(live) = self.shared.live.snapshot(&record.id)
                && live.seq > record.seq
            {
                *record = (*live).clone();
            }
        }
        let next = if mine.len() > limit {
            mine.truncate(limit);
            mine.last().map(|r| TaskCursor {
                created_at_ms: r.created_at_ms,
                id: r.id.as_str().to_owned(),
            })
        } else if ended {
            None
        } else {
            // Cut by bytes: on after the last record read (kept or skipped).
            cursor.map(|c| TaskCursor {
                created_at_ms: c.created_ms,
                id: c.id,
            })
        };
        Ok((mine, next))
    }
}
