//! `store backup`: a consistent copy of a redb file.

use std::path::Path;

use super::{AdminError, BackupReport, Location, redb, socket};

/// `store backup`: a consistent copy of a redb store (one read transaction), verified by
/// opening it. Works while a server runs (it makes the copy).
pub async fn backup(location: &Location, to: &Path) -> Result<BackupReport, AdminError> {
    let Location::Redb(path) = location else {
        return Err(AdminError::Unsupported(
            "store backup copies a redb file; back up PostgreSQL with pg_dump (or `store migrate` it to a redb file)".into(),
        ));
    };
    if to.exists() {
        return Err(AdminError::Invalid(format!(
            "{} exists; a backup never overwrites a file",
            to.display()
        )));
    }
    match redb::RedbReader::open(path).await {
        Ok(reader) => reader.backup(to).await,
        Err(AdminError::InUse { .. }) => {
            let to = std::path::absolute(to)
                .map_err(|e| AdminError::Invalid(format!("{}: {e}", to.display())))?;
            socket::ask(location, socket::Request::Backup(to)).await
        }
        Err(e) => Err(e),
    }
}
