//! `store compact`: giving a store's free space back.

use super::{AdminError, CompactReport, Location};

/// `store compact` (redb, offline: refuses while a server holds the file).
pub async fn compact(location: &Location) -> Result<CompactReport, AdminError> {
    location.store_kind().compact(location.as_str()).await
}
