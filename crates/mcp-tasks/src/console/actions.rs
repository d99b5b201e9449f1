//! The console's actions (only with [`super::Console::actions`]; with authentication, only for
//! an `admin` credential; from a browser, with the CSRF token): cancel a task, cancel every
//! task a filter matches, purge finished tasks. A cancellation goes through the protocol's
//! `tasks/cancel`, as the task's owner, so it is the same cooperative cancellation a client
//! asks for; a purge deletes finished records as the reaper does. Each is logged with the
//! principal that did it. Work per request is bounded: a request cancels or purges at most
//! [`BATCH`] tasks and says whether more remain.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::api::{scoped_query, store_error, visible_record};
use super::guard::Caller;
use super::viewer::{self, Viewer, error, may_act};
use super::{AppState, ConsoleState};
use crate::store::listing::{
    DEFAULT_LISTING_BUDGET, ListedStatus, ListingCursor, ListingFilter, MAX_LISTING_PAGE,
};
use crate::task::{Owner, TaskRecord};

/// The most tasks one request cancels or purges.
const BATCH: usize = 500;
/// Deletions per commit of a purge.
const PURGE_COMMIT: usize = 250;

/// The viewer, if it may act.
async fn actor(state: &ConsoleState, caller: &Caller) -> Result<Viewer, Response> {
    let viewer = viewer::viewer(state, caller).await?;
    may_act(state, &viewer, &caller.headers)?;
    Ok(viewer)
}

/// Sends `tasks/cancel` for `record` as its owner; the task's status after it.
async fn cancel(state: &ConsoleState, record: &TaskRecord) -> Result<String, String> {
    let request = json!({
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tasks/cancel",
        "params": {
            "taskId": record.id.as_str(),
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": crate::wire::PROTOCOL_VERSION,
                "io.modelcontextprotocol/clientCapabilities":
                    { "extensions": { "io.modelcontextprotocol/tasks": {} } },
            },
        },
    });
    let owner: &Owner = &record.owner;
    match state.handle.handle_json(request, owner).await {
        Some(answer) => {
            if let Some(e) = answer.get("error") {
                return Err(e
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("refused")
                    .to_owned());
            }
            // The task as it is now: `cancelled` at once when it waited for input, still
            // `working` while its tool winds down (cancellation is cooperative).
            match state.shared.load(&record.id).await {
                Ok(Some(now)) => Ok(now.status.as_str().to_owned()),
                _ => Ok(record.status.as_str().to_owned()),
            }
        }
        None => Err("no answer".into()),
    }
}

/// `POST api/tasks/TASK_ID/cancel`.
pub(super) async fn cancel_one(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Response {
    let viewer = match actor(&state, &caller).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let record = match visible_record(&state, &viewer, &id).await {
        Ok(Some(r)) => r,
        Ok(None) => return error(StatusCode::NOT_FOUND, "no such task"),
        Err(r) => return r,
    };
    if record.status.is_terminal() {
        return error(
            StatusCode::CONFLICT,
            format!("the task is already {}", record.status.as_str()),
        );
    }
    match cancel(&state, &record).await {
        Ok(status) => {
            tracing::info!(principal = %viewer.principal(), task = %record.id,
                "console: cancellation requested");
            Json(json!({ "status": status })).into_response()
        }
        Err(why) => error(
            StatusCode::CONFLICT,
            format!("the task could not be cancelled: {why}"),
        ),
    }
}

/// `POST api/cancel?<filters>` `{"expected": N, "cursor": "…"}`: cancels up to [`BATCH`] live
/// tasks the filter matches, from the cursor on; answers how many, and where to go on.
pub(super) async fn cancel_matching(
    State(state): State<AppState>,
    caller: Caller,
    uri: Uri,
    body: Bytes,
) -> Response {
    let viewer = match actor(&state, &caller).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let q = match scoped_query(&viewer, &uri) {
        Ok(q) => q,
        Err(r) => return r,
    };
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut cursor = match body.get("cursor").and_then(Value::as_str) {
        Some(c) => match ListingCursor::from_token(c) {
            Some(c) => Some(c),
            None => return error(StatusCode::BAD_REQUEST, "cursor: malformed"),
        },
        None => None,
    };
    if q.filter.status.is_some_and(ListedStatus::is_terminal) {
        return Json(json!({ "cancelled": 0, "more": false, "cursor": null })).into_response();
    }
    let (mut cancelled, mut failed) = (0usize, 0usize);
    let mut looked = 0usize;
    loop {
        let page = match state
            .shared
            .store
            .listing(
                &q.filter,
                cursor.clone(),
                MAX_LISTING_PAGE,
                DEFAULT_LISTING_BUDGET,
            )
            .await
        {
            Ok(p) => p,
            Err(e) => return store_error(e),
        };
        looked += page.scanned as usize;
        for task in page
            .tasks
            .iter()
            .filter(|t| !t.listing.status.is_terminal())
        {
            let record = match visible_record(&state, &viewer, &task.id).await {
                Ok(Some(r)) if !r.status.is_terminal() => r,
                Ok(_) => continue,
                Err(r) => return r,
            };
            match cancel(&state, &record).await {
                Ok(_) => cancelled += 1,
                Err(why) => {
                    failed += 1;
                    tracing::debug!(task = %record.id, why, "console: a cancellation was refused");
                }
            }
        }
        cursor = page.next;
        if cursor.is_none() || cancelled + failed >= BATCH || looked >= 5 * DEFAULT_LISTING_BUDGET {
            break;
        }
    }
    tracing::info!(principal = %viewer.principal(), cancelled, refused = failed,
        filter = %describe(&q.filter), expected = ?body.get("expected"),
        "console: cancellation requested for the tasks a filter matches");
    Json(json!({
        "cancelled": cancelled,
        "refused": failed,
        "more": cursor.is_some(),
        "cursor": cursor.map(|c| c.token()),
    }))
    .into_response()
}

/// A filter as the log shows it.
fn describe(f: &ListingFilter) -> String {
    format!(
        "status={:?} tool={:?} owner={:?} from={:?} to={:?} q={:?}",
        f.status.map(ListedStatus::as_str),
        f.tool,
        f.owner,
        f.created_from,
        f.created_to,
        f.text
    )
}

/// `POST api/purge` `{"before": "2026-12-01"}`: deletes up to [`BATCH`] finished tasks last
/// updated before that time (on a store shared by replicas too: a finished task is never
/// written again, so no node's lease is involved).
pub(super) async fn purge(State(state): State<AppState>, caller: Caller, body: Bytes) -> Response {
    let viewer = match actor(&state, &caller).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let before = match body.get("before") {
        Some(Value::String(s)) => super::query::time_param("before", s),
        Some(Value::Number(n)) => n.as_u64().ok_or_else(|| "before: a time".to_owned()),
        _ => Err(
            "send {\"before\": \"2026-12-01\"}: finished tasks last updated before it are deleted"
                .to_owned(),
        ),
    };
    let before = match before {
        Ok(b) => b,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let mut doomed: Vec<String> = Vec::new();
    let mut more = false;
    let mut looked = 0usize;
    'statuses: for status in [
        ListedStatus::Completed,
        ListedStatus::Failed,
        ListedStatus::Cancelled,
    ] {
        // A task last updated before `before` was created before it too.
        let filter = ListingFilter {
            status: Some(status),
            created_to: Some(before),
            owner: viewer.scope(),
            ..Default::default()
        };
        let mut cursor = None;
        loop {
            let page = match state
                .shared
                .store
                .listing(&filter, cursor, MAX_LISTING_PAGE, DEFAULT_LISTING_BUDGET)
                .await
            {
                Ok(p) => p,
                Err(e) => return store_error(e),
            };
            for task in page.tasks.iter().filter(|t| t.listing.updated_ms < before) {
                if doomed.len() >= BATCH {
                    more = true;
                    break 'statuses;
                }
                doomed.push(task.id.clone());
            }
            looked += page.scanned as usize;
            cursor = page.next;
            if cursor.is_none() {
                break;
            }
            // Bounded work per request: past it, the next request goes on.
            if looked >= 5 * DEFAULT_LISTING_BUDGET {
                more = true;
                break 'statuses;
            }
        }
    }
    let mut purged = 0usize;
    for chunk in doomed.chunks(PURGE_COMMIT) {
        if let Err(e) = state.shared.delete(chunk.to_vec()).await {
            return store_error(e);
        }
        purged += chunk.len();
    }
    tracing::info!(principal = %viewer.principal(), purged, before, "console: purged finished tasks");
    Json(json!({ "purged": purged, "more": more })).into_response()
}
