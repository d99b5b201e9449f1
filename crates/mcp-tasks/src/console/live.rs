//! `GET api/events`: the console's live updates as server-sent events.
//!
//! On a store of one process the events are the runtime's committed changes
//! ([`crate::shared::Changes`], sent after each commit, like the snapshots listens follow).
//! On a store shared by replicas they come from the store's notifications of every node's
//! commits ([`crate::store::Cluster::watch_commits`]): the ids that arrive in a short window
//! are read together and sent as rows. A viewer gets only the tasks it may see; one that
//! falls behind gets a `resync` event (the page reloads what it shows) instead of a backlog.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;

use super::api::row;
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

/// `GET api/events`.
pub(super) async fn events(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let viewer = match viewer::viewer(&state, &headers).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let stream = match state.shared.store.cluster().and_then(|c| c.watch_commits()) {
        Some(ids) => cluster_events(state.clone(), viewer, ids),
        None => local_events(&state, viewer),
    };
    let closing = state.shared.closing.clone();
    // The stream ends when the runtime shuts down (a server's graceful drain waits for it).
    let stream = stream.take_until(async move {
        let mut closing = closing;
        let _ = closing.wait_for(|c| *c).await;
    });
    Sse::new(stream.map(Ok::<_, Infallible>))
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE).text("keep-alive"))
        .into_response()
}

fn task_event(task: &ListedTask) -> Event {
    Event::default().event("task").data(row(task).to_string())
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
                    task_event(&ListedTask {
                        id: change.id,
                        owner: owner_key(&change.owner.tenant, &change.owner.principal),
                        created_ms: change.created_ms,
                        listing: change.listing,
                    })
                })
                .collect();
            return Some((events, (receiver, viewer)));
        }
    })
    .flat_map(futures::stream::iter)
    .boxed()
}

/// Every node's commits, from the store's notifications: the ids of a [`GATHER`] window,
/// read back together.
fn cluster_events(
    state: AppState,
    viewer: Viewer,
    receiver: broadcast::Receiver<String>,
) -> BoxStream<'static, Event> {
    futures::stream::unfold(
        (receiver, viewer, state),
        |(mut receiver, viewer, state)| async move {
            loop {
                let (ids, lagged) = gather(&mut receiver).await?;
                let ids: BTreeSet<String> = ids.into_iter().collect();
                if lagged || ids.len() > MAX_BATCH {
                    return Some((vec![resync()], (receiver, viewer, state)));
                }
                let events = read_rows(&state, &viewer, ids).await;
                if !events.is_empty() {
                    return Some((events, (receiver, viewer, state)));
                }
            }
        },
    )
    .flat_map(futures::stream::iter)
    .boxed()
}

/// The rows of `ids` the viewer may see, read from the store.
async fn read_rows(state: &ConsoleState, viewer: &Viewer, ids: BTreeSet<String>) -> Vec<Event> {
    let ids: Vec<String> = ids.into_iter().collect();
    let records = match state.shared.store.get_many(ids).await {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(error = %e, "console: could not read changed tasks");
            return vec![resync()];
        }
    };
    let mut events = Vec::new();
    for bytes in records.into_iter().flatten() {
        let Ok(record) = crate::persist::decode(&bytes) else {
            continue;
        };
        if !viewer.may_see(&record.owner) {
            continue;
        }
        let task = ListedTask {
            id: record.id.as_str().to_owned(),
            owner: owner_key(&record.owner.tenant, &record.owner.principal),
            created_ms: record.created_at_ms,
            listing: crate::store::listing_of(&record),
        };
        events.push(task_event(&task));
    }
    events
}
