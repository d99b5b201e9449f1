//! The listing index of the PostgreSQL store (`store::listing`): one statement per page.
//!
//! A page walks one index newest first (`ORDER BY created_ms DESC, id DESC`) from the
//! cursor, at most `budget` rows (`LIMIT`), and numbers the rows of the walk. The filter is
//! judged in SQL: kept, not kept, or maybe — a text search over a non-ASCII id or message,
//! whose case folding is Rust's to judge (`ListingFilter::matches`); over ASCII,
//! `lower(… COLLATE "C")` folds as Rust does. A window run condition stops the walk after the
//! `limit`-th kept row, so a page of an unfiltered walk reads `limit` rows, not `budget`.
//! The statement returns the candidates (kept or maybe) and the walk's last row;
//! [`page_of`] checks the candidates with `ListingFilter::matches` and applies the rules of
//! `listing::fill_page` by position (its tests compare the two).

use crate::listing::{
    ListedStatus, ListedTask, Listing, ListingCursor, ListingFilter, ListingIndex, ListingPage,
    MAX_LISTING_PAGE,
};

/// One statement of a walk: `$1` created from, `($2, $3)` the (created_ms, id) the walk
/// starts below, `$4` the budget, `$5` the limit, `$6`–`$9` the filter (status, tool, owner,
/// text; NULL: any), `$10` the value of the walked index (none for every task's).
macro_rules! walk_sql {
    ($index:literal) => {
        concat!(
            "SELECT n, judged >= 0, id, task_owner, created_ms, tool, status, status_message,
                    updated_ms
             FROM (
                SELECT x.*, lead(n) OVER (ORDER BY created_ms DESC, id DESC) IS NULL AS last
                FROM (
                    SELECT w.*, row_number() OVER win AS n,
                           count(*) FILTER (WHERE judged = 1) OVER win AS before
                    FROM (
                        SELECT id, task_owner, created_ms, tool, status, status_message,
                               updated_ms,
                               -- 1: kept; 0: maybe (Rust judges the text); -1: not kept.
                               CASE
                                   WHEN NOT (($6::int2 IS NULL OR status = $6)
                                             AND ($7::text IS NULL OR tool = $7)
                                             AND ($8::text IS NULL OR task_owner = $8)) THEN -1
                                   WHEN $9::text IS NULL THEN 1
                                   WHEN octet_length(id) <> char_length(id)
                                        OR octet_length(status_message)
                                           <> char_length(status_message) THEN 0
                                   WHEN strpos(lower(id COLLATE \"C\"), $9) > 0
                                        OR strpos(lower(status_message COLLATE \"C\"), $9) > 0
                                       THEN 1
                                   ELSE -1
                               END AS judged
                        FROM mcp_tasks
                        WHERE ",
            $index,
            " AND task_owner IS NOT NULL AND status IS NOT NULL
                          AND created_ms >= $1 AND (created_ms, id) < ($2, $3)
                        ORDER BY created_ms DESC, id DESC
                        LIMIT $4
                    ) AS w
                    WINDOW win AS (ORDER BY created_ms DESC, id DESC
                                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                ) AS x
                WHERE before < $5
             ) AS y
             WHERE judged >= 0 OR last
             ORDER BY n"
        )
    };
}

/// The walk of every listed task (index `mcp_tasks_listed`).
pub(super) const WALK_CREATED: &str = walk_sql!("TRUE");
/// The walk of one owner's tasks (index `mcp_tasks_by_owner`).
pub(super) const WALK_OWNER: &str = walk_sql!("task_owner = $10");
/// The walk of one tool's tasks (index `mcp_tasks_by_tool`).
pub(super) const WALK_TOOL: &str = walk_sql!("tool = $10");
/// The walk of one status's tasks (index `mcp_tasks_by_status`).
pub(super) const WALK_STATUS: &str = walk_sql!("status = $10::int2");

/// A page's walk as its statement takes it.
pub(super) struct Walk<'a> {
    /// The statement of the index.
    pub(super) sql: &'static str,
    /// Created at or after (ms).
    pub(super) from: i64,
    /// The walk starts below this (created_ms, id).
    pub(super) below: (i64, String),
    /// The most rows the walk reads.
    pub(super) budget: i64,
    /// The most tasks the page holds.
    pub(super) limit: i64,
    /// The filter's status code.
    pub(super) status: Option<i16>,
    /// The index's value (`None`: every task's).
    pub(super) index_text: Option<&'a str>,
    pub(super) index_status: Option<i16>,
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The walk of a page of `filter` below `after`, or `None` when its bounds hold nothing.
pub(super) fn walk<'a>(
    filter: &'a ListingFilter,
    after: Option<&ListingCursor>,
    limit: usize,
    budget: usize,
) -> Option<Walk<'a>> {
    let (from, to) = filter.walk_bounds(after);
    if from >= to {
        return None;
    }
    // Below the cursor, or below (to, '') — every id sorts after the empty one — when the
    // bound of the creation range is lower (`walk_bounds` with `before_cursor`).
    let below = match after {
        Some(c) if c.created_ms < to => (to_i64(c.created_ms), c.id.clone()),
        _ => (to_i64(to), String::new()),
    };
    let limit = limit.clamp(1, MAX_LISTING_PAGE);
    let budget = budget.max(limit);
    let (sql, index_text, index_status) = match filter.index() {
        ListingIndex::Created => (WALK_CREATED, None, None),
        ListingIndex::Owner(owner) => (WALK_OWNER, Some(owner), None),
        ListingIndex::Tool(tool) => (WALK_TOOL, Some(tool), None),
        ListingIndex::Status(status) => (WALK_STATUS, None, Some(i16::from(status.code()))),
    };
    Some(Walk {
        sql,
        from: to_i64(from),
        below,
        budget: i64::try_from(budget).unwrap_or(i64::MAX),
        limit: i64::try_from(limit).unwrap_or(i64::MAX),
        status: filter.status.map(|s| i16::from(s.code())),
        index_text,
        index_status,
    })
}

/// One row a walk's statement returns: a candidate, or the walk's last row.
#[derive(Debug, Clone)]
pub(super) struct WalkedRow {
    /// Its place in the walk (1 is the first row below the cursor).
    pub(super) n: u64,
    /// Whether the filter may keep it (else it is only the walk's last row).
    pub(super) cand: bool,
    /// Its place in the listing order.
    pub(super) cursor: ListingCursor,
    /// The task; `None` for a status code no build wrote.
    pub(super) task: Option<ListedTask>,
}

/// The row of a walk's statement.
pub(super) fn walked_row(row: &tokio_postgres::Row) -> WalkedRow {
    let n: i64 = row.get(0);
    let id: String = row.get(2);
    let created_ms = u64::try_from(row.get::<_, i64>(4)).unwrap_or(0);
    let status: i16 = row.get(6);
    let task = u8::try_from(status)
        .ok()
        .and_then(ListedStatus::from_code)
        .map(|status| ListedTask {
            id: id.clone(),
            owner: row.get(3),
            created_ms,
            listing: Listing {
                tool: row.get::<_, Option<String>>(5).unwrap_or_default(),
                status,
                message: row.get(7),
                updated_ms: u64::try_from(row.get::<_, Option<i64>>(8).unwrap_or(0)).unwrap_or(0),
            },
        });
    WalkedRow {
        n: u64::try_from(n).unwrap_or(0),
        cand: row.get(1),
        cursor: ListingCursor { created_ms, id },
        task,
    }
}

/// The page of a walk's rows (in walk order), by the rules of `listing::fill_page`: the
/// candidates `filter` keeps, up to `limit`; the cursor at the last one kept when the page
/// is full, else at the walk's last row when the walk read its whole budget, else none.
pub(super) fn page_of(
    rows: impl IntoIterator<Item = WalkedRow>,
    filter: &ListingFilter,
    limit: usize,
    budget: usize,
) -> ListingPage {
    let limit = limit.clamp(1, MAX_LISTING_PAGE);
    let budget = budget.max(limit) as u64;
    let mut page = ListingPage::default();
    let mut last = None;
    for row in rows {
        if row.cand
            && let Some(task) = row.task
            && filter.matches(&task)
        {
            page.tasks.push(task);
            if page.tasks.len() >= limit {
                page.scanned = row.n;
                page.next = Some(row.cursor);
                return page;
            }
        }
        last = Some((row.n, row.cursor));
    }
    if let Some((n, cursor)) = last {
        page.scanned = n;
        if n >= budget {
            page.next = Some(cursor);
            page.budget_spent = true;
        }
    }
    page
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::listing::fill_page;
    use proptest::prelude::*;

    fn task(i: u64, status: u8, tool: u8, message: Option<&str>) -> ListedTask {
        ListedTask {
            id: format!("tsk_{i:04}"),
            owner: format!("0:{}", i % 3),
            created_ms: i / 2,
            listing: Listing::new(
                format!("tool{tool}"),
                ListedStatus::from_code(status).unwrap(),
                message,
                i,
            ),
        }
    }

    /// What the statement returns for `walk` (already below the cursor, at most `budget`
    /// rows): every row numbered, judged kept (`sure`) by `filter` unless `unsure` says the SQL
    /// could not tell (then a candidate: maybe), the walk stopped after the `limit`-th kept
    /// row; candidates and the last row kept.
    fn statement(
        walk: &[ListedTask],
        unsure: &[bool],
        filter: &ListingFilter,
        limit: usize,
        budget: usize,
    ) -> Vec<WalkedRow> {
        let limit = limit.clamp(1, MAX_LISTING_PAGE);
        let budget = budget.max(limit);
        let mut produced = Vec::new();
        let mut sure_before = 0;
        for (i, t) in walk.iter().take(budget).enumerate() {
            if sure_before >= limit {
                break;
            }
            let matches = filter.matches(t);
            let sure = matches && !unsure[i];
            // An unsure row is a candidate whatever it holds.
            let cand = matches || unsure[i];
            produced.push((i as u64 + 1, cand, t.clone()));
            if sure {
                sure_before += 1;
            }
        }
        let count = produced.len();
        produced
            .into_iter()
            .enumerate()
            .filter(|(k, (_, cand, _))| *cand || k + 1 == count)
            .map(|(_, (n, cand, t))| WalkedRow {
                n,
                cand,
                cursor: t.cursor(),
                task: Some(t),
            })
            .collect()
    }

    proptest! {
        #[test]
        fn pages_follow_fill_page(
            rows in prop::collection::vec((0u8..5, 0u8..3, any::<bool>(), any::<bool>()), 0..60),
            status in prop::option::of(0u8..5),
            tool in prop::option::of(0u8..3),
            text in any::<bool>(),
            limit in 0usize..8,
            budget in 0usize..70,
        ) {
            let walk: Vec<ListedTask> = rows
                .iter()
                .enumerate()
                .rev()
                .map(|(i, (s, t, m, _))| task(i as u64, *s, *t, m.then_some("Disk FULL")))
                .collect();
            let unsure: Vec<bool> = rows.iter().rev().map(|r| r.3).collect();
            let mut filter = ListingFilter {
                status: status.and_then(ListedStatus::from_code),
                tool: tool.map(|t| format!("tool{t}")),
                ..Default::default()
            };
            if text {
                filter = filter.with_text("disk");
            }
            let expected =
                fill_page(walk.iter().cloned().map(Ok::<_, ()>), &filter, limit, budget).unwrap();
            let got = page_of(statement(&walk, &unsure, &filter, limit, budget), &filter, limit, budget);
            prop_assert_eq!(got, expected);
        }
    }

    #[test]
    fn the_walk_starts_below_the_cursor_or_the_creation_bound() {
        let filter = ListingFilter {
            created_from: Some(5),
            created_to: Some(100),
            ..Default::default()
        };
        let w = walk(&filter, None, 10, 5).unwrap();
        assert_eq!(
            (w.from, w.below.clone(), w.limit, w.budget),
            (5, (100, String::new()), 10, 10)
        );
        let cursor = ListingCursor {
            created_ms: 50,
            id: "tsk_b".into(),
        };
        assert_eq!(
            walk(&filter, Some(&cursor), 10, 50).unwrap().below,
            (50, "tsk_b".to_owned())
        );
        let later = ListingCursor {
            created_ms: 500,
            id: "tsk_b".into(),
        };
        assert_eq!(
            walk(&filter, Some(&later), 10, 50).unwrap().below,
            (100, String::new())
        );
        let earlier = ListingCursor {
            created_ms: 4,
            id: "tsk_b".into(),
        };
        assert!(walk(&filter, Some(&earlier), 10, 50).is_none());
        assert_eq!(
            walk(&ListingFilter::default(), None, 0, 0).unwrap().below,
            (i64::MAX, String::new())
        );
    }
}
