//! The runtime's internal error as the actors and the dispatcher see it.

use crate::store::StoreError;
use crate::task::TransitionError;

/// Errors of the runtime's internals (actors, supervision) as seen by the dispatcher.
///
/// Every variant keeps its cause as [`std::error::Error::source`]; the message also names it,
/// so a log line with `{}` is complete on its own.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The task store failed (see [`StoreError`] for the kinds and whether a retry helps).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The task's state machine refused the event: the task is terminal, an input key is
    /// unknown or already answered, an answer does not fit its request, and so on.
    #[error(transparent)]
    Transition(#[from] TransitionError),
    /// A stored task record could not be decoded (or a new one encoded): the record is from
    /// an incompatible version or damaged.
    #[error("a stored snapshot could not be read or written: {0}")]
    Persist(#[from] crate::persist::PersistError),
    /// The actor of a live task could not be started by the actor system.
    #[error("the task actor is not reachable: task actor {task} did not start: {source}")]
    Actor {
        /// The task whose actor did not start.
        task: crate::task::TaskId,
        /// What the actor system reported.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}
