//! `subscriptions/listen`: the acknowledgement, then `notifications/tasks` for the caller's own
//! tasks, from a subscriber actor.

use std::collections::BTreeSet;

use futures::StreamExt;
use ractor::Actor;
use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, watch};

use super::{Dispatcher, MessageStream, RequestContext};
use crate::actor::{OUTPUT_CAPACITY, Subscriber, SubscriberArgs};
use crate::quota::ListenPermit;
use crate::task::TaskId;
use crate::wire::error::RpcError;
use crate::wire::jsonrpc::kind;
use crate::wire::keys;
use crate::wire::meta::RequestMeta;

/// Most task ids one listen request may name.
const MAX_TASK_IDS: usize = 1024;

/// The `notifications.taskIds` of a listen's `params`; `None` when absent.
fn requested_task_ids(
    params: Option<&Map<String, Value>>,
) -> Result<Option<Vec<String>>, RpcError> {
    let filter = match params.and_then(|p| p.get("notifications")) {
        Some(Value::Object(f)) => f,
        Some(other) => {
            return Err(RpcError::invalid_params(format!(
                "`notifications` must be an object, not {}",
                kind(other)
            )));
        }
        None => return Err(RpcError::invalid_params("`notifications` is required")),
    };
    match filter.get("taskIds") {
        None => Ok(None),
        Some(Value::Array(ids)) if ids.len() <= MAX_TASK_IDS => {
            let mut out = Vec::with_capacity(ids.len());
            for v in ids {
                let s = v.as_str().ok_or_else(|| {
                    RpcError::invalid_params("`notifications.taskIds` must hold strings")
                })?;
                out.push(s.to_owned());
            }
            Ok(Some(out))
        }
        Some(Value::Array(_)) => Err(RpcError::invalid_params(format!(
            "`notifications.taskIds` names more than {MAX_TASK_IDS} tasks"
        ))),
        Some(other) => Err(RpcError::invalid_params(format!(
            "`notifications.taskIds` must be an array, not {}",
            kind(other)
        ))),
    }
}

impl Dispatcher {
    /// `subscriptions/listen`: the acknowledgement (naming the agreed tasks), then the
    /// notifications of a subscriber actor, until the request ends or the runtime closes.
    pub(super) async fn listen(
        &self,
        id: &Value,
        params: Option<&Map<String, Value>>,
        meta: &RequestMeta,
        ctx: &RequestContext,
    ) -> Result<MessageStream, RpcError> {
        let requested = requested_task_ids(params)?;
        if requested.is_some() && !meta.declares_tasks() {
            return Err(RpcError::tasks_extension_required());
        }
        let agreed = self
            .agreed_tasks(requested.iter().flatten(), &ctx.owner)
            .await?;

        // Quotas on what this owner's listens hold, before anything is started.
        let permit = self.shared.quotas.admit_listen(&ctx.owner, agreed.len())?;

        let mut notifications = Map::new();
        if requested.is_some() {
            let ids: Vec<Value> = agreed.iter().map(|t| json!(t.as_str())).collect();
            notifications.insert("taskIds".into(), Value::Array(ids));
        }
        let ack = json!({
            "jsonrpc": "2.0",
            "method": "notifications/subscriptions/acknowledged",
            "params": { "_meta": { keys::SUBSCRIPTION_ID: id }, "notifications": notifications }
        });
        let (out, rx) = mpsc::channel(OUTPUT_CAPACITY);
        // A fresh channel always has room: the acknowledgement is the first message.
        let _ = out.try_send(ack);
        if !agreed.is_empty() {
            let args = SubscriberArgs {
                subscription_id: id.clone(),
                tasks: agreed,
                out: out.clone(),
            };
            let subscriber = Subscriber {
                shared: self.shared.clone(),
            };
            Actor::spawn_linked(None, subscriber, args, self.supervisor.get_cell())
                .await
                .map_err(|e| RpcError::internal(format!("the subscriber did not start: {e}")))?;
        }
        let done = json!({
            "jsonrpc": "2.0",
            "id": id,
            "result": { "resultType": "complete", "_meta": { keys::SUBSCRIPTION_ID: id } }
        });
        Ok(stream(rx, out, self.shared.closing.clone(), done, permit))
    }

    /// Of the `requested` task ids, the caller's own, known, unexpired tasks (each once):
    /// the others are left out of the acknowledgement exactly like unknown ids.
    async fn agreed_tasks(
        &self,
        requested: impl Iterator<Item = &String>,
        owner: &crate::task::Owner,
    ) -> Result<Vec<TaskId>, RpcError> {
        let now = self.shared.now_ms();
        let mut agreed = Vec::new();
        let mut seen = BTreeSet::new();
        for raw in requested {
            let Ok(task) = TaskId::parse(raw) else {
                continue;
            };
            if !seen.insert(task.clone()) {
                continue;
            }
            if let Some(record) = self.shared.load_for(&task, owner).await?
                && record.owner.same_as(owner)
                && !record.is_expired(now)
            {
                agreed.push(task);
            }
        }
        Ok(agreed)
    }
}

impl Dispatcher {
    /// Follows one task's committed snapshots with a subscriber actor, as a listen does, for
    /// an adapter inside this process that checked the caller's ownership itself and counts
    /// what it follows against its own limits: `notifications/tasks` messages (the first is
    /// the current snapshot) until the task is terminal, the runtime closes, or the receiver
    /// is dropped (which stops the subscriber).
    pub(crate) async fn follow_task(
        &self,
        task: TaskId,
    ) -> Result<mpsc::Receiver<Value>, RpcError> {
        let (out, rx) = mpsc::channel(OUTPUT_CAPACITY);
        let args = SubscriberArgs {
            subscription_id: Value::Null,
            tasks: vec![task],
            out,
        };
        let subscriber = Subscriber {
            shared: self.shared.clone(),
        };
        Actor::spawn_linked(None, subscriber, args, self.supervisor.get_cell())
            .await
            .map_err(|e| RpcError::internal(format!("the subscriber did not start: {e}")))?;
        Ok(rx)
    }
}

/// The listen stream: messages from the channel until the reader goes away; when the runtime
/// closes, the listen result and the end.
fn stream(
    rx: mpsc::Receiver<Value>,
    keep_open: mpsc::Sender<Value>,
    closing: watch::Receiver<bool>,
    done: Value,
    permit: ListenPermit,
) -> MessageStream {
    struct State {
        rx: mpsc::Receiver<Value>,
        _keep_open: mpsc::Sender<Value>,
        /// Released when the stream is dropped.
        _permit: ListenPermit,
        closing: watch::Receiver<bool>,
        done: Option<Value>,
        acknowledged: bool,
    }
    let state = State {
        rx,
        _keep_open: keep_open,
        _permit: permit,
        closing,
        acknowledged: false,
        done: Some(done),
    };
    let s = futures::stream::unfold(state, |mut st| async move {
        let done = st.done.take()?;
        let next = if st.acknowledged {
            tokio::select! {
                biased;
                _ = st.closing.wait_for(|c| *c) => None,
                msg = st.rx.recv() => msg,
            }
        } else {
            // The acknowledgement is always first, even when the runtime is closing.
            st.rx.recv().await
        };
        match next {
            Some(msg) => {
                st.acknowledged = true;
                st.done = Some(done);
                Some((msg, st))
            }
            None => Some((done, st)),
        }
    });
    MessageStream::new(s.boxed())
}
