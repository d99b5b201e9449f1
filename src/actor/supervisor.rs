//! The supervisor: spawns task actors, rehydrates live tasks at start, restarts failed task
//! actors from their last durable snapshot with backoff, and gives up on a task (marks it
//! `failed` with a diagnostic) after a restart budget.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

use super::{Shared, StoreFailure, TaskActor};
use crate::error::{RpcError, RuntimeError, code};
use crate::persist;
use crate::task::{Event, Outcome, TaskError, TaskId, TaskRecord, apply};

/// Messages the supervisor handles. None of them touch the read path of `tasks/get`.
pub(crate) enum SupervisorMsg {
    /// Start the actor of a task that was just committed.
    Spawn(Arc<TaskRecord>, RpcReplyPort<Result<(), RpcError>>),
    /// Make sure a stored, non-terminal task has a running actor (rehydrate on touch).
    Ensure(TaskId, RpcReplyPort<Result<(), RpcError>>),
    /// Restart a failed task actor (sent by the backoff timer).
    Restart(TaskId),
    /// Answers once the supervisor handles messages, i.e. after start-up rehydration.
    Ready(RpcReplyPort<()>),
}

pub(crate) struct Supervisor {
    pub(crate) shared: Arc<Shared>,
}

#[derive(Default)]
pub(crate) struct SupervisorState {
    tasks_by_actor: HashMap<ActorId, TaskId>,
    failures: HashMap<TaskId, u32>,
    /// Consecutive store failures per task (commits or reads that failed): they set the
    /// backoff of the next restart but never use up the restart budget.
    store_failures: HashMap<TaskId, u32>,
}

impl Supervisor {
    async fn spawn_task(
        &self,
        myself: &ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
        record: Arc<TaskRecord>,
    ) -> Result<(), RuntimeError> {
        if record.status.is_terminal() || self.shared.live.get(&record.id).is_some() {
            return Ok(());
        }
        let id = record.id.clone();
        let actor = TaskActor {
            shared: self.shared.clone(),
        };
        let (actor_ref, _) = Actor::spawn_linked(None, actor, record, myself.get_cell())
            .await
            .map_err(|e| RuntimeError::Actor(format!("task actor {id} did not start: {e}")))?;
        state.tasks_by_actor.insert(actor_ref.get_id(), id);
        Ok(())
    }

    /// Loads a stored task and spawns its actor if it is still live.
    async fn rehydrate(
        &self,
        myself: &ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
        id: &TaskId,
    ) -> Result<(), RuntimeError> {
        if self.shared.live.get(id).is_some() {
            return Ok(());
        }
        match self.shared.load_stored(id).await? {
            Some(record) => self.spawn_task(myself, state, record).await,
            None => Ok(()),
        }
    }

    /// Rehydrates every live task of the store (the live index only: start-up time grows
    /// with live tasks, not with stored ones).
    async fn rehydrate_all(
        &self,
        myself: &ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let live = self.shared.store.live().await?;
        let count = live.len();
        for (id, bytes) in live {
            #[cfg(feature = "failpoints")]
            fail::fail_point!("supervisor::rehydrate");
            match persist::decode(&bytes) {
                Ok(record) => {
                    if let Err(e) = self.spawn_task(myself, state, Arc::new(record)).await {
                        tracing::error!(task = %id, error = %e, "could not rehydrate task");
                    }
                }
                Err(e) => {
                    tracing::error!(task = %id, error = %e, "stored snapshot does not decode")
                }
            }
        }
        if count > 0 {
            tracing::info!(tasks = count, "rehydrated live tasks");
        }
        Ok(())
    }

    fn backoff(&self, failures: u32) -> Duration {
        let base = self.shared.config.restart_backoff;
        let factor = 1u32 << failures.saturating_sub(1).min(6);
        (base * factor).min(Duration::from_secs(30))
    }

    /// Marks a task that failed too often as `failed`, durably.
    async fn give_up(&self, id: &TaskId, failures: u32, detail: &str) -> Result<(), RuntimeError> {
        let Some(record) = self.shared.load_stored(id).await? else {
            return Ok(());
        };
        let error = TaskError {
            code: code::INTERNAL_ERROR,
            message: format!("the task failed {failures} times and was given up: {detail}"),
            data: None,
        };
        if let Some(next) = apply(
            &record,
            Event::Finish(Outcome::Error(error)),
            self.shared.now_ms(),
        )? {
            self.shared.commit(&next).await?;
        }
        Ok(())
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
            SupervisorMsg::Spawn(record, port) => {
                let r = self.spawn_task(&myself, state, record).await;
                let _ = port.send(r.map_err(RpcError::from));
            }
            SupervisorMsg::Ensure(id, port) => {
                let r = self.rehydrate(&myself, state, &id).await;
                let _ = port.send(r.map_err(RpcError::from));
            }
            SupervisorMsg::Ready(port) => {
                let _ = port.send(());
            }
            SupervisorMsg::Restart(id) => match self.rehydrate(&myself, state, &id).await {
                Ok(()) => {}
                Err(RuntimeError::Store(e)) => {
                    // The store is failing (I/O error, reopening): try again later; the task
                    // must not stay without an actor once the store is back.
                    let failures = state.store_failures.entry(id.clone()).or_default();
                    *failures += 1;
                    let delay = self.backoff(*failures);
                    tracing::warn!(task = %id, error = %e, ?delay, "could not restart task actor; retrying");
                    myself.send_after(delay, move || SupervisorMsg::Restart(id));
                }
                Err(e) => {
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
                    state.failures.remove(&id);
                    state.store_failures.remove(&id);
                }
            }
            SupervisionEvent::ActorFailed(cell, error) => {
                let Some(id) = state.tasks_by_actor.remove(&cell.get_id()) else {
                    return Ok(());
                };
                self.shared.live.remove_if(&id, cell.get_id());
                if error.downcast_ref::<StoreFailure>().is_some() {
                    let failures = state.store_failures.entry(id.clone()).or_default();
                    *failures += 1;
                    let delay = self.backoff(*failures);
                    tracing::warn!(task = %id, ?delay, error = %error, "a commit of the task failed; restarting its actor from the store");
                    myself.send_after(delay, move || SupervisorMsg::Restart(id));
                    return Ok(());
                }
                let failures = state.failures.entry(id.clone()).or_default();
                *failures += 1;
                let failures = *failures;
                if failures > self.shared.config.restart_budget {
                    tracing::error!(task = %id, failures, error = %error, "giving up on task");
                    state.failures.remove(&id);
                    if let Err(e) = self.give_up(&id, failures, &error.to_string()).await {
                        tracing::error!(task = %id, error = %e, "could not mark task failed");
                    }
                } else {
                    let delay = self.backoff(failures);
                    tracing::warn!(task = %id, failures, ?delay, error = %error, "task actor failed; restarting");
                    myself.send_after(delay, move || SupervisorMsg::Restart(id));
                }
            }
            _ => {}
        }
        Ok(())
    }
}
