//! `store migrate`: copying a store into another.

use super::{AdminError, Location, MigrateReport, decode};

/// `store migrate`: copies every task (snapshot bytes verbatim, with its indexes) and every
/// meta entry from one store to another. Idempotent: a re-run rewrites the same bytes.
/// Refuses a redb file a server holds and a PostgreSQL database a replica heartbeats on (on
/// either side). Live tasks arrive unclaimed on PostgreSQL (the first replica to start takes
/// them over) and in the live index on redb (the next server resumes them).
pub async fn migrate(from: &Location, to: &Location) -> Result<MigrateReport, AdminError> {
    if from == to {
        return Err(AdminError::Invalid(
            "the source and the target are the same store".into(),
        ));
    }
    let dump = from.store_kind().dump(from.as_str()).await?;
    let mut report = MigrateReport {
        from: from.display(),
        to: to.display(),
        meta: dump.meta.len() as u64,
        ..MigrateReport::default()
    };
    let live = dump
        .rows
        .iter()
        .filter(|r| decode(r).is_ok_and(|t| !t.status.is_terminal()))
        .count();
    report.live = live as u64;
    let (written, unchanged) = to.store_kind().load(to.as_str(), dump).await?;
    report.tasks = written;
    report.unchanged = unchanged;
    Ok(report)
}
