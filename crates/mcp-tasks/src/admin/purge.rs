//! `store purge`: removing the tasks a filter selects.

#[cfg(not(feature = "postgres"))]
use super::no_postgres;
#[cfg(feature = "postgres")]
use super::pg;
use super::{
    AdminError, Filter, Location, PurgeReport, Reader, SCAN_BATCH, TaskSummary, WhenHeld, decode,
    held, now_ms, redb, socket,
};

/// `store purge`: removes the selected tasks (or only lists them with `dry_run`). Refuses
/// while a server holds a redb file or a replica heartbeats on PostgreSQL.
pub async fn purge(
    location: &Location,
    filter: &Filter,
    dry_run: bool,
) -> Result<PurgeReport, AdminError> {
    let now = now_ms();
    let selected = match location {
        Location::Redb(path) => {
            let reader = match redb::RedbReader::open(path).await {
                Ok(r) => r,
                Err(AdminError::InUse { .. }) if dry_run => {
                    return socket::ask(location, socket::Request::PurgeDryRun(filter.clone()))
                        .await;
                }
                Err(AdminError::InUse { .. }) => {
                    return Err(held(location, WhenHeld::Refuse("store purge")));
                }
                Err(e) => return Err(e),
            };
            select(&(Box::new(reader) as Reader), filter, now).await?
        }
        Location::Postgres(url) => {
            select(&pg_purge_reader(url, dry_run).await?, filter, now).await?
        }
    };
    let report = PurgeReport {
        tasks: selected,
        dry_run,
    };
    if dry_run || report.tasks.is_empty() {
        return Ok(report);
    }
    let ids: Vec<String> = report.tasks.iter().map(|t| t.id.clone()).collect();
    match location {
        Location::Redb(path) => redb::delete(path, ids).await?,
        Location::Postgres(url) => pg_delete(url, ids).await?,
    }
    Ok(report)
}

/// The reader `store purge` selects with; refuses while a node heartbeats unless `dry_run`.
#[cfg(feature = "postgres")]
async fn pg_purge_reader(url: &str, dry_run: bool) -> Result<Reader, AdminError> {
    let pg = pg::PgReader::connect(url).await?;
    if !dry_run {
        pg.refuse_if_nodes_alive("store purge").await?;
    }
    Ok(Box::new(pg))
}

#[cfg(not(feature = "postgres"))]
async fn pg_purge_reader(_url: &str, _dry_run: bool) -> Result<Reader, AdminError> {
    Err(no_postgres())
}

#[cfg(feature = "postgres")]
async fn pg_delete(url: &str, ids: Vec<String>) -> Result<(), AdminError> {
    pg::PgReader::connect(url).await?.delete(ids).await
}

#[cfg(not(feature = "postgres"))]
async fn pg_delete(_url: &str, _ids: Vec<String>) -> Result<(), AdminError> {
    Err(no_postgres())
}

/// Every task `filter` selects (its `limit` caps them; `after` starts the scan).
pub(crate) async fn select(
    reader: &Reader,
    filter: &Filter,
    now_ms: u64,
) -> Result<Vec<TaskSummary>, AdminError> {
    let mut out = Vec::new();
    let mut after = filter.after.clone();
    loop {
        let rows = reader.scan(after.clone(), SCAN_BATCH).await?;
        let Some(last) = rows.last() else { break };
        after = Some(last.id.clone());
        for row in &rows {
            if let Ok(record) = decode(row)
                && filter.matches(&record, now_ms)
            {
                out.push(TaskSummary::of(&record));
                if filter.limit.is_some_and(|l| out.len() >= l) {
                    return Ok(out);
                }
            }
        }
    }
    Ok(out)
}
