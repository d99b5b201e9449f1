//! The console's JSON API (`/api/overview`, `/api/tasks`, `/api/tasks/count`,
//! `/api/tasks/TASK_ID`): the same data `mcp-tasks store` shows, read from the listing index
//! and the records, scoped to the viewer.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::guard::Caller;
use super::query::{self, ListQuery};
use super::viewer::{self, Viewer, error};
use super::{AppState, ConsoleState};
use crate::store::listing::{
    DEFAULT_LISTING_BUDGET, ListedStatus, ListedTask, ListingFilter, ListingPage, ThroughputKind,
    minute_of,
};
use crate::store::parse_owner_key;
use crate::task::{TaskId, TaskOutcome, TaskRecord};

/// Minutes the overview's chart shows.
const CHART_MINUTES: u64 = 60;
/// The most tasks `api/tasks/count` counts before it says "at least".
const COUNT_LIMIT: usize = 10_000;

/// An owner key as the API shows it.
pub(super) fn owner_json(key: &str) -> Value {
    match parse_owner_key(key) {
        Some((tenant, principal)) => json!({ "tenant": tenant, "principal": principal }),
        None => json!({ "tenant": "", "principal": key }),
    }
}

/// One row of a list (and of a live `task` event); `is_error` when it completed with a
/// result of `isError: true`.
pub(super) fn row(task: &ListedTask, is_error: bool) -> Value {
    json!({
        "id": task.id,
        "tool": task.listing.tool,
        "status": task.listing.status.as_str(),
        "isError": is_error,
        "owner": owner_json(&task.owner),
        "createdAt": task.created_ms,
        "lastUpdatedAt": task.listing.updated_ms,
        "statusMessage": task.listing.message,
    })
}

/// The ids of the completed tasks of `page` whose result has `isError: true`. The listing
/// index does not keep it: the page's completed records are read, in one batch (at most a
/// page of them).
pub(super) async fn tool_errors(
    store: &crate::store::Store,
    page: &ListingPage,
) -> Result<std::collections::BTreeSet<String>, crate::store::StoreError> {
    let completed: Vec<String> = page
        .tasks
        .iter()
        .filter(|t| t.listing.status == ListedStatus::Completed)
        .map(|t| t.id.clone())
        .collect();
    if completed.is_empty() {
        return Ok(Default::default());
    }
    let records = store.get_many(completed).await?;
    Ok(records
        .into_iter()
        .flatten()
        .filter_map(|bytes| crate::persist::decode(&bytes).ok())
        .filter(crate::shared::tool_error)
        .map(|r| r.id.as_str().to_owned())
        .collect())
}

/// A store error as the API answers it (the detail goes to the log: it may name a file).
pub(super) fn store_error(e: impl std::fmt::Display) -> Response {
    tracing::warn!(error = %e, "console: the store could not answer");
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "the task store could not answer; see the server's log",
    )
}

/// The viewer's list request: the query string's filter, restricted to the viewer's own
/// tasks unless it is an admin (asking for another owner's is refused).
pub(super) fn scoped_query(viewer: &Viewer, uri: &Uri) -> Result<ListQuery, Response> {
    let mut q = query::list_query(&query::params(uri.query()))
        .map_err(|e| error(StatusCode::BAD_REQUEST, e))?;
    if let Some(own) = viewer.scope() {
        if q.filter.owner.as_ref().is_some_and(|o| *o != own) {
            return Err(error(
                StatusCode::FORBIDDEN,
                "a principal sees only its own tasks (the `admin` scope sees every tenant)",
            ));
        }
        q.filter.owner = Some(own);
    }
    Ok(q)
}

/// `GET api/overview`.
pub(super) async fn overview(State(state): State<AppState>, caller: Caller) -> Response {
    let viewer = match viewer::viewer(&state, &caller).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    match overview_json(&state, &viewer).await {
        Ok(v) => Json(v).into_response(),
        Err(r) => r,
    }
}

async fn overview_json(state: &ConsoleState, viewer: &Viewer) -> Result<Value, Response> {
    let store = &state.shared.store;
    let now = state.shared.now_ms();
    let scope = viewer.scope();
    let counts = store.listing_counts().await.map_err(store_error)?;
    let mut statuses: BTreeMap<&'static str, u64> =
        ListedStatus::ALL.iter().map(|s| (s.as_str(), 0)).collect();
    let mut tools: BTreeMap<String, BTreeMap<&'static str, u64>> = BTreeMap::new();
    let (mut tasks, mut live) = (0u64, 0u64);
    for c in counts
        .iter()
        .filter(|c| scope.as_ref().is_none_or(|s| *s == c.owner))
    {
        *statuses.entry(c.status.as_str()).or_default() += c.tasks;
        let per_tool = tools
            .entry(c.tool.clone())
            .or_insert_with(|| ListedStatus::ALL.iter().map(|s| (s.as_str(), 0)).collect());
        *per_tool.entry(c.status.as_str()).or_default() += c.tasks;
        tasks += c.tasks;
        if !c.status.is_terminal() {
            live += c.tasks;
        }
    }
    let tools: Vec<Value> = tools
        .into_iter()
        .map(|(tool, counts)| {
            let mut row = json!({ "tool": tool });
            for (status, n) in counts {
                row[status] = json!(n);
            }
            row
        })
        .collect();
    let admin = viewer.admin();
    let throughput = if admin {
        let first = minute_of(now).saturating_sub((CHART_MINUTES - 1) * 60_000);
        let buckets = store.throughput(first).await.map_err(store_error)?;
        let minutes: Vec<Value> = (0..CHART_MINUTES)
            .map(|i| {
                let minute = first + i * 60_000;
                let mut entry = json!({ "minute": minute });
                for kind in ThroughputKind::ALL {
                    let n: u64 = buckets
                        .iter()
                        .filter(|b| b.minute_ms == minute && b.kind == kind)
                        .map(|b| b.count)
                        .sum();
                    entry[kind.as_str()] = json!(n);
                }
                entry
            })
            .collect();
        Value::from(minutes)
    } else {
        Value::Null
    };
    let nodes = match (admin, store.cluster()) {
        (true, Some(cluster)) => {
            let me = cluster.node_id().to_owned();
            let nodes = cluster.nodes().await.map_err(store_error)?;
            Value::from(
                nodes
                    .into_iter()
                    .map(|n| {
                        json!({
                            "node": n.node,
                            "heartbeatAt": n.heartbeat_ms,
                            "leases": n.leases,
                            "self": n.node == me,
                        })
                    })
                    .collect::<Vec<_>>(),
            )
        }
        _ => Value::Null,
    };
    let bytes = if admin {
        store.stored_bytes().await.map_err(store_error)?
    } else {
        None
    };
    let recovery = state.shared.recovery.get().map(
        |r| json!({ "startedAt": r.started_ms, "tookMs": r.took_ms, "rehydrated": r.rehydrated }),
    );
    Ok(json!({
        "now": now,
        "viewer": viewer.json(),
        "actions": state.settings.actions && admin && viewer.may_write(),
        "csrf": viewer.csrf(state),
        "statuses": statuses,
        "tools": tools,
        "throughput": throughput,
        "store": {
            "kind": store_kind(store),
            "location": if admin { Value::from(store.describe()) } else { Value::Null },
            "bytes": bytes,
            "tasks": tasks,
            "live": live,
        },
        "liveActors": if admin { Value::from(state.shared.live.len()) } else { Value::Null },
        "parkedTasks": if admin { Value::from(state.shared.live.parked()) } else { Value::Null },
        "recovery": recovery,
        "nodes": nodes,
        "flow": if admin { flow_json(&state.shared) } else { Value::Null },
    }))
}

/// Flow control's use: `null` when no limit is configured.
fn flow_json(shared: &crate::shared::Shared) -> Value {
    if !shared.flow.active() {
        return Value::Null;
    }
    let usage = shared.flow.usage();
    let tools: Vec<Value> = usage
        .tools
        .iter()
        .map(|(tool, u)| json!({ "tool": tool, "limit": u.limit, "maxStartsPerSecond": u.max_starts, "running": u.running, "queued": u.queued }))
        .collect();
    let groups: Vec<Value> = usage
        .groups
        .iter()
        .map(|(group, u)| json!({ "group": group, "limit": u.limit, "running": u.running }))
        .collect();
    let owners: Vec<Value> = usage
        .owners
        .iter()
        .map(|o| json!({ "owner": o.owner, "running": o.running, "queued": o.queued }))
        .collect();
    json!({
        "tools": tools,
        "groups": groups,
        "allTools": { "limit": usage.all_tools_limit, "running": usage.running, "queued": usage.queued },
        "perOwner": { "limit": usage.per_owner_limit, "ownersQueued": usage.owners_queued },
        "owners": owners,
    })
}

/// The backend's name: a store shared by replicas is PostgreSQL's (the only one), the
/// in-memory one says so in its description, anything else is a redb file.
fn store_kind(store: &crate::store::Store) -> &'static str {
    if store.is_shared() {
        "postgres"
    } else if store.describe() == "memory" {
        "memory"
    } else {
        "redb"
    }
}

/// `GET api/tasks?…`: one page of the list.
pub(super) async fn tasks(State(state): State<AppState>, caller: Caller, uri: Uri) -> Response {
    let viewer = match viewer::viewer(&state, &caller).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let q = match scoped_query(&viewer, &uri) {
        Ok(q) => q,
        Err(r) => return r,
    };
    let page = match state
        .shared
        .store
        .listing(&q.filter, q.cursor, q.limit, DEFAULT_LISTING_BUDGET)
        .await
    {
        Ok(p) => p,
        Err(e) => return store_error(e),
    };
    let errors = match tool_errors(&state.shared.store, &page).await {
        Ok(e) => e,
        Err(e) => return store_error(e),
    };
    Json(page_json(&page, &errors)).into_response()
}

/// A page as `api/tasks` answers it (`errors`: the ids of its tasks that completed with a
/// tool error).
pub(super) fn page_json(page: &ListingPage, errors: &std::collections::BTreeSet<String>) -> Value {
    json!({
        "tasks": page.tasks.iter().map(|t| row(t, errors.contains(&t.id))).collect::<Vec<_>>(),
        "next": page.next.as_ref().map(|c| c.token()),
        "scanned": page.scanned,
        "complete": !page.budget_spent,
    })
}

/// Counts the tasks `filter` matches, at most `limit`: `(count, exact)`.
pub(super) async fn count_matching(
    state: &ConsoleState,
    filter: &ListingFilter,
    limit: usize,
) -> Result<(u64, bool), Response> {
    let mut count = 0u64;
    let mut cursor = None;
    let mut looked = 0usize;
    loop {
        let page = state
            .shared
            .store
            .listing(
                filter,
                cursor,
                crate::store::listing::MAX_LISTING_PAGE,
                DEFAULT_LISTING_BUDGET,
            )
            .await
            .map_err(store_error)?;
        count += page.tasks.len() as u64;
        looked += page.scanned as usize;
        match page.next {
            None => return Ok((count, true)),
            Some(next) if (count as usize) < limit && looked < 10 * DEFAULT_LISTING_BUDGET => {
                cursor = Some(next)
            }
            Some(_) => return Ok((count, false)),
        }
    }
}

/// `GET api/tasks/count?…`.
pub(super) async fn count(State(state): State<AppState>, caller: Caller, uri: Uri) -> Response {
    let viewer = match viewer::viewer(&state, &caller).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let q = match scoped_query(&viewer, &uri) {
        Ok(q) => q,
        Err(r) => return r,
    };
    match count_matching(&state, &q.filter, COUNT_LIMIT).await {
        Ok((count, exact)) => Json(json!({ "count": count, "exact": exact })).into_response(),
        Err(r) => r,
    }
}

/// The record of task `id` if the viewer may see it.
pub(super) async fn visible_record(
    state: &ConsoleState,
    viewer: &Viewer,
    id: &str,
) -> Result<Option<std::sync::Arc<TaskRecord>>, Response> {
    let Ok(id) = TaskId::parse(id) else {
        return Ok(None);
    };
    // A principal's view reads as the protocol does (`Shared::load_for`: another owner's
    // record is not decoded, and answers like an unknown id); an admin's reads any task.
    let record = match viewer.identity.as_ref().filter(|_| !viewer.admin()) {
        Some(identity) => state.shared.load_for(&id, &identity.owner).await,
        None => state.shared.load(&id).await,
    }
    .map_err(store_error)?;
    Ok(record.filter(|r| viewer.may_see(&r.owner)))
}

/// `GET api/tasks/TASK_ID`.
pub(super) async fn task(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Response {
    let viewer = match viewer::viewer(&state, &caller).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let record = match visible_record(&state, &viewer, &id).await {
        Ok(Some(r)) => r,
        Ok(None) => return error(StatusCode::NOT_FOUND, "no such task"),
        Err(r) => return r,
    };
    let lease = match state.shared.store.cluster() {
        Some(cluster) => match cluster.lease_of(record.id.as_str()).await {
            Ok(lease) => {
                lease.map(|l| json!({ "node": l.node, "epoch": l.epoch, "takeovers": l.takeovers }))
            }
            Err(e) => return store_error(e),
        },
        None => None,
    };
    Json(detail_json(&record, lease)).into_response()
}

/// A task as its page shows it.
pub(super) fn detail_json(r: &TaskRecord, lease: Option<Value>) -> Value {
    let (result, error) = match &r.outcome {
        Some(TaskOutcome::Result(v)) => (v.clone(), Value::Null),
        Some(TaskOutcome::Error(e)) => (
            Value::Null,
            json!({ "code": e.code, "message": e.message, "data": e.data }),
        ),
        None => (Value::Null, Value::Null),
    };
    let steps: Vec<Value> = r
        .journal
        .iter()
        .map(|(name, value)| {
            json!({ "name": name, "attempt": r.step_attempts.get(name), "value": value })
        })
        .collect();
    json!({
        "id": r.id.as_str(),
        "tool": r.tool,
        "upstream": upstream_of(r),
        "status": r.status.as_str(),
        "isError": crate::shared::tool_error(r),
        "statusMessage": r.status_message,
        "owner": { "tenant": r.owner.tenant, "principal": r.owner.principal },
        "createdAt": r.created_at_ms,
        "lastUpdatedAt": r.last_updated_at_ms,
        "ttlMs": r.ttl_ms,
        "expiresAt": r.expires_at_ms(),
        "pollIntervalMs": r.poll_interval_ms,
        "attempts": r.attempts,
        "cancelRequested": r.cancel_requested,
        "timeline": timeline(r),
        "arguments": r.arguments,
        "result": result,
        "error": error,
        "steps": steps,
        "inputRequests": r.pending_inputs,
        "answeredKeys": r.answers.keys().collect::<Vec<_>>(),
        "lease": lease,
    })
}

/// The upstream a gateway tool's task was sent to, as its `gateway.call` step recorded it.
fn upstream_of(r: &TaskRecord) -> Option<&str> {
    #[cfg(feature = "gateway")]
    {
        r.journal
            .get(crate::gateway::CALL_STEP)?
            .get("upstream")?
            .as_str()
    }
    #[cfg(not(feature = "gateway"))]
    {
        let _ = r;
        None
    }
}

/// The task's status changes, oldest first (the record keeps the first and the latest ones:
/// `TaskRecord::history`).
fn timeline(r: &TaskRecord) -> Value {
    r.history
        .iter()
        .map(|t| json!({ "at": t.at_ms, "status": t.status.as_str(), "statusMessage": t.message }))
        .collect::<Vec<_>>()
        .into()
}
