//! `store backup`: a consistent copy of a store into a new file.

use std::path::Path;

use super::{AdminError, BackupReport, Location, socket};

/// `store backup`: a consistent copy of a redb store (one read transaction), verified by
/// opening it. Works while a server runs (it makes the copy, asked through its admin socket).
pub async fn backup(location: &Location, to: &Path) -> Result<BackupReport, AdminError> {
    if to.exists() {
        return Err(AdminError::Invalid(format!(
            "{} exists; a backup never overwrites a file",
            to.display()
        )));
    }
    match location.store_kind().backup(location.as_str(), to).await {
        Err(AdminError::InUse { .. }) => {
            let to = std::path::absolute(to)
                .map_err(|e| AdminError::Invalid(format!("{}: {e}", to.display())))?;
            socket::ask(location, socket::Request::Backup(to)).await
        }
        done => done,
    }
}
