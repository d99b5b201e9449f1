//! `store purge`: removing the tasks a filter selects.

use super::{
    AdminError, Filter, Inspector, Location, PurgeReport, SCAN_BATCH, TaskSummary, decode, now_ms,
    open_reader, socket,
};

/// `store purge`: removes the selected tasks (or only lists them with `dry_run`). Refuses
/// while a server holds a redb file or a replica heartbeats on PostgreSQL.
pub async fn purge(
    location: &Location,
    filter: &Filter,
    dry_run: bool,
) -> Result<PurgeReport, AdminError> {
    let now = now_ms();
    let kind = location.store_kind();
    let reader = if dry_run {
        match open_reader(location).await? {
            Some(reader) => reader,
            None => {
                return socket::ask(location, socket::Request::PurgeDryRun(filter.clone())).await;
            }
        }
    } else {
        kind.open_exclusive(location.as_str(), "store purge")
            .await?
    };
    let report = PurgeReport {
        tasks: select(&*reader, filter, now).await?,
        dry_run,
    };
    drop(reader);
    if dry_run || report.tasks.is_empty() {
        return Ok(report);
    }
    let ids: Vec<String> = report.tasks.iter().map(|t| t.id.clone()).collect();
    kind.delete(location.as_str(), ids).await?;
    Ok(report)
}

/// Every task `filter` selects (its `limit` caps them; `after` starts the scan).
pub(crate) async fn select(
    reader: &dyn Inspector,
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
