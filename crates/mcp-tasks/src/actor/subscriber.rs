//! Subscriber actors: one per `subscriptions/listen` request. A subscriber follows the committed
//! snapshots of the tasks it acknowledged and writes them as `notifications/tasks` to a
//! bounded output channel (the listen stream).
//!
//! Backpressure: the output holds a few messages; beyond that the subscriber keeps only the
//! *latest* snapshot per task (every notification is a full snapshot, so skipping an
//! intermediate one is safe). A terminal snapshot is the last one of its task, so it is never
//! dropped. Memory per listener is bounded by the number of tasks it follows.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use serde_json::{Value, json};
use tokio::sync::mpsc::{self, OwnedPermit, error::TrySendError};
use tokio::task::JoinHandle;

use crate::shared::Shared;
use crate::task::{TaskId, TaskRecord};
use crate::wire::keys;

/// How many notifications wait in a listen stream before the latest-wins map takes over.
pub(crate) const OUTPUT_CAPACITY: usize = 16;

pub(crate) enum SubscriberMsg {
    /// A committed snapshot of a followed task.
    Snapshot(Arc<TaskRecord>),
    /// Room in the output for one more message.
    Permit(OwnedPermit<Value>),
    /// The listen stream was closed by its reader.
    Closed,
}

pub(crate) struct SubscriberArgs {
    /// The listen request's id (same JSON type), echoed as `subscriptionId`.
    pub(crate) subscription_id: Value,
    pub(crate) tasks: Vec<TaskId>,
    pub(crate) out: mpsc::Sender<Value>,
}

pub(crate) struct Subscriber {
    pub(crate) shared: Arc<Shared>,
}

struct Aborting(JoinHandle<()>);

impl Drop for Aborting {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub(crate) struct SubscriberState {
    subscription_id: Value,
    out: mpsc::Sender<Value>,
    /// Snapshots not yet written, oldest first, at most one per task.
    pending: VecDeque<TaskId>,
    latest: HashMap<TaskId, Arc<TaskRecord>>,
    /// The highest sequence number accepted per task: nothing older is ever written.
    seen: HashMap<TaskId, u64>,
    waiting_for_room: bool,
    _followers: Vec<Aborting>,
    /// Counts this listen in `mcp_tasks_subscriptions` while it lives.
    _gauge: crate::telemetry::SubscriptionGauge,
}

impl SubscriberState {
    fn accept(&mut self, snapshot: Arc<TaskRecord>) {
        let seen = self.seen.entry(snapshot.id.clone()).or_insert(0);
        if snapshot.seq <= *seen {
            return;
        }
        // Snapshots committed since the last one accepted that never reached this listener
        // (the follower's watch channel keeps only the latest): skipped, latest wins. Before
        // the first one accepted nothing was followed yet.
        if *seen > 0 && snapshot.seq > *seen + 1 {
            crate::telemetry::subscription_dropped(snapshot.seq - *seen - 1);
        }
        *seen = snapshot.seq;
        if self
            .latest
            .insert(snapshot.id.clone(), snapshot.clone())
            .is_none()
        {
            self.pending.push_back(snapshot.id.clone());
        } else {
            // Latest wins: the older snapshot of this task is never written.
            crate::telemetry::subscription_dropped(1);
        }
    }

    fn notification(&self, record: &TaskRecord, shared: &Shared) -> Value {
        let mut params = crate::task::json::detailed_task(record, &shared.config.server_info);
        params.insert(
            "_meta".into(),
            json!({ keys::SUBSCRIPTION_ID: self.subscription_id.clone() }),
        );
        json!({ "jsonrpc": "2.0", "method": "notifications/tasks", "params": params })
    }

    fn pop(&mut self) -> Option<Arc<TaskRecord>> {
        let id = self.pending.pop_front()?;
        self.latest.remove(&id)
    }

    fn push_front(&mut self, record: Arc<TaskRecord>) {
        self.pending.push_front(record.id.clone());
        self.latest.insert(record.id.clone(), record);
    }
}

impl Subscriber {
    /// Writes pending snapshots until the output is full; then waits for room.
    fn flush(&self, myself: &ActorRef<SubscriberMsg>, state: &mut SubscriberState) {
        while !state.waiting_for_room {
            let Some(record) = state.pop() else { return };
            let message = state.notification(&record, &self.shared);
            match state.out.try_send(message) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => {
                    state.push_front(record);
                    state.waiting_for_room = true;
                    let out = state.out.clone();
                    let me = myself.clone();
                    tokio::spawn(async move {
                        if let Ok(permit) = out.reserve_owned().await {
                            let _ = me.cast(SubscriberMsg::Permit(permit));
                        }
                    });
                }
                Err(TrySendError::Closed(_)) => {
                    myself.stop(None);
                    return;
                }
            }
        }
    }
}

/// Whether a follower follows the task's local actor. On a store shared by replicas, only
/// while the actor is not behind the stored record: an actor left from a lease this node
/// lost (another node changed the task since; its actor here stops once the node notices)
/// would otherwise hold a listen at a state older than what `tasks/get` on this node
/// answers. On a store owned by one process, always.
async fn follows_actor(
    shared: &Shared,
    id: &TaskId,
    snapshots: &tokio::sync::watch::Receiver<Arc<TaskRecord>>,
) -> bool {
    if !shared.store.is_shared() {
        return true;
    }
    let local = snapshots.borrow().seq;
    match shared.load_stored(id).await {
        Ok(Some(stored)) => stored.seq <= local,
        Ok(None) => true,
        Err(_) => true,
    }
}

/// Follows one task's committed snapshots across actor restarts, until it is terminal.
async fn follow(shared: Arc<Shared>, id: TaskId, me: ActorRef<SubscriberMsg>) {
    loop {
        if let Some(live) = shared.live.get(&id)
            && follows_actor(&shared, &id, &live.snapshots).await
        {
            let mut rx = live.snapshots;
            loop {
                let snapshot = rx.borrow_and_update().clone();
                let terminal = snapshot.status.is_terminal();
                if me.cast(SubscriberMsg::Snapshot(snapshot)).is_err() || terminal {
                    return;
                }
                if rx.changed().await.is_err() {
                    break; // the actor stopped: finished, failed or shut down
                }
            }
        }
        // On a store shared by replicas the task may run on another node: watched before the
        // read, so that a commit right after it wakes the next one.
        let cluster = shared.store.cluster();
        let wake = cluster.map(|c| c.watch_task(id.as_str()));
        match shared.load_stored(&id).await {
            Ok(Some(record)) if record.status.is_terminal() => {
                let _ = me.cast(SubscriberMsg::Snapshot(record));
                return;
            }
            // Every committed state read is sent (the subscriber drops any it has seen a
            // newer one of, so none goes backwards); the next read follows the other node's
            // next commit (its notification), or the poll interval if that was lost.
            Ok(Some(record)) if shared.store.is_shared() => {
                if me.cast(SubscriberMsg::Snapshot(record)).is_err() {
                    return;
                }
                match (cluster, &wake) {
                    (Some(cluster), Some(wake)) => tokio::select! {
                        _ = wake.notified() => {}
                        _ = tokio::time::sleep(cluster.poll_interval()) => {}
                    },
                    // A shared store without signalling: polled.
                    _ => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
            // Parked (waiting for input without an actor): its stored state is its latest;
            // the next commit comes from the actor it gets again, which wakes this follower.
            Ok(Some(record)) if shared.live.is_parked(&id) => {
                if me.cast(SubscriberMsg::Snapshot(record)).is_err() {
                    return;
                }
                wait_while_parked(&shared, &id).await;
            }
            Ok(Some(_)) => tokio::time::sleep(Duration::from_millis(50)).await, // restarting
            Ok(None) => return,                                                 // deleted
            Err(e) => {
                tracing::warn!(task = %id, error = %e, "subscriber could not read a task");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Returns once task `id` is no longer parked on this node (it has an actor again, or its
/// entry went). Nothing polls: the parked entry wakes its waiters when it is replaced.
async fn wait_while_parked(shared: &Shared, id: &TaskId) {
    let Some(wake) = shared.live.parked_wake(id) else {
        return;
    };
    let notified = wake.notified();
    tokio::pin!(notified);
    // Registered before looking again: a wake-up between the look and the wait is kept.
    notified.as_mut().enable();
    if shared.live.is_parked(id) {
        notified.await;
    }
}

impl Actor for Subscriber {
    type Msg = SubscriberMsg;
    type State = SubscriberState;
    type Arguments = SubscriberArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<SubscriberMsg>,
        args: SubscriberArgs,
    ) -> Result<SubscriberState, ActorProcessingErr> {
        let mut followers: Vec<Aborting> = args
            .tasks
            .into_iter()
            .map(|id| {
                Aborting(tokio::spawn(follow(
                    self.shared.clone(),
                    id,
                    myself.clone(),
                )))
            })
            .collect();
        let out = args.out.clone();
        let me = myself.clone();
        followers.push(Aborting(tokio::spawn(async move {
            out.closed().await;
            let _ = me.cast(SubscriberMsg::Closed);
        })));
        Ok(SubscriberState {
            subscription_id: args.subscription_id,
            out: args.out,
            pending: VecDeque::new(),
            latest: HashMap::new(),
            seen: HashMap::new(),
            waiting_for_room: false,
            _followers: followers,
            _gauge: crate::telemetry::SubscriptionGauge::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<SubscriberMsg>,
        message: SubscriberMsg,
        state: &mut SubscriberState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SubscriberMsg::Snapshot(snapshot) => state.accept(snapshot),
            SubscriberMsg::Permit(permit) => {
                state.waiting_for_room = false;
                if let Some(record) = state.pop() {
                    permit.send(state.notification(&record, &self.shared));
                }
            }
            SubscriberMsg::Closed => {
                myself.stop(None);
                return Ok(());
            }
        }
        self.flush(&myself, state);
        Ok(())
    }
}
