//! The task actor: owns one live task's record and runs its tool.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::FutureExt;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::shared::flow::{self, Entry, Slot, Ticket};
use crate::shared::{LiveTask, RuntimeError, Shared, TaskMsg};
use crate::store::StoreError;
use crate::task::{Event, TaskError, TaskOutcome, TaskRecord, TransitionError, apply};
use crate::telemetry::{self, TaskGauge};
use crate::tool::context::{EventSink, TaskLink};
use crate::tool::{CallToolResult, ToolContext, ToolError};
use crate::wire::error::{RpcError, code};

/// The least time an actor started for a task that waits for input stays before it may be
/// passivated again (see `TaskActor::arm_passivation`).
const WOKEN_REST: Duration = Duration::from_secs(1);

/// A running tool's events go to its task actor as [`TaskMsg::Tool`].
struct ActorEvents(ActorRef<TaskMsg>);

impl EventSink for ActorEvents {
    fn record(&self, event: Event) -> futures::future::BoxFuture<'_, Result<(), ToolError>> {
        Box::pin(async move {
            match self.0.call(|reply| TaskMsg::Tool(event, reply), None).await {
                Ok(ractor::rpc::CallResult::Success(Ok(()))) => Ok(()),
                Ok(ractor::rpc::CallResult::Success(Err(e))) => {
                    Err(ToolError::runtime_caused("the event was not recorded", e))
                }
                Ok(_) => Err(ToolError::runtime("the task actor did not answer")),
                Err(e) => Err(ToolError::runtime_caused("the task actor is gone", e)),
            }
        })
    }
}

/// Aborts the tool's tokio task when the actor's state is dropped, also when the actor
/// fails (ractor does not run `post_stop` then).
pub(crate) struct ToolHandle(JoinHandle<()>);

impl Drop for ToolHandle {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A live task's place in flow control (see `shared::flow`).
enum Hold {
    /// No limit applies (or the task is finished, or its tool is not registered).
    Free,
    /// It holds a slot (given back when dropped: the task ends, or the actor's state goes).
    Running { _slot: Slot },
    /// Entered on a shared store, its first round not yet answered: resolved at the start of
    /// `post_start` (not in `pre_start`, which the supervisor's spawn waits for).
    Pending(Option<Entry>),
    /// It waits for a slot: `waiter` forwards it to the actor as [`TaskMsg::Admitted`].
    Queued {
        _ticket: Ticket,
        slot: Option<oneshot::Receiver<Slot>>,
        ahead: usize,
        waiter: Option<ToolHandle>,
    },
}

pub(crate) struct TaskActor {
    pub(crate) shared: Arc<Shared>,
}

/// Why a task actor starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Start {
    /// The task was just created: its first run is already counted (`attempts` = 1).
    Fresh,
    /// The task resumes from the store. `count` = the previous run ended badly (a crash, a
    /// kill, a panic): a `working` task's run counts as one more attempt. `cause` = how the
    /// previous run ended, when this process saw it. `lapsed` = it counts because this node
    /// took the task over from a lapsed lease (given back if that node turns out to have been
    /// paused: [`TaskMsg::RefundLapse`]).
    Resume {
        count: bool,
        cause: Option<String>,
        lapsed: bool,
    },
}

pub(crate) struct TaskState {
    record: Arc<TaskRecord>,
    publisher: watch::Sender<Arc<TaskRecord>>,
    tool: Option<ToolHandle>,
    start: Start,
    /// A task being created: tells whether its creation commit succeeded (taken by
    /// `post_start`).
    creation: Option<oneshot::Receiver<bool>>,
    /// Counts this task in `mcp_tasks_tasks` under its status while the actor lives.
    gauge: TaskGauge,
    /// The attempt count right after this actor's start counted a takeover of a lapsed lease;
    /// taken by a [`TaskMsg::RefundLapse`].
    lapse_charge: Option<u32>,
    /// Flow control: free, running with a slot, or queued.
    hold: Hold,
    /// Set while the store may hold a newer record than the published one
    /// ([`LiveTask::unsettled`]).
    unsettled: Arc<std::sync::atomic::AtomicBool>,
}

impl TaskActor {
    /// Applies `event`: pure next state, durable commit, swap, publish. Returns whether the
    /// record changed. A terminal record stops the actor (reads then go to the store).
    ///
    /// Boxed: the actor's own future (allocated once per live task, for as long as the task
    /// lives) then holds a pointer instead of the whole commit state machine.
    fn transition<'a>(
        &'a self,
        myself: &'a ActorRef<TaskMsg>,
        state: &'a mut TaskState,
        event: Event,
    ) -> futures::future::BoxFuture<'a, Result<bool, RuntimeError>> {
        let span = tracing::debug_span!("task.transition", task = %state.record.id,
            seq = state.record.seq);
        Box::pin(self.transition_inner(myself, state, event).instrument(span))
    }

    async fn transition_inner(
        &self,
        myself: &ActorRef<TaskMsg>,
        state: &mut TaskState,
        event: Event,
    ) -> Result<bool, RuntimeError> {
        let Some(next) = apply(&state.record, event, self.shared.now_ms())? else {
            return Ok(false);
        };
        let next = Arc::new(next);
        #[cfg(feature = "failpoints")]
        if crate::failpoints::breaker("break::reply_before_commit") {
            // Deliberately broken (test-only): observable before it is durable.
            state.record = next.clone();
            state.publisher.send_replace(next.clone());
        }
        // Readers served from memory (the lease holder on a shared store) wait while this is
        // set: the store may hold `next` before this actor publishes it.
        state.unsettled.store(true, Ordering::SeqCst);
        let committed = self.shared.commit(&next).await;
        if let Err(e) = committed {
            // A store error leaves the outcome unknown (the transaction may have committed
            // although its acknowledgement was lost): the flag stays set, so that no reader is
            // served this actor's older snapshot while the supervisor replaces it from the
            // store (it fails below). Any other error wrote nothing.
            if !matches!(e, RuntimeError::Store(_)) {
                state.unsettled.store(false, Ordering::SeqCst);
            }
            #[cfg(feature = "failpoints")]
            fail::fail_point!("task::after_failed_commit");
            if matches!(e, RuntimeError::Store(StoreError::Fenced { .. })) {
                // Another node took the task over: this actor stops without touching the
                // record again, and its tool is dropped where it is.
                tracing::warn!(task = %next.id,
                    "this node lost the task's lease (fenced): its actor stops without writing");
                state.tool = None;
                myself.stop(Some("fenced".into()));
            }
            return Err(e);
        }
        #[cfg(feature = "failpoints")]
        fail::fail_point!("task::after_commit");
        if next.status != state.record.status {
            telemetry::transition(next.status);
        }
        state.gauge.set(next.status);
        state.record = next.clone();
        state.publisher.send_replace(next.clone());
        state.unsettled.store(false, Ordering::SeqCst);
        self.arm_passivation(myself, &next, Duration::ZERO);
        if next.status.is_terminal() {
            tracing::debug!(task = %next.id, status = next.status.as_str(), "task finished");
            state.tool = None;
            // Its flow-control slot (or place in the queue) goes at once, not with the actor.
            state.hold = Hold::Free;
            myself.stop(None);
        }
        Ok(true)
    }

    /// A client's request that changed nothing (`Ok(false)`: an answer for a key not
    /// pending, a second cancel) is acknowledged without a write, so no fencing refuses it.
    /// On a shared store the acknowledgement is first confirmed against the task's lease in
    /// the database (this node, the epoch it holds, the actor's sequence number): an actor
    /// left from a lease this node lost, still waiting for input, would otherwise acknowledge
    /// an answer for a key the new owner issued and drop it. Refused as fenced (the actor
    /// stops; the request goes to the node that holds the task) or, when the record moved
    /// under this node's own lease, as a conflict (the actor is rebuilt from the store).
    /// A store owned by one process confirms without any work.
    async fn confirm_unchanged(
        &self,
        myself: &ActorRef<TaskMsg>,
        state: &mut TaskState,
        result: Result<bool, RuntimeError>,
    ) -> Result<bool, RuntimeError> {
        if !matches!(result, Ok(false)) || !self.shared.store.is_shared() {
            return result;
        }
        let record = &state.record;
        match self
            .shared
            .store
            .confirm_lease(record.id.as_str(), record.seq)
            .await
        {
            Ok(()) => Ok(false),
            Err(e) => {
                // The record moved under this actor (or the lease went): its snapshot is no
                // longer served from memory while the supervisor replaces it.
                state.unsettled.store(true, Ordering::SeqCst);
                if matches!(e, StoreError::Fenced { .. }) {
                    tracing::warn!(task = %record.id,
                        "this node lost the task's lease (found by an acknowledgement that writes nothing): its actor stops without writing");
                    state.tool = None;
                    myself.stop(Some("fenced".into()));
                }
                Err(RuntimeError::Store(e))
            }
        }
    }

    /// When `record` (just committed, or the record the actor starts with) waits for input
    /// and may be passivated: a [`TaskMsg::Passivate`] for it after
    /// [`crate::RuntimeConfig::passivate_after`], or `at_least`. A later commit makes that
    /// message stale.
    fn arm_passivation(&self, myself: &ActorRef<TaskMsg>, record: &TaskRecord, at_least: Duration) {
        if !may_park(&self.shared, record) {
            return;
        }
        let Some(after) = self.shared.config.passivate_after else {
            return;
        };
        let after = after.max(at_least);
        let seq = record.seq;
        if after.is_zero() {
            let _ = myself.cast(TaskMsg::Passivate(seq));
        } else {
            myself.send_after(after, move || TaskMsg::Passivate(seq));
        }
    }

    /// Passivates the actor if its task still waits for input at commit `seq`: the live
    /// entry becomes parked (still counted as live), the tool's future is dropped, the actor
    /// stops. Messages already in its mailbox are dropped with it; their senders find no
    /// actor and get one started again (`Dispatcher::deliver`, the reaper's next pass).
    fn passivate(&self, myself: &ActorRef<TaskMsg>, state: &mut TaskState, seq: u64) {
        if state.record.seq != seq || !may_park(&self.shared, &state.record) {
            return;
        }
        // `false`: not this actor's entry any more (it is being replaced): nothing to park.
        if self
            .shared
            .live
            .park(&state.record.id, myself.get_id(), &mut state.gauge)
        {
            tracing::debug!(task = %state.record.id, seq,
                "task actor passivated: the task waits for input without an actor");
            state.tool = None;
            myself.stop(Some("passivated".into()));
        }
    }

    fn arm_cancel_grace(&self, myself: &ActorRef<TaskMsg>) {
        myself.send_after(self.shared.config.cancel_grace, || {
            TaskMsg::CancelGraceElapsed
        });
    }

    /// Starts the tool; `false` when it is not registered (the task then waits for it).
    fn start_tool(&self, myself: &ActorRef<TaskMsg>, state: &mut TaskState) -> bool {
        let record = &state.record;
        let Some(tool) = self.shared.tools.recover(&record.tool) else {
            return false;
        };
        let link = TaskLink {
            events: Box::new(ActorEvents(myself.clone())),
            snapshots: state.publisher.subscribe(),
            limits: self.shared.config.limits,
        };
        let ctx = ToolContext::for_task(record, link);
        let arguments = record.arguments.as_object().cloned().unwrap_or_default();
        let future = tool.call(ctx, arguments);
        let me = myself.clone();
        let span = tracing::info_span!("mcp.task", "mcp.task.id" = %record.id, tool = %record.tool,
            attempt = record.attempts);
        let handle = tokio::spawn(
            async move {
                let message = match AssertUnwindSafe(future).catch_unwind().await {
                    Ok(outcome) => TaskMsg::ToolExited(outcome),
                    Err(panic) => TaskMsg::ToolPanicked(panic_message(panic.as_ref())),
                };
                // The actor may be gone (the task ended by cancellation, or the runtime stops).
                let _ = me.cast(message);
            }
            .instrument(span),
        );
        state.tool = Some(ToolHandle(handle));
        true
    }

    /// Before a run starts: a task past its time to live is expired instead; a `working` task
    /// resuming after a bad end counts one more attempt, or is failed once the budget is
    /// spent. Returns whether the tool may start.
    async fn admit(
        &self,
        myself: &ActorRef<TaskMsg>,
        state: &mut TaskState,
        start: &Start,
    ) -> Result<bool, RuntimeError> {
        let now = self.shared.now_ms();
        if state.record.is_expired(now) {
            tracing::info!(task = %state.record.id, "task expired before it could resume");
            self.transition(myself, state, Event::Expire).await?;
            return Ok(false);
        }
        let (cause, lapsed) = match start {
            Start::Resume {
                count: true,
                cause,
                lapsed,
            } => (cause, *lapsed),
            _ => return Ok(true),
        };
        // Only a run of the tool counts: not a wait for input, not a tool that is missing, not
        // a wait in the flow-control queue (the tool never started).
        if state.record.status != crate::task::TaskStatus::Working
            || flow::is_queued_message(state.record.status_message.as_deref())
            || self.shared.tools.recover(&state.record.tool).is_none()
        {
            return Ok(true);
        }
        let allowed = self.shared.config.restart_budget.saturating_add(1);
        if state.record.attempts >= allowed {
            let attempts = state.record.attempts;
            tracing::error!(task = %state.record.id, tool = %state.record.tool, attempts,
                "giving up on the task: its tool was started {attempts} times without progress");
            let error = TaskError {
                code: code::INTERNAL_ERROR,
                message: format!(
                    "The task was given up: its tool was started {attempts} times without making \
                     progress, each run ending in a crash, a kill or a panic{}.",
                    cause
                        .as_ref()
                        .map(|c| format!(" (last: {c})"))
                        .unwrap_or_default()
                ),
                data: None,
            };
            self.transition(myself, state, Event::Finish(TaskOutcome::Error(error)))
                .await?;
            return Ok(false);
        }
        self.transition(myself, state, Event::Restarted).await?;
        if lapsed {
            state.lapse_charge = Some(state.record.attempts);
        }
        Ok(true)
    }
}

impl TaskActor {
    /// Enters flow control for a live task whose actor starts (in `pre_start`, so that the
    /// supervisor's rehydration, oldest task first, enters them in creation order).
    fn enter_flow(&self, record: &TaskRecord) -> Hold {
        let flow = &self.shared.flow;
        if !flow.active() || record.status.is_terminal() {
            return Hold::Free;
        }
        // A task whose tool is not registered cannot run: it takes no slot.
        let Some(tool) = self.shared.tools.recover(&record.tool) else {
            return Hold::Free;
        };
        let entry = flow.enter(
            record.id.as_str(),
            true,
            &record.tool,
            Some(tool.descriptor()),
            &record.owner,
            record.created_at_ms,
        );
        match entry {
            Entry::Free => Hold::Free,
            Entry::Running(slot) => Hold::Running { _slot: slot },
            entry @ Entry::Pending { .. } => Hold::Pending(Some(entry)),
            Entry::Queued {
                ticket,
                slot,
                ahead,
            } => Hold::Queued {
                _ticket: ticket,
                slot: Some(slot),
                ahead,
                waiter: None,
            },
        }
    }

    /// A queued task: its `statusMessage` says so (committed, when it works and the message
    /// is not already that), a cancellation already requested ends it, and its slot, when
    /// it comes, reaches the actor as [`TaskMsg::Admitted`].
    async fn wait_queued(
        &self,
        myself: &ActorRef<TaskMsg>,
        state: &mut TaskState,
    ) -> Result<(), RuntimeError> {
        if state.record.cancel_requested {
            self.cancel_queued(myself, state).await?;
            return Ok(());
        }
        let Hold::Queued { ahead, .. } = &state.hold else {
            return Ok(());
        };
        let message = flow::queued_message(*ahead);
        if state.record.status == crate::task::TaskStatus::Working
            && state.record.status_message.as_deref() != Some(message.as_str())
        {
            tracing::debug!(task = %state.record.id, tool = %state.record.tool, ahead,
                "task queued by flow control");
            self.transition(myself, state, Event::StatusMessage(Some(message)))
                .await?;
        }
        if let Hold::Queued { slot, waiter, .. } = &mut state.hold
            && let Some(slot) = slot.take()
        {
            let me = myself.clone();
            *waiter = Some(ToolHandle(tokio::spawn(async move {
                if let Ok(slot) = slot.await {
                    // The actor may be gone: the slot is dropped with the message, and freed.
                    let _ = me.cast(TaskMsg::Admitted(slot));
                }
            })));
        }
        Ok(())
    }

    /// A queued task is cancelled at once: its tool never started.
    async fn cancel_queued(
        &self,
        myself: &ActorRef<TaskMsg>,
        state: &mut TaskState,
    ) -> Result<bool, RuntimeError> {
        let event = Event::Cancelled {
            status_message: Some("Cancelled while queued: the tool never ran.".into()),
        };
        self.transition(myself, state, event).await
    }

    /// A task about to run whose record still says it is queued gets its tool's first
    /// `statusMessage` back.
    async fn unmark_queued(
        &self,
        myself: &ActorRef<TaskMsg>,
        state: &mut TaskState,
    ) -> Result<(), RuntimeError> {
        if !flow::is_queued_message(state.record.status_message.as_deref()) {
            return Ok(());
        }
        let initial = self
            .shared
            .tools
            .recover(&state.record.tool)
            .and_then(|t| t.descriptor().initial_status_message.clone());
        self.transition(myself, state, Event::StatusMessage(initial))
            .await?;
        Ok(())
    }

    /// A queued task got its slot: it runs.
    async fn admitted(
        &self,
        myself: &ActorRef<TaskMsg>,
        state: &mut TaskState,
        slot: Slot,
    ) -> Result<(), RuntimeError> {
        if state.record.status.is_terminal() || !matches!(state.hold, Hold::Queued { .. }) {
            return Ok(());
        }
        state.hold = Hold::Running { _slot: slot };
        if state.record.is_expired(self.shared.now_ms()) {
            self.transition(myself, state, Event::Expire).await?;
            return Ok(());
        }
        tracing::debug!(task = %state.record.id, tool = %state.record.tool,
            "queued task admitted by flow control");
        self.unmark_queued(myself, state).await?;
        if !self.start_tool(myself, state) {
            tracing::error!(task = %state.record.id, tool = %state.record.tool,
                "the tool of this queued task is no longer registered; the task waits for it");
        }
        Ok(())
    }
}

/// Whether a live task at `record` may be parked without an actor: it waits for input (no
/// cancellation requested, whose grace timer needs the actor) and its tool, if registered,
/// does not ask to stay active. Asked by the actor after each commit and by the supervisor of
/// each task it finds live at start-up.
pub(crate) fn may_park(shared: &Shared, record: &TaskRecord) -> bool {
    shared.config.passivate_after.is_some()
        && record.status == crate::task::TaskStatus::InputRequired
        && !record.cancel_requested
        && shared
            .tools
            .recover(&record.tool)
            .is_none_or(|tool| tool.descriptor().passivate)
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// Replies to `port`. A failed commit then fails the actor (with [`StoreFailure`]): the store
/// may or may not hold the transition that failed, so the actor's state is rebuilt from the
/// store by the supervisor rather than trusted.
fn reply(
    port: RpcReplyPort<Result<(), RpcError>>,
    result: Result<bool, RuntimeError>,
) -> Result<(), ActorProcessingErr> {
    let failed = store_failure(&result);
    let _ = port.send(result.map(|_| ()).map_err(RpcError::from));
    failed
}

/// `Err(StoreFailure)` when `result` is a store error.
fn store_failure<T>(result: &Result<T, RuntimeError>) -> Result<(), ActorProcessingErr> {
    match result {
        // Fenced: the actor stops and must not be restarted on this node.
        Err(RuntimeError::Store(e @ StoreError::Fenced { .. })) => {
            Err(Box::new(FencedStop(e.to_string())))
        }
        Err(RuntimeError::Store(e)) => Err(Box::new(StoreFailure(e.to_string()))),
        _ => Ok(()),
    }
}

/// A task actor failed because a commit failed (I/O error, disk full, store reopening). The
/// supervisor restarts it from the store without counting it against the restart budget:
/// it is not the task's fault.
#[derive(Debug)]
pub(crate) struct StoreFailure(pub(crate) String);

impl std::fmt::Display for StoreFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a commit of the task failed: {}", self.0)
    }
}

impl std::error::Error for StoreFailure {}

/// A task actor stopped because another node took its task over (its write was fenced).
/// The supervisor does not restart it: the task is the other node's now.
#[derive(Debug)]
pub(crate) struct FencedStop(pub(crate) String);

impl std::fmt::Display for FencedStop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::error::Error for FencedStop {}

/// `result`, with a store error turned into [`StoreFailure`] (or [`FencedStop`]).
fn or_store_failure<T>(result: Result<T, RuntimeError>) -> Result<T, ActorProcessingErr> {
    store_failure(&result)?;
    result.map_err(|e| Box::new(e) as ActorProcessingErr)
}

impl Actor for TaskActor {
    type Msg = TaskMsg;
    type State = TaskState;
    type Arguments = (Arc<TaskRecord>, Start, Option<oneshot::Receiver<bool>>);

    async fn pre_start(
        &self,
        myself: ActorRef<TaskMsg>,
        (record, start, creation): Self::Arguments,
    ) -> Result<TaskState, ActorProcessingErr> {
        let (publisher, snapshots) = watch::channel(record.clone());
        let unsettled = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // A task whose creation is in flight is registered for commands (they wait in the
        // mailbox) but not for readers until its commit is acknowledged.
        self.shared.live.insert(
            record.id.clone(),
            LiveTask {
                actor: myself.clone(),
                snapshots,
                unsettled: unsettled.clone(),
            },
            creation.is_none(),
        );
        let hold = self.enter_flow(&record);
        Ok(TaskState {
            hold,
            unsettled,
            gauge: TaskGauge::new(record.status),
            record,
            publisher,
            tool: None,
            start,
            creation,
            lapse_charge: None,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<TaskMsg>,
        state: &mut TaskState,
    ) -> Result<(), ActorProcessingErr> {
        if state.record.status.is_terminal() {
            myself.stop(None);
            return Ok(());
        }
        if let Hold::Pending(entry) = &mut state.hold
            && let Some(entry) = entry.take()
        {
            state.hold = match entry.resolve().await {
                Entry::Running(slot) => Hold::Running { _slot: slot },
                Entry::Queued {
                    ticket,
                    slot,
                    ahead,
                } => Hold::Queued {
                    _ticket: ticket,
                    slot: Some(slot),
                    ahead,
                    waiter: None,
                },
                Entry::Free | Entry::Pending { .. } => Hold::Free,
            };
        }
        let mut tool_started = false;
        if let Some(created) = state.creation.take() {
            // A new task: the dispatcher commits its creation while this actor starts, and
            // the tool starts now, so that its work overlaps the fsync. Nothing the tool
            // does is committed or observed before the creation: its events wait in this
            // actor's mailbox, which is read only after `post_start`. If the creation commit
            // fails, the tool is stopped and the caller gets the error (the tool may have
            // begun: tools are at-least-once, as after a crash).
            if !state.record.is_expired(self.shared.now_ms())
                && !matches!(state.hold, Hold::Queued { .. })
            {
                tool_started = self.start_tool(&myself, state);
            }
            if !matches!(created.await, Ok(true)) {
                tracing::debug!(task = %state.record.id,
                    "the task's creation was not committed; its actor stops");
                state.tool = None;
                myself.stop(Some("creation not committed".into()));
                return Ok(());
            }
            self.shared
                .live
                .mark_committed(&state.record.id, myself.get_id());
        }
        let start = state.start.clone();
        if !or_store_failure(self.admit(&myself, state, &start).await)? {
            return Ok(());
        }
        if matches!(state.hold, Hold::Queued { .. }) {
            or_store_failure(self.wait_queued(&myself, state).await)?;
            let record = state.record.clone();
            self.arm_passivation(&myself, &record, WOKEN_REST);
            return Ok(());
        }
        if !tool_started {
            or_store_failure(self.unmark_queued(&myself, state).await)?;
        }
        if !tool_started && !self.start_tool(&myself, state) {
            // Not a reason to fail the task: a deployment may have dropped the tool by
            // mistake. The task waits (it can still be answered, cancelled and expired) and
            // runs at the next start that registers the tool.
            tracing::error!(task = %state.record.id, tool = %state.record.tool,
                "the tool of this live task is not registered; the task waits for it (it can still be cancelled and expires as usual)");
        }
        if state.record.cancel_requested {
            self.arm_cancel_grace(&myself);
        }
        // An actor started for a task waiting for input was most likely woken for a command
        // on its way (an answer, a cancellation): it stays at least `WOKEN_REST`, so that the
        // command is not dropped with a passivation queued before it.
        let record = state.record.clone();
        self.arm_passivation(&myself, &record, WOKEN_REST);
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<TaskMsg>,
        state: &mut TaskState,
    ) -> Result<(), ActorProcessingErr> {
        state.tool = None;
        self.shared
            .live
            .remove_if(&state.record.id, myself.get_id());
        Ok(())
    }

    /// Boxed, like the transitions: ractor keeps the future of its message loop, which holds
    /// the future of `handle`, in one allocation for the actor's whole life; boxing it per
    /// message keeps that allocation small on every live task (a message is rare next to a
    /// task's life, and each one already costs a commit).
    fn handle(
        &self,
        myself: ActorRef<TaskMsg>,
        message: TaskMsg,
        state: &mut TaskState,
    ) -> impl std::future::Future<Output = Result<(), ActorProcessingErr>> + Send {
        Box::pin(self.handle_message(myself, message, state))
    }

    /// ractor's default (a task actor supervises nothing: any child's end stops it), boxed
    /// for the same reason as `handle`.
    fn handle_supervisor_evt(
        &self,
        myself: ActorRef<TaskMsg>,
        message: SupervisionEvent,
        _state: &mut TaskState,
    ) -> impl std::future::Future<Output = Result<(), ActorProcessingErr>> + Send {
        Box::pin(async move {
            if matches!(
                message,
                SupervisionEvent::ActorTerminated(..) | SupervisionEvent::ActorFailed(..)
            ) {
                myself.stop(None);
            }
            Ok(())
        })
    }
}

impl TaskActor {
    async fn handle_message(
        &self,
        myself: ActorRef<TaskMsg>,
        message: TaskMsg,
        state: &mut TaskState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            TaskMsg::Update(responses, port) => {
                let r = self
                    .transition(&myself, state, Event::ProvideInputs { responses })
                    .await;
                let r = self.confirm_unchanged(&myself, state, r).await;
                reply(port, r)?;
            }
            TaskMsg::Cancel(port) => {
                let r = self.transition(&myself, state, Event::RequestCancel).await;
                let r = self.confirm_unchanged(&myself, state, r).await;
                let r = if matches!(r, Ok(true))
                    && !state.record.status.is_terminal()
                    && matches!(state.hold, Hold::Queued { .. })
                {
                    // Queued: nothing runs that could stop cooperatively.
                    self.cancel_queued(&myself, state).await
                } else {
                    r
                };
                if matches!(r, Ok(true)) && !state.record.status.is_terminal() {
                    self.arm_cancel_grace(&myself);
                }
                reply(port, r)?;
            }
            TaskMsg::Expire(port) => {
                let r = self.transition(&myself, state, Event::Expire).await;
                reply(port, r)?;
            }
            TaskMsg::Tool(event, port) => {
                let r = self.transition(&myself, state, event).await;
                reply(port, r)?;
            }
            TaskMsg::ToolExited(outcome) => {
                state.tool = None;
                let event = self.finish_event(outcome)?;
                match self.transition(&myself, state, event).await {
                    Ok(_) | Err(RuntimeError::Transition(TransitionError::Terminal(_))) => {}
                    Err(e) => return or_store_failure(Err(e)),
                }
            }
            TaskMsg::ToolPanicked(detail) => {
                return Err(format!("tool `{}` panicked: {detail}", state.record.tool).into());
            }
            TaskMsg::RefundLapse => self.refund_lapse(&myself, state).await?,
            TaskMsg::Passivate(seq) => self.passivate(&myself, state, seq),
            TaskMsg::Admitted(slot) => {
                or_store_failure(self.admitted(&myself, state, slot).await)?;
            }
            TaskMsg::CancelGraceElapsed => {
                if !state.record.status.is_terminal() {
                    state.tool = None;
                    let message = "Cancelled: the tool did not stop within the grace period.";
                    let event = Event::Cancelled {
                        status_message: Some(message.into()),
                    };
                    or_store_failure(self.transition(&myself, state, event).await)?;
                }
            }
        }
        Ok(())
    }

    /// The event that ends the task with what its tool returned (a result over the size limit
    /// fails it); `Err` when the runtime could not record the tool's progress (store failure:
    /// the actor fails and the supervisor restarts it from the last durable snapshot).
    fn finish_event(
        &self,
        outcome: Result<CallToolResult, ToolError>,
    ) -> Result<Event, ActorProcessingErr> {
        Ok(match outcome {
            Ok(result) => {
                let result = result.to_json();
                match self.shared.config.limits.check_result(&result) {
                    Ok(()) => Event::Finish(TaskOutcome::Result(result)),
                    Err(e) => Event::Finish(TaskOutcome::Error(TaskError {
                        code: e.code,
                        message: e.message,
                        data: None,
                    })),
                }
            }
            Err(ToolError::Rpc(e)) => Event::Finish(TaskOutcome::Error(TaskError {
                code: e.code,
                message: e.message,
                data: e.data,
            })),
            Err(ToolError::Cancelled) => Event::Cancelled {
                status_message: None,
            },
            Err(ToolError::InputRequired(_)) => Event::Finish(TaskOutcome::Error(TaskError {
                code: code::INTERNAL_ERROR,
                message: "the tool asked for input outside a task".into(),
                data: None,
            })),
            Err(e @ ToolError::Runtime { .. }) => return Err(Box::new(e)),
        })
    }

    /// Gives back the attempt this actor's start counted when the node the task was taken
    /// over from turned out paused, not crashed — only while no progress (a step, an input
    /// request) started the count again since.
    async fn refund_lapse(
        &self,
        myself: &ActorRef<TaskMsg>,
        state: &mut TaskState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(charged) = state.lapse_charge.take()
            && state.record.attempts >= charged
            && !state.record.status.is_terminal()
        {
            tracing::info!(task = %state.record.id, attempts = state.record.attempts,
                "the node this task was taken over from was paused, not crashed: the attempt its takeover counted is given back");
            or_store_failure(self.transition(myself, state, Event::RestartRefunded).await)?;
        }
        Ok(())
    }
}
