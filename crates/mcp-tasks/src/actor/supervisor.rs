//! The supervisor: spawns task actors, rehydrates live tasks at start, restarts failed task
//! actors from their last durable snapshot with backoff. It never writes a task record: the
//! restart budget is checked by the task's own actor against the persisted attempt counter
//! (see `TaskRecord::attempts`), so a task has one writer.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::sync::oneshot;

use super::task::Start;
use super::{FencedStop, StoreFailure, TaskActor};
use crate::persist;
use crate::shared::RuntimeError;
use crate::shared::Shared;
use crate::task::{TaskId, TaskRecord};
use crate::wire::error::RpcError;

/// Messages the supervisor handles. None of them touch the read path of `tasks/get`.
pub(crate) enum SupervisorMsg {
    /// Start the actor of a task being created, while its creation commit is in flight: the
    /// receiver tells the actor whether the commit succeeded (see `TaskActor::post_start`).
    Spawn(
        Arc<TaskRecord>,
        oneshot::Receiver<bool>,
        RpcReplyPort<Result<(), RpcError>>,
    ),
    /// Make sure a stored, non-terminal task has a running actor (rehydrate on touch).
    Ensure(TaskId, RpcReplyPort<Result<(), RpcError>>),
    /// On a shared store: take the task's lease for this node (whoever holds it) and run it
    /// here from the stored record, replacing a local actor that is behind the store (a
    /// request reached this node for a task another node changed or runs).
    TakeOver(TaskId, RpcReplyPort<Result<(), RpcError>>),
    /// This node just claimed the task's lease (an orphan): start its actor from the record
    /// the claim returned (the stored one, encoded: no other node writes it while this node
    /// holds its lease), replacing an actor left from an earlier lease of this node (its
    /// record may be older than the stored one).
    Claimed(TaskId, Vec<u8>, RpcReplyPort<Result<(), RpcError>>),
    /// On a shared store: this node no longer holds the task's lease (found by reconciling
    /// its leases with the store): its actor stops, without writing, if the lease was not
    /// taken back meanwhile.
    LeaseLost(TaskId, RpcReplyPort<()>),
    /// Restart a failed task actor (sent by the backoff timer).
    Restart(TaskId),
    /// Answers once the supervisor handles messages, i.e. after start-up rehydration.
    Ready(RpcReplyPort<()>),
}

pub(crate) struct Supervisor {
    pub(crate) shared: Arc<Shared>,
    /// Whether the store's previous run ended without a clean shutdown (a crash, a kill, a
    /// power loss): rehydrated `working` tasks then count one more attempt.
    pub(crate) previous_run_crashed: bool,
}

/// A task actor that failed and waits for its restart.
#[derive(Debug, Clone, Default)]
struct Pending {
    /// Consecutive failures in this process (they set the backoff).
    failures: u32,
    /// Whether the next run counts as an attempt (the tool panicked; not after a store
    /// failure, which is not the task's fault).
    count: bool,
    /// How the last run ended.
    cause: Option<String>,
}

#[derive(Default)]
pub(crate) struct SupervisorState {
    tasks_by_actor: HashMap<ActorId, TaskId>,
    /// Failed task actors waiting for their restart, and the backoff of actors restarted
    /// after a failure (removed when the task's actor ends or the task is gone).
    pending: HashMap<TaskId, Pending>,
}

/// The cause of a run that ended with its node's lease lapsing (shared store).
const LAPSED: &str =
    "the node running it stopped without releasing it (a crash, a kill, or a pause past its lease)";

/// How long a claim waits for an actor of the task already running here to stop (its
/// message in progress, a commit at most, ends first); past it the actor is killed.
const STOP_WAIT: Duration = Duration::from_secs(10);

impl Supervisor {
    /// Spawns the actor of a stored task; `false` if the task is terminal or already has one.
    async fn spawn_task(
        &self,
        myself: &ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
        record: Arc<TaskRecord>,
        start: Start,
        creation: Option<oneshot::Receiver<bool>>,
    ) -> Result<bool, RuntimeError> {
        // `actor_of`: also an actor whose task's creation is still being committed.
        if record.status.is_terminal() || self.shared.live.actor_of(&record.id).is_some() {
            return Ok(false);
        }
        let id = record.id.clone();
        let actor = TaskActor {
            shared: self.shared.clone(),
        };
        let args = (record, start, creation);
        let (actor_ref, _) = Actor::spawn_linked(None, actor, args, myself.get_cell())
            .await
            .map_err(|e| RuntimeError::Actor {
                task: id.clone(),
                source: Box::new(e),
            })?;
        state.tasks_by_actor.insert(actor_ref.get_id(), id);
        Ok(true)
    }

    /// Loads a stored task and spawns its actor if it is still live and has none. A pending
    /// restart's attempt is counted by the run that starts now (whoever asks first: the
    /// backoff timer or a client's request).
    async fn rehydrate(
        &self,
        myself: &ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
        id: &TaskId,
    ) -> Result<(), RuntimeError> {
        self.rehydrate_with(myself, state, id, None, false).await
    }

    /// [`Supervisor::rehydrate`]; `claimed`: this node just claimed the task's lease, and the
    /// claim returned these bytes of its record (not read again); `steal` = claim the lease
    /// even if this node holds it.
    async fn rehydrate_with(
        &self,
        myself: &ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
        id: &TaskId,
        claimed: Option<Vec<u8>>,
        steal: bool,
    ) -> Result<(), RuntimeError> {
        let store = &self.shared.store;
        let take_over = store.is_shared() && (steal || !store.holds(id.as_str()));
        let was_claimed = claimed.is_some();
        let mut claimed = claimed;
        match self.shared.live.actor_of(id) {
            // Just claimed, and an actor runs here: one left from a lease this node lost, or
            // one a request started after the claim (the claim's record is handed over after
            // it committed, and a request may have found the task held meanwhile). Either may
            // have committed after the claim read the record, so the claimed bytes may be
            // older than the row: the actor is stopped and waited for (a commit it has in
            // flight lands or fails first), and the task runs from the row read afterwards.
            // Test: `postgres_failpoints.rs::a_claim_handed_over_late_never_replaces_a_newer_actor`.
            Some(running) if claimed.is_some() => {
                self.shared.live.remove_if(id, running.actor.get_id());
                let stopped = running
                    .actor
                    .stop_and_wait(Some("claimed anew".into()), Some(STOP_WAIT))
                    .await;
                if stopped.is_err() {
                    tracing::warn!(task = %id, "the task's actor did not stop in time after a claim; killed");
                    running.actor.kill();
                }
                claimed = None;
            }
            // An actor left from a lease this node lost: it stops, the task is claimed anew
            // and runs from the claimed record (the claim fences any write the old actor
            // still makes).
            Some(stale) if take_over => {
                stale.actor.stop(Some("lease lost".into()));
                self.shared.live.remove_if(id, stale.actor.get_id());
            }
            Some(_) => return Ok(()),
            None => {}
        }
        let (mut count, mut cause) = state
            .pending
            .get(id)
            .map(|p| (p.count, p.cause.clone()))
            .unwrap_or_default();
        // Claimed from a node that stopped without releasing it: that run ended badly, and
        // counts against the task's budget whichever node runs it next (cluster-wide, as the
        // count is in the record), unless that node turns out to have been paused.
        let lapsed = was_claimed && store.took_from_lapsed(id.as_str());
        if lapsed {
            count = true;
            cause.get_or_insert_with(|| LAPSED.to_owned());
        }
        let stored = if let Some(bytes) = claimed {
            Some(Arc::new(persist::decode(&bytes)?))
        } else if take_over {
            match store.claim_one(id.as_str()).await? {
                Some(bytes) => Some(Arc::new(persist::decode(&bytes)?)),
                None => None,
            }
        } else {
            self.shared.load_stored(id).await?
        };
        let spawned = match stored {
            Some(record) => {
                let start = Start::Resume {
                    count,
                    cause,
                    lapsed,
                };
                self.spawn_task(myself, state, record, start, None).await?
            }
            None => false,
        };
        if spawned {
            if let Some(p) = state.pending.get_mut(id) {
                p.count = false;
            }
        } else {
            // Finished or deleted meanwhile: nothing to restart.
            state.pending.remove(id);
        }
        Ok(())
    }

    /// Rehydrates every live task of the store (the live index only: start-up time grows
    /// with live tasks, not with stored ones).
    async fn rehydrate_all(
        &self,
        myself: &ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        // A store owned by this process: every live task. A shared one: the tasks no live
        // node holds, claimed (their lease epochs bumped) for this node.
        let started = std::time::Instant::now();
        let mut live = self.shared.store.claim_live().await?;
        let count = live.len();
        if self.shared.flow.active() {
            // Flow control: the live tasks enter its queue oldest first (creation time, then
            // id), so that the order of the queue is the same as before the restart.
            live.sort_by_cached_key(|(id, bytes)| {
                let created = persist::decode(bytes).map_or(0, |r| r.created_at_ms);
                (created, id.clone())
            });
        }
        let resume = |id: &str| {
            let lapsed = self.shared.store.took_from_lapsed(id);
            Start::Resume {
                count: self.previous_run_crashed || lapsed,
                cause: lapsed.then(|| LAPSED.to_owned()),
                lapsed,
            }
        };
        let mut missing: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (id, bytes) in live {
            #[cfg(feature = "failpoints")]
            fail::fail_point!("supervisor::rehydrate");
            match persist::decode(&bytes) {
                Ok(mut record) => {
                    // Tasks created with the same capabilities share them again.
                    record.client_capabilities = self
                        .shared
                        .capabilities
                        .share_arc(record.client_capabilities);
                    if self.shared.tools.recover(&record.tool).is_none() {
                        missing
                            .entry(record.tool.clone())
                            .or_default()
                            .push(id.clone());
                    }
                    // Waiting for input: parked, its actor started when it is needed.
                    if super::task::may_park(&self.shared, &record)
                        && !record.is_expired(self.shared.now_ms())
                    {
                        self.shared.live.park_stored(&record);
                        continue;
                    }
                    if let Err(e) = self
                        .spawn_task(myself, state, Arc::new(record), resume(&id), None)
                        .await
                    {
                        tracing::error!(task = %id, error = %e, "could not rehydrate task");
                    }
                }
                Err(e) => {
                    tracing::error!(task = %id, error = %e, "stored snapshot does not decode")
                }
            }
        }
        for (tool, tasks) in &missing {
            tracing::error!(tool, tasks = tasks.len(), ids = ?tasks,
                "live tasks name a tool this runtime does not register; they wait for it (register the tool and restart to run them)");
        }
        crate::telemetry::recovered(started.elapsed(), count);
        let took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let _ = self.shared.recovery.set(crate::shared::Recovery {
            started_ms: self.shared.now_ms().saturating_sub(took_ms),
            took_ms,
            rehydrated: count as u64,
        });
        if count > 0 {
            tracing::info!(
                tasks = count,
                parked = self.shared.live.parked(),
                crashed = self.previous_run_crashed,
                "rehydrated live tasks (those waiting for input parked, without an actor)"
            );
        }
        Ok(())
    }

    fn backoff(&self, failures: u32) -> Duration {
        let base = self.shared.config.restart_backoff;
        let factor = 1u32 << failures.saturating_sub(1).min(6);
        (base * factor).min(Duration::from_secs(30))
    }
}

impl Actor for Supervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = ();

    async fn pre_start(
        &self,
        _myself: ActorRef<SupervisorMsg>,
        _args: (),
    ) -> Result<SupervisorState, ActorProcessingErr> {
        Ok(SupervisorState::default())
    }

    async fn post_start(
        &self,
        myself: ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        self.rehydrate_all(&myself, state).await
    }

    async fn handle(
        &self,
        myself: ActorRef<SupervisorMsg>,
        message: SupervisorMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SupervisorMsg::Spawn(record, creation, port) => {
                let r = self
                    .spawn_task(&myself, state, record, Start::Fresh, Some(creation))
                    .await;
                let _ = port.send(r.map(|_| ()).map_err(RpcError::from));
            }
            SupervisorMsg::Ensure(id, port) => {
                let r = self.rehydrate(&myself, state, &id).await;
                let _ = port.send(r.map_err(RpcError::from));
            }
            SupervisorMsg::TakeOver(id, port) => {
                let r = self.rehydrate_with(&myself, state, &id, None, true).await;
                let _ = port.send(r.map_err(RpcError::from));
            }
            SupervisorMsg::Claimed(id, bytes, port) => {
                let r = self
                    .rehydrate_with(&myself, state, &id, Some(bytes), false)
                    .await;
                let _ = port.send(r.map_err(RpcError::from));
            }
            SupervisorMsg::Ready(port) => {
                let _ = port.send(());
            }
            SupervisorMsg::LeaseLost(id, port) => {
                if !self.shared.store.holds(id.as_str()) {
                    self.shared.live.forget_parked(&id);
                    if let Some(stale) = self.shared.live.actor_of(&id) {
                        tracing::info!(task = %id, "task actor stops: this node lost the task's lease");
                        stale.actor.stop(Some("lease lost".into()));
                        self.shared.live.remove_if(&id, stale.actor.get_id());
                        state.pending.remove(&id);
                    }
                }
                let _ = port.send(());
            }
            SupervisorMsg::Restart(id) => match self.rehydrate(&myself, state, &id).await {
                Ok(()) => {}
                Err(RuntimeError::Store(e)) => {
                    // The store is failing (I/O error, reopening): try again later; the task
                    // must not stay without an actor once the store is back.
                    let pending = state.pending.entry(id.clone()).or_default();
                    pending.failures = pending.failures.saturating_add(1);
                    let delay = self.backoff(pending.failures);
                    tracing::warn!(task = %id, error = %e, ?delay, "could not restart task actor; retrying");
                    myself.send_after(delay, move || SupervisorMsg::Restart(id));
                }
                Err(e) => {
                    state.pending.remove(&id);
                    tracing::error!(task = %id, error = %e, "could not restart task actor");
                }
            },
        }
        Ok(())
    }

    /// Never the ractor default (which stops the supervisor when any child exits).
    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<SupervisorMsg>,
        event: SupervisionEvent,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorTerminated(cell, _, _) => {
                if let Some(id) = state.tasks_by_actor.remove(&cell.get_id()) {
                    self.shared.live.remove_if(&id, cell.get_id());
                    state.pending.remove(&id);
                }
            }
            SupervisionEvent::ActorFailed(cell, error) => {
                let Some(id) = state.tasks_by_actor.remove(&cell.get_id()) else {
                    return Ok(());
                };
                self.shared.live.remove_if(&id, cell.get_id());
                if error.downcast_ref::<FencedStop>().is_some() {
                    // Another node runs the task now: nothing to restart here.
                    state.pending.remove(&id);
                    tracing::info!(task = %id, "task actor stopped: the task was taken over by another node");
                    return Ok(());
                }
                let store_failure = error.downcast_ref::<StoreFailure>().is_some();
                let pending = state.pending.entry(id.clone()).or_default();
                pending.failures = pending.failures.saturating_add(1);
                // A panic counts against the task's persisted attempts (the actor of the next
                // run checks the budget); a store failure never does.
                pending.count |= !store_failure;
                if !store_failure {
                    pending.cause = Some(error.to_string());
                }
                let delay = self.backoff(pending.failures);
                if store_failure {
                    tracing::warn!(task = %id, ?delay, error = %error, "a commit of the task failed; restarting its actor from the store");
                } else {
                    tracing::warn!(task = %id, failures = pending.failures, ?delay, error = %error, "task actor failed; restarting");
                }
                myself.send_after(delay, move || SupervisorMsg::Restart(id));
            }
            _ => {}
        }
        Ok(())
    }
}
