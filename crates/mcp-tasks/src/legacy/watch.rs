//! One watcher per followed task in this process, shared by every legacy session and every
//! `tasks/result` that follows the task.
//!
//! A watcher is the runtime's own listen machinery (a subscriber actor on the task's committed
//! snapshots, [`crate::protocol::Dispatcher::follow_task`]): nothing polls. Each snapshot
//! becomes the watcher's latest value (read by `tasks/result`) and a
//! `notifications/tasks/status` (with the task's input requests) on the standing stream of
//! every session that follows the task. The watcher stops when the task is terminal, or when
//! the last session or `tasks/result` that follows it lets go ([`Interest`] dropped: the
//! session ended, was forgotten, or the client of a `tasks/result` went away).
//!
//! What a follower costs: an entry in the watcher's follower map and an [`Interest`] held by
//! the session (a few dozen bytes); the sessions that follow are bounded per owner by
//! [`crate::quota::Quotas::max_sessions`], the tasks by the owner's live tasks.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use serde_json::Value;
use tokio::sync::watch;
use tokio::task::AbortHandle;

use super::hub::Live;
use crate::task::{Owner, TaskId};

/// The latest snapshot of a followed task (a modern `DetailedTask`), `None` before the first.
pub(crate) type Latest = watch::Receiver<Option<Arc<Value>>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Entry {
    /// Tells this watcher apart from a later one of the same task.
    id: u64,
    owner: Owner,
    latest: watch::Sender<Option<Arc<Value>>>,
    /// Sessions that follow the task on their standing stream, by follower number.
    sessions: HashMap<u64, Weak<Live>>,
    /// Open `tasks/result` requests that follow the task.
    results: usize,
    feeder: Option<AbortHandle>,
}

impl Entry {
    fn unused(&self) -> bool {
        self.sessions.is_empty() && self.results == 0
    }
}

/// The watchers of one legacy adapter.
#[derive(Default)]
pub(crate) struct Watchers {
    entries: Mutex<HashMap<String, Entry>>,
    next: AtomicU64,
    started: AtomicU64,
}

/// A follower's place in a watcher; dropping it lets go (the last one stops the watcher).
pub(crate) struct Interest {
    watchers: Arc<Watchers>,
    task: String,
    entry: u64,
    /// The session follower's number; `None` for a `tasks/result`.
    follower: Option<u64>,
}

impl Drop for Interest {
    fn drop(&mut self) {
        let mut entries = lock(&self.watchers.entries);
        let Some(entry) = entries.get_mut(&self.task).filter(|e| e.id == self.entry) else {
            return;
        };
        match self.follower {
            Some(n) => {
                entry.sessions.remove(&n);
            }
            None => entry.results = entry.results.saturating_sub(1),
        }
        if entry.unused()
            && let Some(entry) = entries.remove(&self.task)
            && let Some(feeder) = entry.feeder
        {
            feeder.abort();
        }
    }
}

impl Watchers {
    /// Follows `task` of `owner` for `session` (its standing stream), or for a `tasks/result`
    /// when `session` is `None`: joins the task's watcher, starting it with `start` (which
    /// runs `feed` on the task's snapshots) if there is none. `None` when the task is watched
    /// for another owner (callers check ownership first; this is a second guard).
    pub(crate) fn follow(
        self: &Arc<Self>,
        owner: &Owner,
        task: &str,
        session: Option<&Arc<Live>>,
        start: impl FnOnce(u64) -> AbortHandle,
    ) -> Option<(Interest, Latest)> {
        let mut entries = lock(&self.entries);
        let entry = match entries.get_mut(task) {
            Some(e) if !e.owner.same_as(owner) => return None,
            Some(e) => e,
            None => {
                let id = self.next.fetch_add(1, Ordering::Relaxed);
                self.started.fetch_add(1, Ordering::Relaxed);
                let entry = Entry {
                    id,
                    owner: owner.clone(),
                    latest: watch::channel(None).0,
                    sessions: HashMap::new(),
                    results: 0,
                    feeder: Some(start(id)),
                };
                entries.entry(task.to_owned()).or_insert(entry)
            }
        };
        let follower = session.map(|live| {
            let n = self.next.fetch_add(1, Ordering::Relaxed);
            entry.sessions.insert(n, Arc::downgrade(live));
            n
        });
        if follower.is_none() {
            entry.results += 1;
        }
        let interest = Interest {
            watchers: self.clone(),
            task: task.to_owned(),
            entry: entry.id,
            follower,
        };
        Some((interest, entry.latest.subscribe()))
    }

    /// Records a new snapshot of the watcher `entry` of `task`; the sessions to tell.
    pub(crate) fn publish(&self, task: &str, entry: u64, detail: Arc<Value>) -> Vec<Arc<Live>> {
        let mut entries = lock(&self.entries);
        let Some(e) = entries.get_mut(task).filter(|e| e.id == entry) else {
            return Vec::new();
        };
        e.latest.send_replace(Some(detail));
        e.sessions.values().filter_map(Weak::upgrade).collect()
    }

    /// The watcher `entry` of `task` stopped (its task is terminal, or it could not follow
    /// it): forgotten; the sessions that followed it, to let go of it.
    pub(crate) fn finish(&self, task: &str, entry: u64) -> Vec<Arc<Live>> {
        let mut entries = lock(&self.entries);
        if entries.get(task).is_none_or(|e| e.id != entry) {
            return Vec::new();
        }
        let Some(e) = entries.remove(task) else {
            return Vec::new();
        };
        e.sessions.values().filter_map(Weak::upgrade).collect()
    }

    /// Tasks watched now.
    #[cfg(test)]
    pub(crate) fn active(&self) -> usize {
        lock(&self.entries).len()
    }

    /// Watchers started since this adapter was made.
    #[cfg(test)]
    pub(crate) fn started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }

    /// Followers of `task` now: sessions and `tasks/result` requests.
    #[cfg(test)]
    pub(crate) fn followers(&self, task: &str) -> (usize, usize) {
        lock(&self.entries)
            .get(task)
            .map_or((0, 0), |e| (e.sessions.len(), e.results))
    }
}

/// Parses a task id for the runtime's follower (an invalid one is never watched).
pub(crate) fn task_id(task: &str) -> Option<TaskId> {
    TaskId::parse(task).ok()
}
