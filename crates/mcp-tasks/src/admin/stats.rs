//! `store stats` and `store stats --by-owner`: counts from the records, facts from the backend, usage from its counters.

use super::{
    AdminError, Inspector, Location, OldestLive, OwnerUsage, OwnerUsageReport, SCAN_BATCH,
    StatsReport, decode, now_ms, open_reader, socket,
};
use crate::persist;

/// `store stats`.
pub async fn stats(location: &Location) -> Result<StatsReport, AdminError> {
    match open_reader(location).await? {
        Some(reader) => stats_of(&*reader, now_ms()).await,
        None => socket::ask(location, socket::Request::Stats).await,
    }
}

pub(crate) async fn stats_of(
    reader: &dyn Inspector,
    now_ms: u64,
) -> Result<StatsReport, AdminError> {
    let mut report = reader.facts(now_ms).await?;
    let mut after = None;
    loop {
        let rows = reader.scan(after.clone(), SCAN_BATCH).await?;
        let Some(last) = rows.last() else { break };
        after = Some(last.id.clone());
        for row in &rows {
            report.tasks += 1;
            report.snapshot_bytes += row.bytes.len() as u64;
            match persist::snapshot_version(&row.bytes) {
                Ok(v) => *report.snapshot_versions.entry(v.to_string()).or_default() += 1,
                Err(_) => {
                    *report
                        .snapshot_versions
                        .entry("unknown".into())
                        .or_default() += 1
                }
            }
            let Ok(record) = decode(row) else {
                report.undecodable += 1;
                continue;
            };
            *report
                .by_status
                .entry(record.status.as_str().to_owned())
                .or_default() += 1;
            *report.by_tool.entry(record.tool.clone()).or_default() += 1;
            let due = row.due_ms.is_some_and(|d| d <= now_ms);
            if record.status.is_terminal() {
                report.due_for_deletion += u64::from(due);
            } else {
                report.live += 1;
                report.due_for_expiry += u64::from(record.is_expired(now_ms));
                let older = report
                    .oldest_live
                    .as_ref()
                    .is_none_or(|o| record.created_at_ms < o.created_at_ms);
                if older {
                    report.oldest_live = Some(OldestLive {
                        id: row.id.clone(),
                        created_at_ms: record.created_at_ms,
                        status: record.status.as_str().to_owned(),
                    });
                }
            }
        }
    }
    Ok(report)
}

/// `store stats --by-owner`.
pub async fn usage_by_owner(location: &Location) -> Result<OwnerUsageReport, AdminError> {
    match open_reader(location).await? {
        Some(reader) => usage_of(&*reader).await,
        None => socket::ask(location, socket::Request::UsageByOwner).await,
    }
}

pub(crate) async fn usage_of(reader: &dyn Inspector) -> Result<OwnerUsageReport, AdminError> {
    let facts = reader.facts(now_ms()).await?;
    let usage = reader.usage_by_owner().await?;
    let Some(usage) = usage else {
        return Err(AdminError::Invalid(format!(
            "{} has schema version {}, which keeps no usage per owner; it is converted when a server (or a writing store command) next opens it",
            facts.location, facts.schema_version
        )));
    };
    let mut owners: Vec<OwnerUsage> = usage
        .into_iter()
        .map(|(key, usage)| {
            let (tenant, principal) =
                crate::store::parse_owner_key(&key).unwrap_or((key.as_str(), ""));
            OwnerUsage {
                tenant: tenant.to_owned(),
                principal: principal.to_owned(),
                tasks: usage.tasks,
                bytes: usage.bytes,
            }
        })
        .collect();
    owners.sort_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then_with(|| (&a.tenant, &a.principal).cmp(&(&b.tenant, &b.principal)))
    });
    Ok(OwnerUsageReport {
        backend: facts.backend,
        location: facts.location,
        via_server: facts.via_server,
        owners,
    })
}
