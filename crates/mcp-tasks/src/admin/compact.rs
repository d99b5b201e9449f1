//! `store compact`: giving a redb file's free pages back.

use super::{AdminError, CompactReport, Location, redb};

/// `store compact` (redb, offline).
pub async fn compact(location: &Location) -> Result<CompactReport, AdminError> {
    let Location::Redb(path) = location else {
        return Err(AdminError::Unsupported(
            "store compact applies to redb files; PostgreSQL reclaims space with VACUUM".into(),
        ));
    };
    redb::compact(path).await
}
