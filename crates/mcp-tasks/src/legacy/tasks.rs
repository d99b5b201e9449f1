//! The `2025-11-25` experimental tasks over the durable runtime: `tasks/get`, `tasks/result`,
//! `tasks/list`, `tasks/cancel`, `notifications/tasks/status` and input requests of tasks.
//!
//! Every operation goes through the modern task methods (`tasks/get`, `tasks/cancel`,
//! `tasks/update`, `subscriptions/listen`), so ownership is checked exactly as for a
//! `2026-07-28` client, and a task is the same durable record whichever era created it.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use tokio::task::AbortHandle;

use super::{
    Call, Legacy, LegacyOutcome, Live, RELATED_TASK, STREAM_BUFFER, Session, TASK_REQUEST_PREFIX,
    error_response, legacy_result, one_or_stream, server_request,
};
use crate::protocol::TaskCursor;
use crate::task::Owner;
use crate::wire::error::RpcError;
use crate::wire::methods;

/// Tasks per `tasks/list` page.
const PAGE_SIZE: usize = 50;

/// A modern task object (`CreateTaskResult`, `DetailedTask`) as a 2025-11-25 `Task`:
/// `ttl`/`pollInterval` for `ttlMs`/`pollIntervalMs`, and `failed` for a completed tool call
/// whose result has `isError: true` (2025-11-25 counts those as failed).
pub(crate) fn legacy_task(modern: &Value) -> Value {
    let mut t = Map::new();
    for key in [
        "taskId",
        "status",
        "statusMessage",
        "createdAt",
        "lastUpdatedAt",
    ] {
        if let Some(v) = modern.get(key) {
            t.insert(key.into(), v.clone());
        }
    }
    if modern.get("status").and_then(Value::as_str) == Some("completed")
        && modern.pointer("/result/isError") == Some(&Value::Bool(true))
    {
        t.insert("status".into(), json!("failed"));
        // Why, as the 2025-11-25 spec asks of a failed task: the result's first text.
        let text = modern
            .pointer("/result/content")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|c| c.get("type").and_then(Value::as_str) == Some("text"))
            .and_then(|c| c.get("text"))
            .and_then(Value::as_str);
        if let Some(text) = text {
            t.insert("statusMessage".into(), json!(status_text(text)));
        }
    }
    t.insert(
        "ttl".into(),
        modern.get("ttlMs").cloned().unwrap_or(Value::Null),
    );
    if let Some(p) = modern.get("pollIntervalMs") {
        t.insert("pollInterval".into(), p.clone());
    }
    Value::Object(t)
}

/// The longest `statusMessage` taken from a result's text, in characters.
const MAX_STATUS_CHARS: usize = 1024;

/// `text`, cut to [`MAX_STATUS_CHARS`] characters (with `…` when cut).
fn status_text(text: &str) -> String {
    match text.char_indices().nth(MAX_STATUS_CHARS) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

fn is_terminal(status: Option<&str>) -> bool {
    matches!(status, Some("completed" | "failed" | "cancelled"))
}

fn task_id_param(params: &Map<String, Value>) -> Result<String, RpcError> {
    params
        .get("taskId")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| RpcError::invalid_params("`taskId` must be a string"))
}

/// What `tasks/result` returns for a terminal task: what the `tools/call` would have
/// returned (the tool's result, or its JSON-RPC error), tied to the task.
fn final_outcome(id: &Value, task: &Value) -> Value {
    let task_id = task.get("taskId").cloned().unwrap_or(Value::Null);
    match task.get("status").and_then(Value::as_str) {
        Some("completed") => {
            let mut result = legacy_result(task.get("result").cloned().unwrap_or(json!({})));
            if let Some(r) = result.as_object_mut() {
                let meta = r
                    .entry("_meta")
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Some(meta) = meta.as_object_mut() {
                    meta.insert(RELATED_TASK.into(), json!({ "taskId": task_id }));
                }
            }
            json!({ "jsonrpc": "2.0", "id": id, "result": result })
        }
        Some("failed") => {
            let mut error = task.get("error").cloned().unwrap_or_else(
                || json!({ "code": crate::wire::error::code::INTERNAL_ERROR, "message": "the task failed" }),
            );
            if let Some(e) = error.as_object_mut() {
                let data = e.entry("data").or_insert_with(|| json!({}));
                if let Some(d) = data.as_object_mut() {
                    d.entry(RELATED_TASK)
                        .or_insert(json!({ "taskId": task_id }));
                }
            }
            json!({ "jsonrpc": "2.0", "id": id, "error": error })
        }
        _ => {
            let error = RpcError::new(
                crate::wire::error::code::INTERNAL_ERROR,
                "Task was cancelled before it produced a result",
            )
            .with_data(json!({ RELATED_TASK: { "taskId": task_id }, "status": "cancelled" }));
            error_response(id, &error)
        }
    }
}

/// The `tasks/list` cursor: opaque to clients, checked on the way back.
fn encode_cursor(c: &TaskCursor) -> String {
    B64.encode(format!("{}:{}", c.created_at_ms, c.id))
}

fn decode_cursor(s: &str) -> Option<TaskCursor> {
    let bytes = B64.decode(s).ok()?;
    let text = String::from_utf8(bytes).ok()?;
    let (ms, id) = text.split_once(':')?;
    crate::task::TaskId::parse(id).ok()?;
    Some(TaskCursor {
        created_at_ms: ms.parse().ok()?,
        id: id.to_owned(),
    })
}

impl Call {
    /// `tasks/get`: the modern `tasks/get`, as a legacy `Task`.
    pub(super) async fn get_task(&self, params: &Map<String, Value>) -> Result<Value, RpcError> {
        let task = task_id_param(params)?;
        let modern = self.modern_get(&task).await?;
        if !is_terminal(modern.get("status").and_then(Value::as_str)) {
            // Follow it for this session (status notifications, input requests), also after
            // a restart that lost the watcher.
            self.legacy.watch(&self.session, &self.owner, &task);
        }
        Ok(legacy_task(&modern))
    }

    /// `tasks/list`: the caller's own unexpired tasks, oldest first, paginated.
    pub(super) async fn list_tasks(&self, params: &Map<String, Value>) -> Result<Value, RpcError> {
        let cursor = match params.get("cursor") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => {
                Some(decode_cursor(s).ok_or_else(|| RpcError::invalid_params("invalid cursor"))?)
            }
            Some(_) => return Err(RpcError::invalid_params("`cursor` must be a string")),
        };
        let dispatcher = self.legacy.handle.dispatcher();
        let (records, next) = dispatcher
            .owned_tasks(&self.owner, cursor.as_ref(), PAGE_SIZE)
            .await?;
        let server = &self.legacy.shared.config.server_info;
        let tasks: Vec<Value> = records
            .iter()
            .map(|r| legacy_task(&Value::Object(crate::task::json::detailed_task(r, server))))
            .collect();
        let mut result = json!({ "tasks": tasks });
        if let Some(next) = next {
            result["nextCursor"] = json!(encode_cursor(&next));
        }
        Ok(result)
    }

    /// `tasks/cancel`: refused for a terminal task (`-32602`); otherwise the modern
    /// `tasks/cancel`, then the task once it is terminal (a task waiting for input is
    /// cancelled at once; a working tool gets the runtime's cancel grace).
    pub(super) async fn cancel_task(&self, params: &Map<String, Value>) -> Result<Value, RpcError> {
        let task = task_id_param(params)?;
        let current = self.modern_get(&task).await?;
        if let Some(status) = current
            .get("status")
            .and_then(Value::as_str)
            .filter(|s| is_terminal(Some(s)))
        {
            return Err(RpcError::invalid_params(format!(
                "Cannot cancel task: it is already {status}"
            )));
        }
        let mut p = Map::new();
        p.insert("taskId".into(), json!(task));
        let request = self.modern(methods::TASKS_CANCEL, p, true);
        let outcome = self
            .legacy
            .handle
            .dispatch_json(request, &self.ctx(false))
            .await;
        super::into_result(super::final_response(outcome, None).await)?;
        let grace = self.legacy.shared.config.cancel_grace + Duration::from_secs(2);
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            let now = self.modern_get(&task).await?;
            if is_terminal(now.get("status").and_then(Value::as_str))
                || tokio::time::Instant::now() >= deadline
            {
                return Ok(legacy_task(&now));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `tasks/result`: blocks until the task is terminal, then answers what the call would
    /// have answered. Meanwhile the task's input requests go out on this response stream as
    /// server-to-client requests; their responses resume the task.
    pub(super) async fn task_result(self, params: Map<String, Value>) -> LegacyOutcome {
        let task = match task_id_param(&params) {
            Ok(t) => t,
            Err(e) => return LegacyOutcome::Reply(error_response(&self.id, &e)),
        };
        let current = match self.modern_get(&task).await {
            Ok(c) => c,
            Err(e) => return LegacyOutcome::Reply(error_response(&self.id, &e)),
        };
        if is_terminal(current.get("status").and_then(Value::as_str)) {
            return LegacyOutcome::Reply(final_outcome(&self.id, &current));
        }
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let id = self.id.clone();
        tokio::spawn(async move {
            let response = match self.follow_to_end(&task, &tx).await {
                Ok(response) => response,
                Err(e) => error_response(&id, &e),
            };
            let _ = tx.send(response).await;
        });
        one_or_stream(rx).await
    }

    async fn follow_to_end(
        &self,
        task: &str,
        out: &mpsc::Sender<Value>,
    ) -> Result<Value, RpcError> {
        let live = self.legacy.live(&self.session, &self.owner)?;
        let _guard = live.result_stream(task);
        let mut ended = live.ended.subscribe();
        let mut asked = std::collections::BTreeSet::new();
        // This request's place in the task's watcher: let go when it returns, also when its
        // client went away (the output closed).
        let start = self.legacy.start_watcher(task);
        let Some((_interest, mut latest)) =
            self.legacy.watchers.follow(&self.owner, task, None, start)
        else {
            return Err(RpcError::task_not_found());
        };
        loop {
            let current = latest.borrow_and_update().clone();
            if let Some(detail) = current {
                let status = detail.get("status").and_then(Value::as_str);
                if is_terminal(status) {
                    return Ok(final_outcome(&self.id, &detail));
                }
                if status == Some("input_required") {
                    // Every tasks/result stream asks each outstanding key once, even if the
                    // standing stream or an earlier stream asked it already (the client may
                    // have missed it, or the server restarted): the first answer wins, a
                    // later one for the same key is ignored by the task.
                    let requests =
                        self.legacy
                            .input_requests(&self.session.version, task, &detail, |key| {
                                live.mark_sent(task, key);
                                asked.insert(key.to_owned())
                            });
                    for message in requests {
                        if out.send(message).await.is_err() {
                            return Err(RpcError::internal("the client went away"));
                        }
                    }
                }
            }
            tokio::select! {
                changed = latest.changed() => {
                    if changed.is_err() {
                        // The watcher stopped without a terminal snapshot (the runtime is
                        // closing): the client asks again.
                        if let Some(detail) = latest.borrow().clone()
                            && is_terminal(detail.get("status").and_then(Value::as_str))
                        {
                            return Ok(final_outcome(&self.id, &detail));
                        }
                        return Err(RpcError::internal(
                            "the server is shutting down; call tasks/result again",
                        ));
                    }
                }
                _ = ended.wait_for(|e| *e) => {
                    return Err(RpcError::invalid_request("the session ended"));
                }
                _ = out.closed() => {
                    return Err(RpcError::internal("the client went away"));
                }
            }
        }
    }
}

/// The `DetailedTask` of a `notifications/tasks` message.
fn task_notification(message: &Value) -> Option<&Value> {
    (message.get("method").and_then(Value::as_str) == Some("notifications/tasks"))
        .then(|| message.get("params"))
        .flatten()
}

impl Legacy {
    /// Starts the watcher of `task` (see [`super::watch`]): the runtime's subscriber on the
    /// task, its snapshots handed to every follower until the task is terminal.
    pub(super) fn start_watcher(self: &Arc<Self>, task: &str) -> impl FnOnce(u64) -> AbortHandle {
        let legacy = self.clone();
        let task = task.to_owned();
        move |entry| tokio::spawn(legacy.feed(task, entry)).abort_handle()
    }

    async fn feed(self: Arc<Self>, task: String, entry: u64) {
        let feed = match super::watch::task_id(&task) {
            Some(id) => self.handle.dispatcher().follow_task(id).await,
            None => Err(RpcError::task_not_found()),
        };
        match feed {
            Ok(mut feed) => {
                while let Some(message) = feed.recv().await {
                    let Some(detail) = task_notification(&message) else {
                        continue;
                    };
                    let detail = Arc::new(detail.clone());
                    for live in self.watchers.publish(&task, entry, detail.clone()) {
                        self.deliver(&live, &task, &detail);
                    }
                    if is_terminal(detail.get("status").and_then(Value::as_str)) {
                        break;
                    }
                }
            }
            Err(e) => {
                tracing::info!(%task, error = %e, "cannot follow a legacy task (status notifications are optional)");
            }
        }
        for live in self.watchers.finish(&task, entry) {
            live.unfollow_task(&task);
        }
    }

    /// Tells a session that follows `task` about a new snapshot: `notifications/tasks/status`
    /// on its standing stream, and the task's input requests there when no `tasks/result`
    /// stream of the session carries them (each key once per session; a `tasks/result` stream
    /// asks again: see `follow_to_end`).
    fn deliver(&self, live: &Live, task: &str, detail: &Value) {
        live.standing.push(json!({
            "jsonrpc": "2.0", "method": "notifications/tasks/status", "params": legacy_task(detail)
        }));
        let status = detail.get("status").and_then(Value::as_str);
        if status == Some("input_required") && !live.has_result_stream(task) {
            for request in
                self.input_requests(&live.version, task, detail, |key| live.mark_sent(task, key))
            {
                live.standing.push(request);
            }
        }
    }

    /// The task's outstanding input requests as server-to-client requests for a session of
    /// `version`, those `send` picks.
    fn input_requests(
        &self,
        version: &str,
        task: &str,
        detail: &Value,
        mut send: impl FnMut(&str) -> bool,
    ) -> Vec<Value> {
        let Some(requests) = detail.get("inputRequests").and_then(Value::as_object) else {
            return Vec::new();
        };
        requests
            .iter()
            .filter(|(key, _)| send(key))
            .map(|(key, request)| {
                let id = format!("{TASK_REQUEST_PREFIX}{task}/{key}");
                server_request(&id, request, version, Some(task))
            })
            .collect()
    }

    /// Follows a task for a session: its snapshots go to the session's standing stream (see
    /// [`Legacy::deliver`]) from the task's one watcher in this process, until the task is
    /// terminal or the session ends or is forgotten. Nothing if the session already follows
    /// it. The caller has checked that the task is `owner`'s.
    pub(super) fn watch(self: &Arc<Self>, session: &Session, owner: &Owner, task: &str) {
        let live = match self.live(session, owner) {
            Ok(live) => live,
            Err(e) => {
                tracing::debug!(error = %e, "a legacy task is not followed for a session");
                return;
            }
        };
        let start = self.start_watcher(task);
        let joined = live.follow_task(task, || {
            self.watchers.follow(owner, task, Some(&live), start)
        });
        // The snapshot the watcher had before this session joined (later ones it delivers).
        let current = joined.and_then(|latest| latest.borrow().clone());
        if let Some(detail) = current {
            self.deliver(&live, task, &detail);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_take_the_legacy_field_names() {
        let modern = json!({
            "resultType": "complete", "taskId": "tsk_1", "status": "working",
            "createdAt": "a", "lastUpdatedAt": "b", "ttlMs": 60000, "pollIntervalMs": 500,
            "_meta": {}
        });
        assert_eq!(
            legacy_task(&modern),
            json!({ "taskId": "tsk_1", "status": "working", "createdAt": "a",
                    "lastUpdatedAt": "b", "ttl": 60000, "pollInterval": 500 })
        );
        let unlimited = json!({ "taskId": "t", "status": "working", "ttlMs": null });
        assert_eq!(legacy_task(&unlimited)["ttl"], Value::Null);
    }

    #[test]
    fn an_error_result_is_a_failed_task() {
        let modern = json!({ "taskId": "t", "status": "completed",
            "result": { "content": [], "isError": true } });
        assert_eq!(legacy_task(&modern)["status"], "failed");
        assert_eq!(legacy_task(&modern).get("statusMessage"), None);
        // Its first text content says why.
        let modern = json!({ "taskId": "t", "status": "completed", "statusMessage": "step 2",
            "result": { "content": [{ "type": "image", "data": "", "mimeType": "image/png" },
                                    { "type": "text", "text": "disk full" },
                                    { "type": "text", "text": "second" }], "isError": true } });
        assert_eq!(legacy_task(&modern)["statusMessage"], "disk full");
        let long = "é".repeat(5000);
        let modern = json!({ "taskId": "t", "status": "completed",
            "result": { "content": [{ "type": "text", "text": long }], "isError": true } });
        let shown = legacy_task(&modern)["statusMessage"]
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(shown.chars().count(), 1025);
        assert!(shown.ends_with('…'));
        let fine = json!({ "taskId": "t", "status": "completed",
            "result": { "content": [], "isError": false } });
        assert_eq!(legacy_task(&fine)["status"], "completed");
    }

    #[test]
    fn results_carry_the_related_task() {
        let task = json!({ "taskId": "tsk_9", "status": "completed",
            "result": { "resultType": "complete", "content": [{ "type": "text", "text": "x" }],
                        "_meta": { "io.modelcontextprotocol/serverInfo": {} } } });
        let r = final_outcome(&json!(4), &task);
        assert_eq!(r["id"], 4);
        assert_eq!(r["result"]["_meta"][RELATED_TASK]["taskId"], "tsk_9");
        assert!(r["result"].get("resultType").is_none());
        let failed = json!({ "taskId": "tsk_9", "status": "failed",
            "error": { "code": -32603, "message": "boom" } });
        let r = final_outcome(&json!(4), &failed);
        assert_eq!(r["error"]["code"], -32603);
        assert_eq!(r["error"]["data"][RELATED_TASK]["taskId"], "tsk_9");
    }

    #[test]
    fn cursors_round_trip_and_reject_garbage() {
        let c = TaskCursor {
            created_at_ms: 17,
            id: "tsk_0123456789abcdef0123456789abcdef".into(),
        };
        assert_eq!(decode_cursor(&encode_cursor(&c)), Some(c));
        for bad in [
            "",
            "!!",
            &B64.encode("17:nope"),
            &B64.encode("x:tsk_0123456789abcdef0123456789abcdef"),
        ] {
            assert_eq!(decode_cursor(bad), None, "{bad}");
        }
    }
}
