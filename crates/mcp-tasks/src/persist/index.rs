//! How the store indexes a task record: the [`Indexer`](crate::store::Indexer) the runtime
//! hands to every store it opens, and the listing entry of a record.
//!
//! The store writes the owner and listing entries each put carries; it asks this indexer only
//! for records that come without them (converting a store written before those indexes, and
//! `store migrate`'s copies), so it never needs to know what a task is.

use crate::store::listing::{ListedStatus, Listing};
use crate::store::{Indexer, OwnerEntry, owner_key};
use crate::task::{TaskRecord, TaskStatus};

/// The [`Indexer`] of task records: their snapshots as [`super::decode`] reads them.
#[derive(Debug, Clone, Copy, Default)]
pub struct TaskIndexer;

impl Indexer for TaskIndexer {
    fn owner(&self, record: &[u8]) -> Option<OwnerEntry> {
        Some(owner_entry_of(&super::decode(record).ok()?))
    }

    fn listing(&self, record: &[u8]) -> Option<Listing> {
        Some(listing_of(&super::decode(record).ok()?))
    }
}

/// The [`TaskIndexer`] as the stores take it.
pub fn task_indexer() -> std::sync::Arc<dyn Indexer> {
    std::sync::Arc::new(TaskIndexer)
}

/// What the owner index keeps of `record`.
pub fn owner_entry_of(record: &TaskRecord) -> OwnerEntry {
    OwnerEntry {
        owner: owner_key(&record.owner.tenant, &record.owner.principal),
        created_ms: record.created_at_ms,
    }
}

/// What the listing index keeps of `record`.
pub fn listing_of(record: &TaskRecord) -> Listing {
    let status = match record.status {
        TaskStatus::Working => ListedStatus::Working,
        TaskStatus::InputRequired => ListedStatus::InputRequired,
        TaskStatus::Completed => ListedStatus::Completed,
        TaskStatus::Failed => ListedStatus::Failed,
        TaskStatus::Cancelled => ListedStatus::Cancelled,
    };
    Listing::new(
        record.tool.as_str(),
        status,
        record.status_message.as_deref(),
        record.last_updated_at_ms,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::{Owner, TaskId};

    #[test]
    fn a_snapshot_is_indexed_by_its_owner_creation_and_listing() {
        let record = TaskRecord::new(
            TaskId::parse("tsk_0123456789abcdef0123456789abcdef").unwrap(),
            Owner::new("acme", "alice"),
            "echo".into(),
            serde_json::json!({"x": 1}),
            serde_json::Value::Null,
            1234,
            Some(60_000),
            None,
            None,
        );
        let bytes = super::super::encode(&record).unwrap();
        assert_eq!(
            TaskIndexer.owner(&bytes),
            Some(OwnerEntry {
                owner: owner_key("acme", "alice"),
                created_ms: 1234,
            })
        );
        assert_eq!(TaskIndexer.listing(&bytes), Some(listing_of(&record)));
        assert!(TaskIndexer.reads_records());
        assert_eq!(TaskIndexer.owner(b"garbage"), None);
        assert_eq!(TaskIndexer.listing(b"garbage"), None);
    }
}
