//! `store list`: a page of summaries, filtered.

use super::{
    AdminError, DEFAULT_LIST_LIMIT, Filter, Inspector, ListPage, Location, MAX_LIST_LIMIT,
    SCAN_BATCH, TaskSummary, decode, now_ms, open_reader, socket,
};

/// `store list`.
pub async fn list(location: &Location, filter: &Filter) -> Result<ListPage, AdminError> {
    match open_reader(location).await? {
        Some(reader) => list_of(&*reader, filter, now_ms()).await,
        None => socket::ask(location, socket::Request::List(filter.clone())).await,
    }
}

pub(crate) async fn list_of(
    reader: &dyn Inspector,
    filter: &Filter,
    now_ms: u64,
) -> Result<ListPage, AdminError> {
    let limit = filter
        .limit
        .unwrap_or(DEFAULT_LIST_LIMIT)
        .clamp(1, MAX_LIST_LIMIT);
    let mut page = ListPage::default();
    let mut after = filter.after.clone();
    loop {
        let rows = reader.scan(after.clone(), SCAN_BATCH).await?;
        let Some(last) = rows.last() else {
            return Ok(page);
        };
        after = Some(last.id.clone());
        for row in rows {
            match decode(&row) {
                Ok(record) if filter.matches(&record, now_ms) => {
                    page.tasks.push(TaskSummary::of(&record));
                    if page.tasks.len() == limit {
                        page.next = Some(row.id);
                        return Ok(page);
                    }
                }
                Ok(_) => {}
                Err(_) => page.undecodable.push(row.id),
            }
        }
    }
}
