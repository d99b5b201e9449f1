//! Tools hosted by the runtime (being written).

/// Why a tool call did not produce a result.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    /// The tool ends with a JSON-RPC error: the task becomes `failed`.
    #[error(transparent)]
    Rpc(crate::error::RpcError),
    /// The tool asked for input but runs without a task (the client did not declare the
    /// Tasks extension).
    #[error("this tool needs client input, which requires the Tasks extension")]
    InputRequiresTask,
    /// The task was cancelled while the tool waited or worked.
    #[error("the task was cancelled")]
    Cancelled,
}
