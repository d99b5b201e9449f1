//! The PostgreSQL store's dedicated `LISTEN` connection: wake-ups from other nodes, and the
//! sweep leadership (a session advisory lock held by the same connection).
//!
//! Notifications are hints that carry ids only (PostgreSQL `NOTIFY` payloads are small and
//! are lost while a listener is disconnected); the rows are the truth. Payloads on the
//! schema's channel:
//!
//! | payload        | sent by                                   | wakes                        |
//! |----------------|-------------------------------------------|------------------------------|
//! | `T ID ID …`    | the node that committed tasks, after the commit (one per commit or group) | the watchers of each `ID` |
//! | `t ID SEQ`     | a trigger on every write of a task's bytes (schemas 2 to 7) | the watchers of task `ID` |
//! | `c NODE`       | a node recording a command for `NODE`     | `NODE`'s inbox               |
//! | `a ID`         | the node answering a command for task `ID` | the watchers of task `ID`   |
//! | `f`            | a flow-control round that freed or gave a slot | the flow-control driver |
//!
//! After every (re)connection everything is woken once (catch-up: each waiter reads the
//! store again), so a notification lost while disconnected only delays.
//!
//! Every one is a hint: a waiter also polls. The ids of `T` and `t` payloads (every task any
//! node commits) are also broadcast to
//! `Cluster::watch_commits` receivers ([`Hub::commits`]; one that lags loses the oldest).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::Notify;
use tokio_postgres::{AsyncMessage, NoTls};

use super::pg_detail;
use crate::Wakeup;

/// The advisory lock (with the schema's hash) whose holder sweeps finished tasks.
const SWEEP_LOCK: i32 = 727302;

/// How often the listening connection is checked (and the sweep lock tried) while quiet.
const PING_EVERY: Duration = Duration::from_secs(2);

/// The committed task ids a `watch_commits` receiver may fall behind by before it loses the
/// oldest.
const COMMITS_BUFFER: usize = 1024;

/// Watchers by key.
#[derive(Default)]
pub(crate) struct Registry {
    map: Mutex<HashMap<String, Vec<Weak<Notify>>>>,
}

struct Registration {
    registry: Weak<Registry>,
    key: String,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(registry) = self.registry.upgrade() {
            let mut map = registry.map.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(list) = map.get_mut(&self.key) {
                list.retain(|w| w.strong_count() > 0);
                if list.is_empty() {
                    map.remove(&self.key);
                }
            }
        }
    }
}

impl Registry {
    pub(crate) fn watch(self: &Arc<Self>, key: &str) -> Wakeup {
        let notify = Arc::new(Notify::new());
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.to_owned())
            .or_default()
            .push(Arc::downgrade(&notify));
        Wakeup::new(
            notify,
            Some(Box::new(Registration {
                registry: Arc::downgrade(self),
                key: key.to_owned(),
            })),
        )
    }

    fn wake(&self, key: &str) {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(list) = map.get(key) {
            for n in list.iter().filter_map(Weak::upgrade) {
                n.notify_one();
            }
        }
    }

    fn wake_all(&self) {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        for n in map.values().flatten().filter_map(Weak::upgrade) {
            n.notify_one();
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().unwrap().len()
    }
}

/// What the listening connection feeds.
pub(crate) struct Hub {
    pub(crate) node: String,
    pub(crate) channel: String,
    pub(crate) tasks: Arc<Registry>,
    pub(crate) inbox: Arc<Notify>,
    /// Flow control: a slot was freed or given by another node (`f` payloads).
    pub(crate) flow: Arc<Notify>,
    /// The ids of the tasks committed by any node (`t` payloads), for `Cluster::watch_commits`.
    pub(crate) commits: tokio::sync::broadcast::Sender<String>,
    /// Whether the listening connection holds the sweep lock.
    pub(crate) leader: AtomicBool,
    /// Whether the connection is up and listening.
    pub(crate) listening: AtomicBool,
    /// Test only: notifications are dropped as if lost.
    pub(crate) lose: AtomicBool,
    pub(crate) closed: AtomicBool,
}

impl Hub {
    pub(crate) fn new(node: String, channel: String) -> Hub {
        Hub {
            node,
            channel,
            tasks: Arc::new(Registry::default()),
            inbox: Arc::new(Notify::new()),
            flow: Arc::new(Notify::new()),
            commits: tokio::sync::broadcast::channel(COMMITS_BUFFER).0,
            leader: AtomicBool::new(false),
            listening: AtomicBool::new(false),
            lose: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        }
    }

    fn dispatch(&self, payload: &str) {
        if self.lose.load(Ordering::SeqCst) {
            tracing::debug!(payload, "notification dropped (test switch)");
            return;
        }
        let mut parts = payload.split(' ');
        match (parts.next(), parts.next()) {
            (Some("t"), Some(id)) => {
                self.tasks.wake(id);
                // No receiver: nobody watches (an error only says so).
                let _ = self.commits.send(id.to_owned());
            }
            // A commit (or a group of commits) of this schema's tasks, by any node.
            (Some("T"), Some(first)) => {
                for id in std::iter::once(first).chain(parts) {
                    self.tasks.wake(id);
                    let _ = self.commits.send(id.to_owned());
                }
            }
            (Some("a"), Some(id)) => self.tasks.wake(id),
            (Some("c"), Some(node)) if node == self.node => self.inbox.notify_one(),
            (Some("c"), Some(_)) => {}
            (Some("f"), _) => self.flow.notify_one(),
            _ => tracing::debug!(payload, "unknown notification ignored"),
        }
    }

    /// Wakes everything: after a (re)connection, notifications may have been missed.
    fn catch_up(&self) {
        self.tasks.wake_all();
        self.inbox.notify_one();
        self.flow.notify_one();
    }
}

/// Keeps a connection listening on the hub's channel until the store closes; reconnects with
/// backoff when it breaks, and then wakes every waiter once.
pub(crate) async fn listen(hub: Weak<Hub>, config: tokio_postgres::Config) {
    let mut backoff = Duration::from_millis(100);
    let mut warned = false;
    loop {
        let Some(h) = hub.upgrade() else { return };
        if h.closed.load(Ordering::SeqCst) {
            return;
        }
        let channel = h.channel.clone();
        drop(h);
        let mut listened = false;
        let result = session(&hub, &config, &channel, &mut listened).await;
        let Some(h) = hub.upgrade() else { return };
        h.listening.store(false, Ordering::SeqCst);
        if h.leader.swap(false, Ordering::SeqCst) {
            tracing::info!(node = %h.node, "no longer the sweep leader (its connection ended)");
        }
        if h.closed.load(Ordering::SeqCst) {
            return;
        }
        let Err(detail) = result else { return };
        if listened {
            backoff = Duration::from_millis(100);
            warned = false;
        }
        if !warned {
            tracing::warn!(node = %h.node, %detail,
                "the PostgreSQL listening connection is down; other nodes' changes are polled until it is back");
            warned = true;
        }
        drop(h);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// One listening session; `Ok` when the store closed, `Err` when the connection failed.
async fn session(
    hub: &Weak<Hub>,
    config: &tokio_postgres::Config,
    channel: &str,
    listened: &mut bool,
) -> Result<(), String> {
    let (client, mut connection) = config.connect(NoTls).await.map_err(|e| pg_detail(&e))?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let driver = tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    if tx.send(n.payload().to_owned()).is_err() {
                        return Ok(());
                    }
                }
                Ok(_) => {}
                Err(e) => return Err(pg_detail(&e)),
            }
        }
        Ok(())
    });
    let mut driver = driver;
    let _abort = AbortOnDrop(driver.abort_handle());
    let setup = async {
        client
            .batch_execute(&format!("LISTEN \"{channel}\""))
            .await
            .map_err(|e| pg_detail(&e))
    };
    tokio::time::timeout(Duration::from_secs(10), setup)
        .await
        .map_err(|_| "LISTEN timed out".to_owned())??;
    {
        let Some(h) = hub.upgrade() else {
            return Ok(());
        };
        h.listening.store(true, Ordering::SeqCst);
        *listened = true;
        tracing::info!(node = %h.node, channel, "listening for other nodes' changes");
        try_lead(&h, &client).await?;
        h.catch_up();
    }
    loop {
        tokio::select! {
            payload = rx.recv() => {
                let Some(h) = hub.upgrade() else { return Ok(()) };
                match payload {
                    Some(p) => h.dispatch(&p),
                    None => {
                        drop(h);
                        return match (&mut driver).await {
                            Ok(Err(e)) => Err(e),
                            _ => Err("the listening connection closed".to_owned()),
                        };
                    }
                }
            }
            _ = tokio::time::sleep(PING_EVERY) => {
                let Some(h) = hub.upgrade() else { return Ok(()) };
                if h.closed.load(Ordering::SeqCst) {
                    return Ok(());
                }
                let ping = tokio::time::timeout(Duration::from_secs(5), client.batch_execute("SELECT 1"));
                match ping.await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err(pg_detail(&e)),
                    Err(_) => return Err("the listening connection did not answer for 5 s".to_owned()),
                }
                if !h.leader.load(Ordering::SeqCst) {
                    try_lead(&h, &client).await?;
                }
            }
        }
    }
}

/// Takes the sweep lock if no other node's session holds it (held until this connection
/// ends).
async fn try_lead(hub: &Hub, client: &tokio_postgres::Client) -> Result<(), String> {
    let row = client
        .query_one(
            "SELECT pg_try_advisory_lock($1, hashtext(coalesce(current_schema(), '')))",
            &[&SWEEP_LOCK],
        )
        .await
        .map_err(|e| pg_detail(&e))?;
    if row.get::<_, bool>(0) && !hub.leader.swap(true, Ordering::SeqCst) {
        tracing::info!(node = %hub.node, "this node sweeps finished tasks for the cluster (sweep leader)");
    }
    Ok(())
}

struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_wake_before_the_wait_is_kept_and_dropped_watches_unregister() {
        let registry = Arc::new(Registry::default());
        let a = registry.watch("t1");
        let b = registry.watch("t1");
        let other = registry.watch("t2");
        registry.wake("t1");
        // Fired before anyone waited: kept.
        tokio::time::timeout(Duration::from_secs(1), a.notified())
            .await
            .expect("a is woken");
        tokio::time::timeout(Duration::from_secs(1), b.notified())
            .await
            .expect("b is woken");
        assert!(
            tokio::time::timeout(Duration::from_millis(50), other.notified())
                .await
                .is_err(),
            "another task's watcher is not woken"
        );
        drop(a);
        drop(b);
        assert_eq!(registry.len(), 1);
        drop(other);
        assert_eq!(registry.len(), 0);
    }

    #[tokio::test]
    async fn payloads_wake_what_they_name() {
        let hub = Hub::new("a".into(), "ch".into());
        let task = hub.tasks.watch("tsk_1");
        hub.dispatch("t tsk_1 7");
        tokio::time::timeout(Duration::from_secs(1), task.notified())
            .await
            .expect("task change wakes");
        hub.dispatch("a tsk_1");
        tokio::time::timeout(Duration::from_secs(1), task.notified())
            .await
            .expect("answer wakes");
        // Commits are broadcast to the watchers subscribed before them (answers are not).
        let mut commits = hub.commits.subscribe();
        hub.dispatch("t tsk_2 3");
        hub.dispatch("a tsk_2");
        assert_eq!(commits.try_recv().unwrap(), "tsk_2");
        assert!(commits.try_recv().is_err());
        // A group's announcement names each of its tasks.
        hub.dispatch("T tsk_3 tsk_1 tsk_4");
        tokio::time::timeout(Duration::from_secs(1), task.notified())
            .await
            .expect("a group naming the task wakes it");
        let named: Vec<String> = std::iter::from_fn(|| commits.try_recv().ok()).collect();
        assert_eq!(named, ["tsk_3", "tsk_1", "tsk_4"]);
        hub.dispatch("f");
        tokio::time::timeout(Duration::from_secs(1), hub.flow.notified())
            .await
            .expect("a flow round wakes the driver");
        hub.dispatch("c b");
        assert!(
            tokio::time::timeout(Duration::from_millis(50), hub.inbox.notified())
                .await
                .is_err(),
            "a command for another node does not wake this inbox"
        );
        hub.dispatch("c a");
        tokio::time::timeout(Duration::from_secs(1), hub.inbox.notified())
            .await
            .expect("a command for this node wakes its inbox");
        hub.lose.store(true, Ordering::SeqCst);
        hub.dispatch("t tsk_1 8");
        assert!(
            tokio::time::timeout(Duration::from_millis(50), task.notified())
                .await
                .is_err(),
            "a lost notification wakes nothing"
        );
    }
}
