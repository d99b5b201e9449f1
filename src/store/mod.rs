//! The redb store (being written).

/// Errors of the store boundary.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("the store is closed")]
    Closed,
}
