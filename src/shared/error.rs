//! The runtime's internal error as the actors and the dispatcher see it.

use crate::store::StoreError;
use crate::task::TransitionError;

/// Errors of the runtime's internals (actors, supervision) as seen by the dispatcher.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Transition(#[from] TransitionError),
    #[error("a stored snapshot could not be read or written: {0}")]
    Persist(#[from] crate::persist::PersistError),
    #[error("the task actor is not reachable: {0}")]
    Actor(String),
}

