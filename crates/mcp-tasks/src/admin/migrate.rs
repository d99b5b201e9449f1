//! `store migrate`: copying a store into another.

#[cfg(not(feature = "postgres"))]
use super::no_postgres;
#[cfg(feature = "postgres")]
use super::pg;
use super::{AdminError, Dump, Location, MigrateReport, decode, redb};

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
    let dump = match from {
        Location::Redb(path) => redb::dump(path).await?,
        Location::Postgres(url) => pg_dump(url).await?,
    };
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
    let (written, unchanged) = match to {
        Location::Redb(path) => redb::load(path, dump).await?,
        Location::Postgres(url) => pg_load(url, dump).await?,
    };
    report.tasks = written;
    report.unchanged = unchanged;
    Ok(report)
}

#[cfg(feature = "postgres")]
async fn pg_dump(url: &str) -> Result<Dump, AdminError> {
    let reader = pg::PgReader::connect(url).await?;
    reader.refuse_if_nodes_alive("store migrate").await?;
    reader.dump().await
}

#[cfg(feature = "postgres")]
async fn pg_load(url: &str, dump: Dump) -> Result<(u64, u64), AdminError> {
    pg::load(url, dump).await
}

#[cfg(not(feature = "postgres"))]
async fn pg_dump(_url: &str) -> Result<Dump, AdminError> {
    Err(no_postgres())
}

#[cfg(not(feature = "postgres"))]
async fn pg_load(_url: &str, _dump: Dump) -> Result<(u64, u64), AdminError> {
    Err(no_postgres())
}
