//! Flow control: the slots of the running-task limits of one runtime, and the queue of the
//! tasks (and synchronous calls) waiting for one.
//!
//! A task needs a slot in every limit that applies to it (its tool's, all tools', its
//! owner's). One that fits runs at once; one that does not waits here, in its owner's queue
//! (ordered by creation time, then id: the store's own record of the task, so the order is the
//! same after a restart, when the supervisor rehydrates the live tasks oldest first). When a
//! slot frees, the owners with queued work are served in turn (round-robin): of the owners
//! whose oldest fitting task fits, the one whose last start is the longest ago (or who has
//! none yet) gets the slot, and by starting goes to the back of the turn. So an owner's first
//! queued task waits for at most one freed slot per other owner with queued work, however
//! many tasks those owners queued.
//!
//! A slot is held by a [`Slot`] in a live task's actor (or a synchronous call's future) and
//! given back when it is dropped: when the task ends, its actor stops or is passivated, or the
//! process ends. Nothing of it is stored: on the one-process stores the slots die with the
//! process, and the live tasks re-enter the queue in creation order when it starts again.
//! Flow control is refused on a shared store (`StartError::FlowControlOnSharedStore`) until
//! slots are held by leases there.
//!
//! No limit configured: [`Flow::enter`] answers [`Entry::Free`] after one look at an empty
//! configuration, without a lock.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use crate::quota::FlowLimits;
use crate::task::Owner;

/// The prefix of the `statusMessage` of a queued task.
pub(crate) const QUEUED_PREFIX: &str = "queued: ";

/// The `statusMessage` of a task queued with `ahead` tasks before it.
pub(crate) fn queued_message(ahead: usize) -> String {
    format!("{QUEUED_PREFIX}{ahead} ahead")
}

/// Whether `message` is the runtime's queued marker (`queued: N ahead`).
pub(crate) fn is_queued_message(message: Option<&str>) -> bool {
    message
        .and_then(|m| m.strip_prefix(QUEUED_PREFIX))
        .and_then(|rest| rest.strip_suffix(" ahead"))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Where a waiter stands in its owner's queue: creation time (ms), then the order it entered
/// in (tasks created in the same millisecond; after a restart that is the order of their ids,
/// in which the supervisor rehydrates them).
type QueueKey = (u64, u64);

struct Waiter {
    tool: String,
    tool_limit: Option<u32>,
    tx: oneshot::Sender<Slot>,
}

#[derive(Default)]
struct State {
    running_tool: HashMap<String, u32>,
    running_all: u32,
    running_owner: HashMap<String, u32>,
    /// Queued waiters per owner key, oldest first.
    queues: HashMap<String, BTreeMap<QueueKey, Waiter>>,
    /// The sequence number of each owner's last start (owners with running or queued work);
    /// the owner with the lowest (none: 0) is next in turn.
    last_start: HashMap<String, u64>,
    starts: u64,
    queued_tool: HashMap<String, u64>,
    queued: usize,
    entered: u64,
}

/// The flow control of one runtime (never global: each runtime has its own).
pub(crate) struct Flow {
    limits: FlowLimits,
    /// Whether a registered tool's descriptor has a limit of its own.
    descriptor_limits: bool,
    state: Mutex<State>,
}

/// The answer of [`Flow::enter`].
pub(crate) enum Entry {
    /// No limit applies: nothing to hold.
    Free,
    /// A slot, held until dropped.
    Running(Slot),
    /// Queued: the slot arrives on `slot`; dropping `ticket` leaves the queue.
    Queued {
        ticket: Ticket,
        slot: oneshot::Receiver<Slot>,
        ahead: usize,
    },
}

/// A slot in each limit that applies to one task; dropping it frees them and hands them on.
pub(crate) struct Slot {
    flow: Arc<Flow>,
    tool: String,
    owner: String,
    tool_limit: Option<u32>,
    armed: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.armed {
            self.armed = false;
            let flow = self.flow.clone();
            flow.release(self);
        }
    }
}

/// A place in the queue; dropping it leaves the queue (a cancelled or expired task, a
/// synchronous call whose caller went away).
pub(crate) struct Ticket {
    flow: Arc<Flow>,
    owner: String,
    key: QueueKey,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut state = self.flow.lock();
        if let Some(queue) = state.queues.get_mut(&self.owner)
            && let Some(waiter) = queue.remove(&self.key)
        {
            let empty = queue.is_empty();
            state.queued -= 1;
            if let Some(n) = state.queued_tool.get_mut(&waiter.tool) {
                *n = n.saturating_sub(1);
            }
            crate::telemetry::queued(&waiter.tool, -1.0);
            if empty {
                state.queues.remove(&self.owner);
                forget_idle(&mut state, &self.owner);
            }
        }
    }
}

/// Drops what is kept of an owner with nothing running and nothing queued.
fn forget_idle(state: &mut State, owner: &str) {
    if !state.running_owner.contains_key(owner) && !state.queues.contains_key(owner) {
        state.last_start.remove(owner);
    }
}

fn owner_key(owner: &Owner) -> String {
    crate::store::owner_key(&owner.tenant, &owner.principal)
}

impl Flow {
    pub(crate) fn new(limits: FlowLimits, descriptor_limits: bool) -> Self {
        Self {
            limits,
            descriptor_limits,
            state: Mutex::new(State::default()),
        }
    }

    /// Whether any limit is configured (else nothing of flow control runs).
    pub(crate) fn active(&self) -> bool {
        self.descriptor_limits || !self.limits.is_empty()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while the lock is held leaves counts that are still consistent enough to go
        // on: every change under it is a few integer updates.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The limit of `tool`: the runtime's, else its descriptor's.
    fn tool_limit(&self, tool: &str, descriptor_limit: Option<u32>) -> Option<u32> {
        self.limits.per_tool.get(tool).copied().or(descriptor_limit)
    }

    fn fits(&self, state: &State, tool: &str, tool_limit: Option<u32>, owner: &str) -> bool {
        tool_limit.is_none_or(|l| state.running_tool.get(tool).copied().unwrap_or(0) < l)
            && self.limits.all_tools.is_none_or(|l| state.running_all < l)
            && self
                .limits
                .per_owner
                .is_none_or(|l| state.running_owner.get(owner).copied().unwrap_or(0) < l)
    }

    fn take(
        self: &Arc<Self>,
        state: &mut State,
        tool: &str,
        tool_limit: Option<u32>,
        owner: &str,
    ) -> Slot {
        let n = state.running_tool.entry(tool.to_owned()).or_insert(0);
        *n += 1;
        crate::telemetry::running_limited(tool, 1.0);
        state.running_all += 1;
        *state.running_owner.entry(owner.to_owned()).or_insert(0) += 1;
        state.starts += 1;
        state.last_start.insert(owner.to_owned(), state.starts);
        Slot {
            flow: self.clone(),
            tool: tool.to_owned(),
            owner: owner.to_owned(),
            tool_limit,
            armed: true,
        }
    }

    fn untake(state: &mut State, slot: &Slot) {
        if let Some(n) = state.running_tool.get_mut(&slot.tool) {
            *n = n.saturating_sub(1);
            crate::telemetry::running_limited(&slot.tool, -1.0);
        }
        state.running_all = state.running_all.saturating_sub(1);
        if let Some(n) = state.running_owner.get_mut(&slot.owner) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                state.running_owner.remove(&slot.owner);
                forget_idle(state, &slot.owner);
            }
        }
    }

    /// A task (or a synchronous call) of `tool` for `owner`, created at `created_ms`, asks to
    /// run.
    pub(crate) fn enter(
        self: &Arc<Self>,
        tool: &str,
        descriptor_limit: Option<u32>,
        owner: &Owner,
        created_ms: u64,
    ) -> Entry {
        if descriptor_limit.is_none() && self.limits.is_empty() {
            return Entry::Free;
        }
        let tool_limit = self.tool_limit(tool, descriptor_limit);
        if tool_limit.is_none()
            && self.limits.all_tools.is_none()
            && self.limits.per_owner.is_none()
        {
            return Entry::Free;
        }
        let owner = owner_key(owner);
        let mut state = self.lock();
        // Every queued waiter was checked at the last release and did not fit: one that fits
        // now passes nobody who could run.
        if self.fits(&state, tool, tool_limit, &owner) {
            return Entry::Running(self.take(&mut state, tool, tool_limit, &owner));
        }
        state.entered += 1;
        let key = (created_ms, state.entered);
        // Its place under round-robin: the owner's own older tasks, and as many of each other
        // owner's (at most all of them).
        let mine = state
            .queues
            .get(&owner)
            .map_or(0, |q| q.range(..key).count());
        let ahead = mine
            + state
                .queues
                .iter()
                .filter(|(o, _)| **o != owner)
                .map(|(_, q)| q.len().min(mine))
                .sum::<usize>();
        let (tx, rx) = oneshot::channel();
        let queue = state.queues.entry(owner.clone()).or_default();
        queue.insert(
            key,
            Waiter {
                tool: tool.to_owned(),
                tool_limit,
                tx,
            },
        );
        state.queued += 1;
        let n = state.queued_tool.entry(tool.to_owned()).or_insert(0);
        *n += 1;
        crate::telemetry::queued(tool, 1.0);
        Entry::Queued {
            ticket: Ticket {
                flow: self.clone(),
                owner,
                key,
            },
            slot: rx,
            ahead,
        }
    }

    /// Frees `slot`'s places and hands free places to queued waiters, owners in turn.
    fn release(self: &Arc<Self>, slot: &Slot) {
        let mut state = self.lock();
        Self::untake(&mut state, slot);
        let _ = slot.tool_limit;
        self.dispatch(&mut state);
    }

    /// Serves the owners in turn while a queued waiter fits.
    fn dispatch(self: &Arc<Self>, state: &mut State) {
        loop {
            // All tools' limit full: nobody fits (no need to look at every waiter).
            if self
                .limits
                .all_tools
                .is_some_and(|l| state.running_all >= l)
            {
                return;
            }
            // The owner next in turn (oldest last start) among those with a fitting waiter.
            let mut best: Option<(u64, &String, &QueueKey)> = None;
            for (owner, queue) in &state.queues {
                let Some((key, _)) = queue
                    .iter()
                    .find(|(_, w)| self.fits(state, &w.tool, w.tool_limit, owner))
                else {
                    continue;
                };
                let last = state.last_start.get(owner).copied().unwrap_or(0);
                if best.is_none_or(|(l, o, _)| (last, owner) < (l, o)) {
                    best = Some((last, owner, key));
                }
            }
            let Some((_, owner, key)) = best else {
                return;
            };
            let (owner, key) = (owner.clone(), *key);
            let Some(queue) = state.queues.get_mut(&owner) else {
                return;
            };
            let Some(waiter) = queue.remove(&key) else {
                return;
            };
            if queue.is_empty() {
                state.queues.remove(&owner);
            }
            state.queued -= 1;
            if let Some(n) = state.queued_tool.get_mut(&waiter.tool) {
                *n = n.saturating_sub(1);
            }
            crate::telemetry::queued(&waiter.tool, -1.0);
            let slot = self.take(state, &waiter.tool, waiter.tool_limit, &owner);
            if let Err(mut slot) = waiter.tx.send(slot) {
                // The waiter went away meanwhile: the places go back, without recursing.
                slot.armed = false;
                Self::untake(state, &slot);
            }
        }
    }

    /// The running and queued counts, per limit, for operators.
    #[cfg_attr(not(feature = "console"), allow(dead_code))]
    pub(crate) fn usage(&self) -> FlowUsage {
        let state = self.lock();
        let mut tools: BTreeMap<String, ToolUsage> = BTreeMap::new();
        for (tool, limit) in &self.limits.per_tool {
            tools.entry(tool.clone()).or_default().limit = Some(*limit);
        }
        for (tool, n) in &state.running_tool {
            tools.entry(tool.clone()).or_default().running = *n;
        }
        for (tool, n) in &state.queued_tool {
            tools.entry(tool.clone()).or_default().queued = *n;
        }
        tools.retain(|_, u| u.limit.is_some() || u.running > 0 || u.queued > 0);
        FlowUsage {
            tools,
            all_tools_limit: self.limits.all_tools,
            running: state.running_all,
            queued: state.queued as u64,
            per_owner_limit: self.limits.per_owner,
            owners_queued: state.queues.len() as u64,
        }
    }
}

/// One tool's use of flow control.
#[cfg_attr(not(feature = "console"), allow(dead_code))]
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct ToolUsage {
    /// The runtime's limit for the tool (a descriptor's own limit shows as `None`).
    pub(crate) limit: Option<u32>,
    pub(crate) running: u32,
    pub(crate) queued: u64,
}

/// What [`Flow::usage`] reports.
#[cfg_attr(not(feature = "console"), allow(dead_code))]
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct FlowUsage {
    pub(crate) tools: BTreeMap<String, ToolUsage>,
    pub(crate) all_tools_limit: Option<u32>,
    /// Tasks holding a slot.
    pub(crate) running: u32,
    pub(crate) queued: u64,
    pub(crate) per_owner_limit: Option<u32>,
    /// Owners with queued work.
    pub(crate) owners_queued: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(p: &str) -> Owner {
        Owner {
            tenant: "t".into(),
            principal: p.into(),
        }
    }

    fn flow(limits: FlowLimits) -> Arc<Flow> {
        Arc::new(Flow::new(limits, true))
    }

    #[test]
    fn no_limit_is_free() {
        let f = flow(FlowLimits::none());
        assert!(matches!(f.enter("a", None, &owner("x"), 1), Entry::Free));
        // A descriptor's limit makes it count.
        assert!(matches!(
            f.enter("a", Some(1), &owner("x"), 1),
            Entry::Running(_)
        ));
    }

    #[test]
    fn queues_then_hands_on_in_creation_order() {
        let mut limits = FlowLimits::none();
        limits.add("a=1").unwrap();
        let f = flow(limits);
        let Entry::Running(first) = f.enter("a", None, &owner("x"), 1) else {
            panic!("first runs");
        };
        let Entry::Queued {
            ticket: t3,
            slot: mut s3,
            ahead,
        } = f.enter("a", None, &owner("x"), 3)
        else {
            panic!("queued");
        };
        assert_eq!(ahead, 0);
        let Entry::Queued {
            ticket: t2,
            slot: mut s2,
            ahead,
        } = f.enter("a", None, &owner("x"), 2)
        else {
            panic!("queued");
        };
        assert_eq!(ahead, 0, "older than the one queued before it");
        assert_eq!(f.usage().queued, 2);
        drop(first);
        let second = s2.try_recv().expect("the older one gets the slot");
        assert!(s3.try_recv().is_err());
        drop(t2);
        drop(second);
        let third = s3.try_recv().expect("then the next");
        drop(t3);
        assert_eq!(f.usage().running, 1);
        assert_eq!(f.usage().queued, 0);
        drop(third);
        assert_eq!(f.usage().running, 0);
    }

    #[test]
    fn a_dropped_ticket_leaves_the_queue() {
        let mut limits = FlowLimits::none();
        limits.add("*=1").unwrap();
        let f = flow(limits);
        let Entry::Running(first) = f.enter("a", None, &owner("x"), 1) else {
            panic!("first runs");
        };
        let Entry::Queued { ticket, slot, .. } = f.enter("b", None, &owner("x"), 2) else {
            panic!("queued");
        };
        drop(ticket);
        drop(slot);
        assert_eq!(f.usage().queued, 0);
        drop(first);
        assert_eq!(f.usage().running, 0, "nobody took the slot");
    }

    #[test]
    fn owners_are_served_in_turn() {
        let mut limits = FlowLimits::none();
        limits.add("a=1").unwrap();
        let f = flow(limits);
        let Entry::Running(mut current) = f.enter("a", None, &owner("A"), 0) else {
            panic!("first runs");
        };
        let mut waiting = Vec::new();
        for i in 1..=100u64 {
            let Entry::Queued { ticket, slot, .. } = f.enter("a", None, &owner("A"), i) else {
                panic!("queued");
            };
            waiting.push(("A", ticket, slot));
        }
        let Entry::Queued {
            ticket,
            slot,
            ahead,
        } = f.enter("a", None, &owner("B"), 500)
        else {
            panic!("queued");
        };
        assert_eq!(ahead, 0, "B's first task is next in turn");
        waiting.push(("B", ticket, slot));
        let mut order = Vec::new();
        for _ in 0..3 {
            drop(current);
            let mut got = None;
            for (i, (_, _, slot)) in waiting.iter_mut().enumerate() {
                if let Ok(s) = slot.try_recv() {
                    got = Some((i, s));
                    break;
                }
            }
            let (i, slot) = got.expect("someone got the freed slot");
            order.push(waiting.remove(i).0);
            current = slot;
        }
        assert_eq!(order, ["B", "A", "A"], "B gets the first freed slot");
        drop(current);
        drop(waiting);
    }

    #[test]
    fn limit_specs() {
        let mut l = FlowLimits::none();
        assert!(l.add("a=2").is_ok());
        assert!(l.add("*=3").is_ok());
        assert_eq!(l.per_tool["a"], 2);
        assert_eq!(l.all_tools, Some(3));
        for bad in ["a", "a=0", "a=abc", "=2", "a=-1", ""] {
            assert!(l.add(bad).is_err(), "{bad}");
        }
        assert!(is_queued_message(Some(&queued_message(12))));
        assert!(!is_queued_message(Some("queued: soon")));
        assert!(!is_queued_message(None));
    }
}
