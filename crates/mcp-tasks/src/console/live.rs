//! `GET api/events`: the console's live updates as server-sent events.
//!
//! On a store of one process the events are the runtime's committed changes
//! ([`crate::shared::Changes`], sent after each commit, like the snapshots listens follow).
//! On a store shared by replicas they come from the store's notifications of every node's
//! commits ([`crate::store::Cluster::watch_commits`]), read by one [`Follower`] per console
//! whatever the number of streams: the ids that arrive in a short window are read together,
//! once, and the rows are handed to every stream, each keeping those its viewer may see. A
//! viewer gets only the tasks it may see; one that falls behind gets a `resync` event (the
//! page reloads what it shows) instead of a backlog.
//!
//! A principal holds at most [`super::Console::max_streams_per_principal`] streams (`429`
//! beyond), and every stream checks its viewer's credential again every [`RECHECK`]: a
//! credential removed from the token file, expired, or whose session ended closes its streams.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;

use super::api::row;
use super::guard::Caller;
use super::viewer::{self, Viewer};
use super::{AppState, ConsoleState};
use crate::shared::TaskChange;
use crate::store::listing::ListedTask;
use crate::store::owner_key;

/// How long changes (or, on a shared store, the ids of its notifications) are gathered after
/// the first before they are sent: well within the second a page promises.
const GATHER: Duration = Duration::from_millis(250);
/// The most tasks of one batch: past it the viewer is told to resync (reload what it shows)
/// instead.
const MAX_BATCH: usize = 256;
/// The keep-alive comment interval.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// How often a stream checks its viewer's credential (and session) again.
pub(super) const RECHECK: Duration = Duration::from_secs(2);
/// Batches of the follower a slow stream may fall behind by before it resyncs.
const FOLLOWER_BACKLOG: usize = 64;

/// `GET api/events`.
pub(super) async fn events(State(state): State<AppState>, caller: Caller) -> Response {
    let viewer = match viewer::viewer(&state, &caller).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let Some(slot) = StreamSlot::take(&state, &viewer) else {
        tracing::info!(principal = %viewer.principal(), "console: event stream refused: too many open");
        let mut refused = viewer::error(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "this principal already holds {} open event streams (the most allowed)",
                state.settings.max_streams_per_principal
            ),
        );
        refused.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from_static("5"),
        );
        return refused;
    };
    let stream = match follow(&state) {
        Some(batches) => cluster_events(viewer.clone(), batches),
        None => local_events(&state, viewer.clone()),
    };
    let closing = state.shared.closing.clone();
    // The stream ends when the runtime shuts down (a server's graceful drain waits for it),
    // and when the viewer's credential is no longer accepted.
    let stream = stream
        .take_until(async move {
            let mut closing = closing;
            let _ = closing.wait_for(|c| *c).await;
        })
        .take_until(revoked(state.clone(), caller, viewer))
        // The slot is released with the stream.
        .map(move |event| {
            let _held = &slot;
            event
        });
    Sse::new(stream.map(Ok::<_, Infallible>))
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE).text("keep-alive"))
        .into_response()
}

/// Returns once `viewer`'s credential is no longer accepted as it was (refused, revoked,
/// expired, its session ended, or its scopes changed); never without authentication.
async fn revoked(state: AppState, caller: Caller, viewer: Viewer) {
    if state.settings.authenticator.is_none() {
        return futures::future::pending().await;
    }
    loop {
        tokio::time::sleep(RECHECK).await;
        match viewer::viewer(&state, &caller).await {
            Ok(now) if now.identity == viewer.identity => {}
            Ok(_) | Err(_) => {
                tracing::info!(principal = %viewer.principal(),
                    "console: an event stream closed: its credential is no longer accepted");
                return;
            }
        }
    }
}

/// One open event stream of a principal, counted until dropped.
struct StreamSlot {
    state: Weak<ConsoleState>,
    key: String,
}

impl StreamSlot {
    fn take(state: &AppState, viewer: &Viewer) -> Option<StreamSlot> {
        let key = viewer.stream_key();
        let mut streams = ConsoleState::lock(&state.streams);
        let n = streams.entry(key.clone()).or_default();
        if *n >= state.settings.max_streams_per_principal {
            return None;
        }
        *n += 1;
        Some(StreamSlot {
            state: Arc::downgrade(state),
            key,
        })
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        if let Some(state) = self.state.upgrade() {
            let mut streams = ConsoleState::lock(&state.streams);
            if let Some(n) = streams.get_mut(&self.key) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    streams.remove(&self.key);
                }
            }
        }
    }
}

fn task_event(task: &ListedTask, is_error: bool) -> Event {
    Event::default()
        .event("task")
        .data(row(task, is_error).to_string())
}

fn resync() -> Event {
    Event::default().event("resync").data("{}")
}

/// What arrived on `receiver` from its next item on, for [`GATHER`]: the items, and whether
/// some were lost (the receiver lagged). `None` once the channel is closed.
async fn gather<T: Clone>(receiver: &mut broadcast::Receiver<T>) -> Option<(Vec<T>, bool)> {
    let (mut items, mut lagged) = (Vec::new(), false);
    match receiver.recv().await {
        Ok(item) => items.push(item),
        Err(RecvError::Lagged(_)) => lagged = true,
        Err(RecvError::Closed) => return None,
    }
    let deadline = tokio::time::sleep(GATHER);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            _ = &mut deadline => break,
            next = receiver.recv() => match next {
                Ok(item) => items.push(item),
                Err(RecvError::Lagged(_)) => lagged = true,
                Err(RecvError::Closed) => break,
            },
        }
    }
    Some((items, lagged))
}

/// The runtime's own committed changes, gathered for [`GATHER`] after the first one and sent
/// together, the latest of each task only (a task's creation and completion in one window are
/// one event): the work per change is a channel send, and a page under heavy load gets a few
/// writes a second, not one per commit.
fn local_events(state: &ConsoleState, viewer: Viewer) -> BoxStream<'static, Event> {
    let receiver = state.shared.changes.subscribe();
    futures::stream::unfold((receiver, viewer), |(mut receiver, viewer)| async move {
        loop {
            let (changes, lagged) = gather(&mut receiver).await?;
            let latest: BTreeMap<String, TaskChange> = changes
                .into_iter()
                .filter(|change| viewer.may_see(&change.owner))
                .map(|change| (change.id.clone(), change))
                .collect();
            if lagged || latest.len() > MAX_BATCH {
                return Some((vec![resync()], (receiver, viewer)));
            }
            if latest.is_empty() {
                continue;
            }
            let events = latest
                .into_values()
                .map(|change| {
                    let task = ListedTask {
                        id: change.id,
                        owner: owner_key(&change.owner.tenant, &change.owner.principal),
                        created_ms: change.created_ms,
                        listing: change.listing,
                    };
                    task_event(&task, change.is_error)
                })
                .collect();
            return Some((events, (receiver, viewer)));
        }
    })
    .flat_map(futures::stream::iter)
    .boxed()
}

/// What the [`Follower`] hands every stream.
#[derive(Debug)]
enum Batch {
    /// The rows of the tasks committed in one window (each with whether it completed with
    /// a tool error).
    Rows(Vec<(ListedTask, bool)>),
    /// Too many, or some were lost: reload.
    Resync,
}

/// The one reader of a shared store's commit notifications per console: it reads the rows of
/// each window's ids once and broadcasts them to the console's streams. Started by the first
/// stream; it ends once no stream is left (at the next notification).
pub(super) struct Follower {
    batches: broadcast::Sender<Arc<Batch>>,
}

/// A receiver of the follower's batches, starting the follower if none runs; `None` when the
/// store is not shared.
fn follow(state: &AppState) -> Option<broadcast::Receiver<Arc<Batch>>> {
    let cluster = state.shared.store.cluster()?;
    let mut follower = ConsoleState::lock(&state.follower);
    if let Some(running) = follower.as_ref() {
        return Some(running.batches.subscribe());
    }
    let ids = cluster.watch_commits()?;
    let (batches, receiver) = broadcast::channel(FOLLOWER_BACKLOG);
    *follower = Some(Follower {
        batches: batches.clone(),
    });
    tokio::spawn(run_follower(Arc::downgrade(state), ids, batches));
    Some(receiver)
}

async fn run_follower(
    state: Weak<ConsoleState>,
    mut ids: broadcast::Receiver<String>,
    batches: broadcast::Sender<Arc<Batch>>,
) {
    tracing::debug!("console: the follower of committed changes started");
    loop {
        let gathered = gather(&mut ids).await;
        let Some(state) = state.upgrade() else { return };
        let Some((ids_of_window, lagged)) = gathered else {
            *ConsoleState::lock(&state.follower) = None;
            return;
        };
        let ids_of_window: BTreeSet<String> = ids_of_window.into_iter().collect();
        let batch = if lagged || ids_of_window.len() > MAX_BATCH {
            Batch::Resync
        } else {
            read_rows(&state, ids_of_window).await
        };
        let delivered = batches.send(Arc::new(batch)).is_ok();
        if !delivered || *state.shared.closing.borrow() {
            let mut follower = ConsoleState::lock(&state.follower);
            // Streams subscribe under this lock: none can join between the check and the end.
            if batches.receiver_count() == 0 || *state.shared.closing.borrow() {
                *follower = None;
                tracing::debug!("console: the follower of committed changes ended");
                return;
            }
        }
    }
}

/// One stream's share of the follower's batches: the rows its viewer may see.
fn cluster_events(
    viewer: Viewer,
    receiver: broadcast::Receiver<Arc<Batch>>,
) -> BoxStream<'static, Event> {
    futures::stream::unfold((receiver, viewer), |(mut receiver, viewer)| async move {
        loop {
            let batch = match receiver.recv().await {
                Ok(batch) => batch,
                Err(RecvError::Lagged(_)) => return Some((vec![resync()], (receiver, viewer))),
                Err(RecvError::Closed) => return None,
            };
            let events: Vec<Event> = match &*batch {
                Batch::Resync => vec![resync()],
                Batch::Rows(rows) => rows
                    .iter()
                    .filter(|(task, _)| viewer.may_see_key(&task.owner))
                    .map(|(task, is_error)| task_event(task, *is_error))
                    .collect(),
            };
            if !events.is_empty() {
                return Some((events, (receiver, viewer)));
            }
        }
    })
    .flat_map(futures::stream::iter)
    .boxed()
}

/// The rows of `ids`, read from the store once.
async fn read_rows(state: &ConsoleState, ids: BTreeSet<String>) -> Batch {
    let ids: Vec<String> = ids.into_iter().collect();
    let records = match state.shared.store.get_many(ids).await {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(error = %e, "console: could not read changed tasks");
            return Batch::Resync;
        }
    };
    let rows = records
        .into_iter()
        .flatten()
        .filter_map(|bytes| crate::persist::decode(&bytes).ok())
        .map(|record| {
            let task = ListedTask {
                id: record.id.as_str().to_owned(),
                owner: owner_key(&record.owner.tenant, &record.owner.principal),
                created_ms: record.created_at_ms,
                listing: crate::persist::listing_of(&record),
            };
            (task, crate::shared::tool_error(&record))
        })
        .collect();
    Batch::Rows(rows)
}
