//! Flow control across replicas: this node's entries in the shared store's flow table, and
//! the driver that brings them to rounds ([`crate::store::Cluster::flow_round`]).
//!
//! An entering task waits for the round that records it (one round takes every entry and
//! release waiting at once): it starts there and then if it fits, else it is queued with its
//! place. A waiting entry starts when a round of any node gives it a slot: the round that
//! frees a slot (a release here, or a lease that lapsed) plans the whole table, and signals
//! the node whose entry it started. A node with waiting entries also runs a round at every
//! poll interval (a lost signal, a dead replica's slots) and when a start-rate token is due.
//! Rows of this node that it does not know (left by its previous process, a release whose
//! round failed) are removed by its next round.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::{Notify, oneshot};

use super::plan::{Bucket, Needs, Plan, QueueKey};
use super::{Entry, First, Flow, FlowUsage, Place, Slot, Ticket};
use crate::store::Store;
use crate::store::flow::{FlowBucket, FlowDecision, FlowRound, FlowRow, FlowTable};

/// What the driver knows of one of this node's entries.
enum Known {
    /// Entering: its first round answers on `tx`.
    Entering {
        tx: oneshot::Sender<First>,
        needs: Needs,
    },
    /// Waiting for a slot: it goes on `tx`.
    Waiting {
        tx: oneshot::Sender<Slot>,
        needs: Needs,
    },
    /// Holding its slot.
    Running,
}

#[derive(Default)]
struct State {
    enter: Vec<FlowRow>,
    leave: Vec<(String, u64)>,
    known: HashMap<(String, u64), Known>,
    usage: FlowUsage,
}

pub(super) struct Driver {
    flow: Weak<Flow>,
    store: Store,
    state: Mutex<State>,
    kick: Notify,
    tokens: AtomicU64,
}

/// The plan of a round's table (every row, waiting ones queued under their keys).
fn plan_of(table: &FlowTable) -> Plan<()> {
    let mut plan = Plan::default();
    for b in &table.buckets {
        plan.set_bucket(
            b.name.clone(),
            Bucket {
                tokens: b.tokens,
                at_ms: b.at_ms,
            },
        );
    }
    for row in &table.rows {
        let needs = needs_of(row);
        match row.started {
            Some(started) => plan.running_entry(&needs, &row.owner, started),
            None => {
                plan.queue(&row.owner, queue_key(row), needs, ());
            }
        }
    }
    plan
}

fn needs_of(row: &FlowRow) -> Needs {
    Needs {
        tool: row.tool.clone(),
        counters: row.counters.clone(),
        rate: row.rate.clone(),
    }
}

fn queue_key(row: &FlowRow) -> QueueKey {
    QueueKey {
        created_ms: row.created_ms,
        seq: 0,
        key: row.key.clone(),
    }
}

/// The planner of every round: the same rule as one process's.
fn decide(table: &FlowTable) -> FlowDecision {
    let mut plan = plan_of(table);
    let mut started = Vec::new();
    plan.dispatch(table.now_ms, |_, _, key, _, _, start| {
        started.push((key.key, start));
    });
    let buckets = plan
        .buckets()
        .map(|(name, b)| FlowBucket {
            name: name.clone(),
            tokens: b.tokens,
            at_ms: b.at_ms,
        })
        .collect();
    FlowDecision { started, buckets }
}

impl Driver {
    pub(super) fn start(
        flow: Weak<Flow>,
        store: Store,
        closing: tokio::sync::watch::Receiver<bool>,
    ) -> Arc<Self> {
        // Tokens start from the time of the start, so that a restarted node's tokens do not
        // repeat its previous process's (its rows of then are removed as unknown).
        let start = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX / 2));
        let driver = Arc::new(Self {
            flow,
            store,
            state: Mutex::new(State::default()),
            kick: Notify::new(),
            tokens: AtomicU64::new(start),
        });
        tokio::spawn(driver.clone().run(closing));
        driver
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cluster's figures as of the last round.
    pub(super) fn usage(&self) -> FlowUsage {
        self.lock().usage.clone()
    }

    /// Enters an entry: its first round answers the returned [`Entry::Pending`].
    pub(super) fn enter(
        &self,
        flow: Arc<Flow>,
        key: &str,
        task: bool,
        owner: String,
        needs: Needs,
        created_ms: u64,
    ) -> Entry {
        let token = self.tokens.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut state = self.lock();
            state.enter.push(FlowRow {
                key: key.to_owned(),
                node: String::new(),
                token,
                task,
                owner,
                tool: needs.tool.clone(),
                created_ms,
                counters: needs.counters.clone(),
                rate: needs.rate.clone(),
                started: None,
            });
            state
                .known
                .insert((key.to_owned(), token), Known::Entering { tx, needs });
        }
        self.kick.notify_one();
        Entry::Pending {
            ticket: Ticket {
                flow,
                place: Place::Cluster {
                    key: key.to_owned(),
                    token,
                },
            },
            first: rx,
        }
    }

    /// A slot of this node is given back.
    pub(super) fn release(&self, key: &str, token: u64) {
        let mut state = self.lock();
        state.known.remove(&(key.to_owned(), token));
        state.leave.push((key.to_owned(), token));
        drop(state);
        self.kick.notify_one();
    }

    /// A waiting (or entering) entry's ticket is dropped: it leaves, unless its slot was
    /// given already (the slot then leaves when it is dropped).
    pub(super) fn leave_queue(&self, key: &str, token: u64) {
        let mut state = self.lock();
        let id = (key.to_owned(), token);
        match state.known.get(&id) {
            Some(Known::Running) => return,
            Some(Known::Waiting { needs, .. }) => {
                crate::telemetry::queued(&needs.tool, -1.0);
            }
            _ => {}
        }
        state.known.remove(&id);
        // Not yet sent to a round: it is simply not entered.
        let before = state.enter.len();
        state.enter.retain(|r| !(r.token == token && r.key == key));
        if state.enter.len() == before {
            state.leave.push(id);
        }
        drop(state);
        self.kick.notify_one();
    }

    async fn run(self: Arc<Self>, mut closing: tokio::sync::watch::Receiver<bool>) {
        let Some(cluster) = self.store.cluster() else {
            return;
        };
        let wake = cluster.watch_flow();
        let poll = cluster.poll_interval();
        let mut backoff = Duration::from_millis(50);
        // When the next round is due although nothing changed here (waiting entries).
        let mut due: Option<Duration> = None;
        loop {
            if *closing.borrow() || self.flow.strong_count() == 0 {
                return;
            }
            let idle = {
                let state = self.lock();
                state.enter.is_empty() && state.leave.is_empty()
            };
            if idle {
                let timer = async {
                    match due {
                        Some(d) => tokio::time::sleep(d).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = self.kick.notified() => {}
                    _ = wake.notified(), if due.is_some() => {}
                    _ = timer => {}
                    changed = closing.changed() => {
                        // The runtime is gone (its stop signal dropped): so is this driver.
                        if changed.is_err() {
                            return;
                        }
                        continue;
                    }
                }
            }
            let (enter, leave) = {
                let mut state = self.lock();
                (
                    std::mem::take(&mut state.enter),
                    std::mem::take(&mut state.leave),
                )
            };
            let round = FlowRound {
                enter: enter.clone(),
                leave: leave.clone(),
            };
            if round.enter.is_empty() && round.leave.is_empty() && due.is_none() {
                continue;
            }
            match cluster.flow_round(round, &decide).await {
                Ok(table) => {
                    backoff = Duration::from_millis(50);
                    let entered: Vec<_> = enter.iter().map(|r| (r.key.clone(), r.token)).collect();
                    due = self.settle(&table, &entered, poll);
                }
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?backoff,
                        "a flow-control round failed; its entries and releases wait for the next");
                    {
                        let mut state = self.lock();
                        let mut enter = enter;
                        enter.append(&mut state.enter);
                        state.enter = enter;
                        let mut leave = leave;
                        leave.append(&mut state.leave);
                        state.leave = leave;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        changed = closing.changed() => {
                            if changed.is_err() {
                                return;
                            }
                        }
                    }
                    backoff = (backoff * 2).min(poll.max(Duration::from_millis(50)));
                }
            }
        }
    }

    /// Answers this node's entries from a round's table; returns when the next round is due
    /// without a change here.
    fn settle(
        &self,
        table: &FlowTable,
        entered: &[(String, u64)],
        poll: Duration,
    ) -> Option<Duration> {
        let flow = self.flow.upgrade()?;
        let node = self.store.node_id()?;
        let plan = plan_of(table);
        let mut state = self.lock();
        let mut unknown = Vec::new();
        for row in table.rows.iter().filter(|r| r.node == node) {
            let id = (row.key.clone(), row.token);
            let Some(known) = state.known.remove(&id) else {
                unknown.push(id);
                continue;
            };
            let place = || Place::Cluster {
                key: row.key.clone(),
                token: row.token,
            };
            let next = match (known, row.started) {
                (Known::Entering { tx, needs }, Some(_)) => {
                    crate::telemetry::running_limited(&needs.tool, 1.0);
                    let slot = Slot {
                        flow: flow.clone(),
                        place: place(),
                        needs,
                        armed: true,
                    };
                    if let Err(First::Running(mut slot)) = tx.send(First::Running(slot)) {
                        // Its task went away meanwhile: the slot goes back at the next round.
                        slot.armed = false;
                        crate::telemetry::running_limited(&slot.needs.tool, -1.0);
                        unknown.push(id);
                        continue;
                    }
                    Known::Running
                }
                (Known::Entering { tx, needs }, None) => {
                    let (slot_tx, slot_rx) = oneshot::channel();
                    let ahead = plan.ahead(&row.owner, &queue_key(row));
                    crate::telemetry::queued(&needs.tool, 1.0);
                    let first = First::Queued {
                        ahead,
                        slot: slot_rx,
                    };
                    if tx.send(first).is_err() {
                        crate::telemetry::queued(&needs.tool, -1.0);
                        unknown.push(id);
                        continue;
                    }
                    Known::Waiting { tx: slot_tx, needs }
                }
                (Known::Waiting { tx, needs }, Some(_)) => {
                    crate::telemetry::queued(&needs.tool, -1.0);
                    crate::telemetry::running_limited(&needs.tool, 1.0);
                    let slot = Slot {
                        flow: flow.clone(),
                        place: place(),
                        needs,
                        armed: true,
                    };
                    if let Err(mut slot) = tx.send(slot) {
                        // Its task went away meanwhile: the slot goes back at the next round.
                        slot.armed = false;
                        crate::telemetry::running_limited(&slot.needs.tool, -1.0);
                        unknown.push(id);
                        continue;
                    }
                    Known::Running
                }
                (waiting @ Known::Waiting { .. }, None) => waiting,
                (Known::Running, _) => Known::Running,
            };
            state.known.insert(id, next);
        }
        // Entered in this round but not in its table: its task is no longer this node's
        // (its lease moved). It waits without a slot; its actor, fenced, goes.
        let lost: Vec<_> = state
            .known
            .iter()
            .filter(|(id, k)| {
                matches!(k, Known::Entering { .. }) && entered.iter().any(|e| e == *id)
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in lost {
            if let Some(Known::Entering { tx, needs }) = state.known.remove(&id) {
                let (slot_tx, slot_rx) = oneshot::channel();
                let _ = tx.send(First::Queued {
                    ahead: 0,
                    slot: slot_rx,
                });
                state
                    .known
                    .insert(id, Known::Waiting { tx: slot_tx, needs });
            }
        }
        state.leave.extend(unknown);
        let waiting = state.known.values().any(|k| !matches!(k, Known::Running));
        state.usage = super::usage_of(&plan);
        let leave = !state.leave.is_empty();
        drop(state);
        if leave {
            self.kick.notify_one();
        }
        if !waiting {
            return None;
        }
        // A start-rate token due sooner than the poll interval.
        let token = table
            .rows
            .iter()
            .filter(|r| r.started.is_none())
            .filter_map(|r| r.rate.as_ref())
            .filter_map(|(name, rate)| {
                let b = table.buckets.iter().find(|b| &b.name == name)?;
                let bucket = Bucket {
                    tokens: b.tokens,
                    at_ms: b.at_ms,
                };
                let missing = 1.0 - bucket.tokens_at(*rate, table.now_ms);
                Some(Duration::from_secs_f64(
                    (missing.max(0.0) / rate).min(3600.0),
                ))
            })
            .min();
        Some(
            token
                .map_or(poll, |t| t.min(poll))
                .max(Duration::from_millis(5)),
        )
    }
}
