//! The one place where internal errors become JSON-RPC errors.
//!
//! Each boundary has its own typed error ([`crate::store::StoreError`],
//! [`crate::task::TransitionError`], [`crate::tool::ToolError`], [`RuntimeError`],
//! [`crate::quota::QuotaError`]). The dispatcher turns every failure into an [`RpcError`]
//! through the `From` impls in this file and nowhere else.

use serde_json::json;

use crate::shared::RuntimeError;
use crate::store::StoreError;
use crate::task::TransitionError;
use crate::wire::error::{RpcError, code};

impl From<crate::quota::QuotaError> for RpcError {
    fn from(e: crate::quota::QuotaError) -> Self {
        tracing::info!(
            quota = e.kind.name(),
            limit = e.limit,
            "request refused by a quota"
        );
        crate::telemetry::refused_by_quota(e.kind.name());
        Self::new(code::QUOTA_EXCEEDED, format!("Quota exceeded: {e}")).with_data(json!({
            "quota": e.kind.name(),
            "limit": e.limit,
            "retryAfterSeconds": e.retry_after_secs(),
        }))
    }
}

impl From<StoreError> for RpcError {
    /// The log gets the whole error (with the store's path); the client gets what happened
    /// without internal paths.
    fn from(e: StoreError) -> Self {
        tracing::error!(error = %e, "store error while serving a request");
        let detail = match &e {
            StoreError::Closed => "the task store is closed".to_owned(),
            StoreError::Halted { .. } => "the task store stopped after a failed fsync and accepts \
                no more writes; the server must be restarted"
                .to_owned(),
            StoreError::Unavailable { .. } => {
                "the task store is unavailable (an I/O error, or the database cannot be reached); retry later"
                    .to_owned()
            }
            StoreError::Fenced { .. } => "the task was taken over by another replica while \
                this one handled the request; nothing was written, retry the request"
                .to_owned(),
            StoreError::Busy { .. } => "the task is locked by another replica's open \
                transaction (a write or a lease renewal in progress, or a replica paused while \
                writing it); nothing was changed, retry in a few seconds"
                .to_owned(),
            StoreError::Conflict { .. } => {
                "the task changed concurrently; nothing was written, retry the request".to_owned()
            }
            // Commit and read details never name the file (the writer logs the path).
            StoreError::Commit(_) | StoreError::Read(_) => e.to_string(),
            _ => "the task store cannot be opened".to_owned(),
        };
        Self::internal(format!("the task store failed: {detail}"))
    }
}

impl From<TransitionError> for RpcError {
    fn from(e: TransitionError) -> Self {
        match e {
            TransitionError::InvalidInputResponse { .. } => Self::invalid_params(e),
            other => Self::internal(other),
        }
    }
}

impl From<crate::tool::ToolError> for RpcError {
    fn from(e: crate::tool::ToolError) -> Self {
        use crate::tool::ToolError;
        match e {
            ToolError::Rpc(err) => err,
            ToolError::InputRequired(_) => Self::internal("input was requested outside a call"),
            ToolError::Cancelled => Self::internal("the call was cancelled"),
            other => Self::internal(other),
        }
    }
}

impl From<RuntimeError> for RpcError {
    fn from(e: RuntimeError) -> Self {
        match e {
            RuntimeError::Store(s) => s.into(),
            RuntimeError::Transition(t) => t.into(),
            other => Self::internal(other),
        }
    }
}
