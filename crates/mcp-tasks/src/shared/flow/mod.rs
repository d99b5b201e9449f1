//! Flow control: the slots of the running-task limits and start rates of one runtime, and
//! the queue of the tasks (and synchronous calls) waiting for one.
//!
//! A task needs a place in every limit that applies to it (its tool's, its flow group's, all
//! tools', its owner's) and, when its tool has a start rate, a token of the tool's bucket. One
//! that fits runs at once; one that does not waits in its owner's queue (ordered by creation
//! time: the store's own record of the task, so the order is the same after a restart). When
//! a slot frees, the owners with queued work are served in turn (round-robin): of the owners
//! whose oldest fitting task fits, the one whose last start is the longest ago (or who has
//! none) gets the slot, and by starting goes to the back of the turn. So an owner's first
//! queued task waits for at most one freed slot per other owner with queued work, however
//! many tasks those owners queued. The rule is `plan.rs`, the same code for both modes:
//!
//! - **One process** (memory, redb): the [`Plan`] lives here, in memory. A slot is held by a
//!   [`Slot`] in a live task's actor (or a synchronous call's future) and given back when it
//!   is dropped: when the task ends, its actor stops or is passivated, or the process ends.
//!   The live tasks re-enter the queue in creation order when the process starts again.
//! - **A shared store** (PostgreSQL replicas): the entries are rows of the store's flow table
//!   and every decision is a round of `cluster.rs`, in one transaction over the cluster. A
//!   slot is held by the task's lease: a replica that dies frees its slots when its lease
//!   lapses, and its tasks, taken over, re-enter the queue under their creation times.
//!
//! No limit configured: [`Flow::enter`] answers [`Entry::Free`] after one look at an empty
//! configuration, without a lock.

mod cluster;
pub(crate) mod plan;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use tokio::sync::oneshot;

use crate::quota::FlowLimits;
use crate::task::Owner;
use crate::tool::ToolDescriptor;

pub(crate) use plan::{Needs, Plan, QueueKey};

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

/// The state of one process's flow control.
#[derive(Default)]
struct Local {
    plan: Plan<oneshot::Sender<Slot>>,
    /// Entries so far (the queue's order among tasks created in the same millisecond).
    entered: u64,
    /// When the start-rate timer is due (ms of [`Flow::now_ms`]), if one is armed.
    timer_at: Option<u64>,
}

/// The flow control of one runtime (never global: each runtime has its own).
pub(crate) struct Flow {
    limits: FlowLimits,
    /// Whether a registered tool's descriptor has a limit of its own.
    descriptor_limits: bool,
    local: Mutex<Local>,
    /// The cluster-wide mode, set at start on a shared store.
    cluster: OnceLock<Arc<cluster::Driver>>,
    /// The clock of the start rates in one process.
    epoch: tokio::time::Instant,
    me: Weak<Flow>,
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
    /// Entered on a shared store: the round that records it answers on `first`
    /// ([`Entry::resolve`]); dropping `ticket` leaves.
    Pending {
        ticket: Ticket,
        first: oneshot::Receiver<First>,
    },
}

/// The answer of an entry's first round on a shared store.
pub(crate) enum First {
    /// It runs: its slot.
    Running(Slot),
    /// It waits, `ahead` before it; the slot arrives on `slot`.
    Queued {
        ahead: usize,
        slot: oneshot::Receiver<Slot>,
    },
}

impl Entry {
    /// Waits for a pending entry's first round: [`Entry::Running`] or [`Entry::Queued`] (or,
    /// when the runtime stops meanwhile, queued for ever).
    pub(crate) async fn resolve(self) -> Entry {
        let Entry::Pending { ticket, first } = self else {
            return self;
        };
        match first.await {
            Ok(First::Running(slot)) => Entry::Running(slot),
            Ok(First::Queued { ahead, slot }) => Entry::Queued {
                ticket,
                slot,
                ahead,
            },
            Err(_) => Entry::Queued {
                ticket,
                slot: oneshot::channel().1,
                ahead: 0,
            },
        }
    }
}

/// What a slot or a ticket holds, by mode.
enum Place {
    Local { owner: String, key: QueueKey },
    Cluster { key: String, token: u64 },
}

/// A slot in each limit that applies to one task; dropping it frees them and hands them on.
pub(crate) struct Slot {
    flow: Arc<Flow>,
    place: Place,
    needs: Needs,
    armed: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.armed {
            self.armed = false;
            crate::telemetry::running_limited(&self.needs.tool, -1.0);
            match &self.place {
                Place::Local { owner, .. } => self.flow.release(&self.needs, owner),
                Place::Cluster { key, token } => {
                    if let Some(driver) = self.flow.cluster.get() {
                        driver.release(key, *token);
                    }
                }
            }
        }
    }
}

/// A place in the queue; dropping it leaves the queue (a cancelled or expired task, a
/// synchronous call whose caller went away). Once its slot was given, it holds nothing.
pub(crate) struct Ticket {
    flow: Arc<Flow>,
    place: Place,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        match &self.place {
            Place::Local { owner, key } => {
                let mut local = self.flow.lock();
                if let Some((needs, _)) = local.plan.unqueue(owner, key) {
                    crate::telemetry::queued(&needs.tool, -1.0);
                }
            }
            Place::Cluster { key, token } => {
                if let Some(driver) = self.flow.cluster.get() {
                    driver.leave_queue(key, *token);
                }
            }
        }
    }
}

impl Flow {
    pub(crate) fn new(limits: FlowLimits, descriptor_limits: bool) -> Arc<Self> {
        Arc::new_cyclic(|me| Self {
            limits,
            descriptor_limits,
            local: Mutex::new(Local::default()),
            cluster: OnceLock::new(),
            epoch: tokio::time::Instant::now(),
            me: me.clone(),
        })
    }

    /// Whether any limit is configured (else nothing of flow control runs).
    pub(crate) fn active(&self) -> bool {
        self.descriptor_limits || !self.limits.is_empty()
    }

    /// Switches to the cluster-wide mode over `store` (a shared store), when any limit is
    /// configured: spawns the round driver, which stops when `closing` turns true.
    pub(crate) fn start_cluster(
        &self,
        store: crate::store::Store,
        closing: tokio::sync::watch::Receiver<bool>,
    ) {
        if !self.active() || store.cluster().is_none() {
            return;
        }
        let driver = cluster::Driver::start(self.me.clone(), store, closing);
        let _ = self.cluster.set(driver);
    }

    fn lock(&self) -> MutexGuard<'_, Local> {
        // A panic while the lock is held leaves counts that are still consistent enough to go
        // on: every change under it is a few integer updates.
        self.local.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// What a task of `tool` (described by `descriptor`, if registered) for `owner` needs.
    fn needs(&self, tool: &str, descriptor: Option<&ToolDescriptor>, owner: &str) -> Needs {
        let limits = &self.limits;
        let mut counters = Vec::new();
        let tool_limit = limits
            .per_tool
            .get(tool)
            .copied()
            .or(descriptor.and_then(|d| d.max_running));
        if let Some(n) = tool_limit {
            counters.push((format!("tool {tool}"), n));
        }
        if let Some(group) = descriptor.and_then(|d| d.flow_group.as_deref())
            && let Some(n) = limits.per_group.get(group)
        {
            counters.push((format!("group {group}"), *n));
        }
        if let Some(n) = limits.all_tools {
            counters.push(("*".to_owned(), n));
        }
        if let Some(n) = limits.per_owner {
            counters.push((format!("owner {owner}"), n));
        }
        Needs {
            tool: tool.to_owned(),
            counters,
            rate: limits
                .max_starts
                .get(tool)
                .map(|r| (format!("rate {tool}"), *r)),
        }
    }

    /// Entry `key` (a task's id, `task`; or a synchronous call's key) of `tool` for `owner`,
    /// created at `created_ms`, asks to run. On a shared store it is [`Entry::Pending`] until
    /// a round records it (nothing here waits: an actor's start must not wait for a round).
    pub(crate) fn enter(
        self: &Arc<Self>,
        key: &str,
        task: bool,
        tool: &str,
        descriptor: Option<&ToolDescriptor>,
        owner: &Owner,
        created_ms: u64,
    ) -> Entry {
        if !self.active() {
            return Entry::Free;
        }
        let owner = crate::store::owner_key(&owner.tenant, &owner.principal);
        let needs = self.needs(tool, descriptor, &owner);
        if needs.is_free() {
            return Entry::Free;
        }
        if let Some(driver) = self.cluster.get() {
            return driver.enter(self.clone(), key, task, owner, needs, created_ms);
        }
        let now = self.now_ms();
        let mut local = self.lock();
        // Every queued waiter was checked at the last release and did not fit: one that fits
        // now passes nobody who could run.
        if local.plan.fits(&needs, now) {
            local.plan.take(&needs, &owner, now);
            crate::telemetry::running_limited(&needs.tool, 1.0);
            return Entry::Running(Slot {
                flow: self.clone(),
                place: Place::Local {
                    owner,
                    key: QueueKey {
                        created_ms,
                        seq: 0,
                        key: key.to_owned(),
                    },
                },
                needs,
                armed: true,
            });
        }
        local.entered += 1;
        let qkey = QueueKey {
            created_ms,
            seq: local.entered,
            key: key.to_owned(),
        };
        let (tx, rx) = oneshot::channel();
        crate::telemetry::queued(&needs.tool, 1.0);
        let rate_bound = needs.rate.is_some();
        let ahead = local.plan.queue(&owner, qkey.clone(), needs, tx);
        if rate_bound {
            // It may wait for a token only: the timer hands it on when one comes.
            self.dispatch(&mut local);
        }
        Entry::Queued {
            ticket: Ticket {
                flow: self.clone(),
                place: Place::Local { owner, key: qkey },
            },
            slot: rx,
            ahead,
        }
    }

    /// Frees a local slot's places and hands free places to queued waiters, owners in turn.
    fn release(&self, needs: &Needs, owner: &str) {
        let mut local = self.lock();
        local.plan.untake(needs, owner);
        self.dispatch(&mut local);
    }

    /// Serves the owners in turn while a queued waiter fits; arms the start-rate timer when a
    /// waiter waits for a token only.
    fn dispatch(&self, local: &mut Local) {
        let Some(me) = self.me.upgrade() else { return };
        let now = self.now_ms();
        let wake = local.plan.dispatch(now, |plan, owner, key, needs, tx, _| {
            crate::telemetry::queued(&needs.tool, -1.0);
            crate::telemetry::running_limited(&needs.tool, 1.0);
            let slot = Slot {
                flow: me.clone(),
                place: Place::Local { owner, key },
                needs,
                armed: true,
            };
            if let Err(mut slot) = tx.send(slot) {
                // The waiter went away meanwhile: the places go back, without recursing.
                slot.armed = false;
                crate::telemetry::running_limited(&slot.needs.tool, -1.0);
                if let Place::Local { owner, .. } = &slot.place {
                    plan.untake(&slot.needs, owner);
                }
            }
        });
        if let Some(at) = wake
            && local.timer_at.is_none_or(|t| at < t)
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            local.timer_at = Some(at);
            let flow = self.me.clone();
            let deadline = self.epoch + std::time::Duration::from_millis(at);
            handle.spawn(async move {
                tokio::time::sleep_until(deadline).await;
                if let Some(flow) = flow.upgrade() {
                    let mut local = flow.lock();
                    if local.timer_at == Some(at) {
                        local.timer_at = None;
                    }
                    flow.dispatch(&mut local);
                }
            });
        }
    }

    /// The running and queued counts, per limit, for operators (on a shared store: the
    /// cluster's, as of this node's last round).
    #[cfg_attr(not(feature = "console"), allow(dead_code))]
    pub(crate) fn usage(&self) -> FlowUsage {
        if let Some(driver) = self.cluster.get() {
            let mut usage = driver.usage();
            self.add_limits(&mut usage);
            return usage;
        }
        let local = self.lock();
        let mut usage = usage_of(&local.plan);
        drop(local);
        self.add_limits(&mut usage);
        usage
    }

    fn add_limits(&self, usage: &mut FlowUsage) {
        for (tool, limit) in &self.limits.per_tool {
            usage.tools.entry(tool.clone()).or_default().limit = Some(*limit);
        }
        for (tool, rate) in &self.limits.max_starts {
            usage.tools.entry(tool.clone()).or_default().max_starts = Some(*rate);
        }
        for (group, limit) in &self.limits.per_group {
            usage.groups.entry(group.clone()).or_default().limit = *limit;
        }
        usage.all_tools_limit = self.limits.all_tools;
        usage.per_owner_limit = self.limits.per_owner;
    }
}

/// The figures of a plan, without the configured limits.
fn usage_of<W>(plan: &Plan<W>) -> FlowUsage {
    let mut usage = FlowUsage::default();
    for (tool, n) in &plan.running_tool {
        if *n > 0 {
            usage.tools.entry(tool.clone()).or_default().running = *n;
        }
    }
    for (tool, n) in &plan.queued_tool {
        if *n > 0 {
            usage.tools.entry(tool.clone()).or_default().queued = *n;
        }
    }
    usage.running = plan.running_tool.values().sum();
    usage.queued = plan.queued() as u64;
    usage.owners_queued = plan.owners_queued() as u64;
    usage.owners = plan.owner_figures(OWNERS_SHOWN);
    for (counter, n) in plan.counters() {
        if let Some(group) = counter.strip_prefix("group ") {
            usage.groups.entry(group.to_owned()).or_default().running = n;
        }
    }
    usage
}

/// One tool's use of flow control.
#[cfg_attr(not(feature = "console"), allow(dead_code))]
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct ToolUsage {
    /// The runtime's limit for the tool (a descriptor's own limit shows as `None`).
    pub(crate) limit: Option<u32>,
    /// The runtime's start rate for the tool (starts per second).
    pub(crate) max_starts: Option<f64>,
    pub(crate) running: u32,
    pub(crate) queued: u64,
}

/// One flow group's use.
#[cfg_attr(not(feature = "console"), allow(dead_code))]
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct GroupUsage {
    pub(crate) limit: u32,
    pub(crate) running: u32,
}

/// What [`Flow::usage`] reports.
#[cfg_attr(not(feature = "console"), allow(dead_code))]
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct FlowUsage {
    pub(crate) tools: BTreeMap<String, ToolUsage>,
    pub(crate) groups: BTreeMap<String, GroupUsage>,
    pub(crate) all_tools_limit: Option<u32>,
    /// Tasks holding a slot.
    pub(crate) running: u32,
    pub(crate) queued: u64,
    pub(crate) per_owner_limit: Option<u32>,
    /// Owners with queued work.
    pub(crate) owners_queued: u64,
    /// The owners with the most queued work (at most [`OWNERS_SHOWN`]), most first.
    pub(crate) owners: Vec<OwnerUsage>,
}

/// How many owners [`FlowUsage::owners`] shows.
pub(crate) const OWNERS_SHOWN: usize = 20;

/// One owner's running and queued entries.
#[cfg_attr(not(feature = "console"), allow(dead_code))]
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct OwnerUsage {
    /// The owner key (tenant and principal).
    pub(crate) owner: String,
    pub(crate) running: u32,
    pub(crate) queued: u64,
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
        Flow::new(limits, true)
    }

    fn next_key() -> String {
        crate::task::TaskId::generate().as_str().to_owned()
    }

    fn limited(n: u32) -> ToolDescriptor {
        ToolDescriptor::new("a", "").max_running(n)
    }

    #[tokio::test]
    async fn no_limit_is_free() {
        let f = flow(FlowLimits::none());
        assert!(matches!(
            f.enter(&next_key(), true, "a", None, &owner("x"), 1),
            Entry::Free
        ));
        // A descriptor's limit makes it count.
        assert!(matches!(
            f.enter(&next_key(), true, "a", Some(&limited(1)), &owner("x"), 1),
            Entry::Running(_)
        ));
    }

    #[tokio::test]
    async fn queues_then_hands_on_in_creation_order() {
        let mut limits = FlowLimits::none();
        limits.add("a=1").unwrap();
        let f = flow(limits);
        let Entry::Running(first) = f.enter(&next_key(), true, "a", None, &owner("x"), 1) else {
            panic!("first runs");
        };
        let Entry::Queued {
            ticket: t3,
            slot: mut s3,
            ahead,
        } = f.enter(&next_key(), true, "a", None, &owner("x"), 3)
        else {
            panic!("queued");
        };
        assert_eq!(ahead, 0);
        let Entry::Queued {
            ticket: t2,
            slot: mut s2,
            ahead,
        } = f.enter(&next_key(), true, "a", None, &owner("x"), 2)
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

    #[tokio::test]
    async fn a_dropped_ticket_leaves_the_queue() {
        let mut limits = FlowLimits::none();
        limits.add("*=1").unwrap();
        let f = flow(limits);
        let Entry::Running(first) = f.enter(&next_key(), true, "a", None, &owner("x"), 1) else {
            panic!("first runs");
        };
        let Entry::Queued { ticket, slot, .. } =
            f.enter(&next_key(), true, "b", None, &owner("x"), 2)
        else {
            panic!("queued");
        };
        drop(ticket);
        drop(slot);
        assert_eq!(f.usage().queued, 0);
        drop(first);
        assert_eq!(f.usage().running, 0, "nobody took the slot");
    }

    #[tokio::test]
    async fn owners_are_served_in_turn() {
        let mut limits = FlowLimits::none();
        limits.add("a=1").unwrap();
        let f = flow(limits);
        let Entry::Running(mut current) = f.enter(&next_key(), true, "a", None, &owner("A"), 0)
        else {
            panic!("first runs");
        };
        let mut waiting = Vec::new();
        for i in 1..=100u64 {
            let Entry::Queued { ticket, slot, .. } =
                f.enter(&next_key(), true, "a", None, &owner("A"), i)
            else {
                panic!("queued");
            };
            waiting.push(("A", ticket, slot));
        }
        let Entry::Queued {
            ticket,
            slot,
            ahead,
        } = f.enter(&next_key(), true, "a", None, &owner("B"), 500)
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

    #[tokio::test(start_paused = true)]
    async fn a_start_rate_queues_until_its_token_comes() {
        let mut limits = FlowLimits::none();
        limits.add_rate("a=2/s").unwrap();
        let f = flow(limits);
        let Entry::Running(first) = f.enter(&next_key(), true, "a", None, &owner("x"), 1) else {
            panic!("the first start has its token");
        };
        drop(first);
        let Entry::Queued {
            ticket, mut slot, ..
        } = f.enter(&next_key(), true, "a", None, &owner("x"), 2)
        else {
            panic!("no token left: queued, though nothing runs");
        };
        tokio::time::sleep(std::time::Duration::from_millis(490)).await;
        assert!(slot.try_recv().is_err(), "2/s: not before 500 ms");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let second = slot.try_recv().expect("its token came");
        drop((ticket, second));
        assert!(matches!(
            f.enter(&next_key(), true, "b", None, &owner("x"), 3),
            Entry::Free
        ));
    }

    #[tokio::test]
    async fn a_flow_group_limits_its_tools_together() {
        let mut limits = FlowLimits::none();
        limits.add_group("upstream:u=1").unwrap();
        let f = flow(limits);
        let a = ToolDescriptor::new("a", "").flow_group("upstream:u");
        let b = ToolDescriptor::new("b", "").flow_group("upstream:u");
        let Entry::Running(first) = f.enter(&next_key(), true, "a", Some(&a), &owner("x"), 1)
        else {
            panic!("the group has room");
        };
        let Entry::Queued {
            ticket, mut slot, ..
        } = f.enter(&next_key(), true, "b", Some(&b), &owner("x"), 2)
        else {
            panic!("another tool of the group waits");
        };
        assert!(matches!(
            f.enter(&next_key(), true, "c", None, &owner("x"), 3),
            Entry::Free
        ));
        assert_eq!(f.usage().groups["upstream:u"].running, 1);
        drop(first);
        let second = slot.try_recv().expect("the group's slot went on");
        drop((ticket, second));
        assert_eq!(f.usage().groups["upstream:u"].running, 0);
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
        for (spec, rate) in [
            ("a=2/s", 2.0),
            ("a=30/m", 0.5),
            ("a=0.5/s", 0.5),
            ("a=3600/h", 1.0),
        ] {
            let mut l = FlowLimits::none();
            l.add_rate(spec).unwrap();
            assert_eq!(l.max_starts["a"], rate, "{spec}");
        }
        for bad in [
            "a=2", "a=0/s", "a=-1/s", "a=x/s", "a=2/d", "*=2/s", "=2/s", "a=inf/s",
        ] {
            assert!(FlowLimits::none().add_rate(bad).is_err(), "{bad}");
        }
        assert!(is_queued_message(Some(&queued_message(12))));
        assert!(!is_queued_message(Some("queued: soon")));
        assert!(!is_queued_message(None));
    }
}
