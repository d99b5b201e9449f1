//! The listing index: what the operator console lists and counts stored tasks by, without
//! decoding their snapshots.
//!
//! The runtime sends a [`Listing`] with every [`WriteOp::Put`](super::WriteOp::Put) of a
//! task (its tool, status, status message and last update); each backend keeps, in the
//! transaction that writes the record:
//!
//! - one entry per task in (creation time, id) order holding its owner and listing, and
//!   secondary entries by status and by tool in (value, creation time, id) order — the owner
//!   index of [`Index::owned`](super::Index::owned) serves the owner filter;
//! - counters of tasks per (owner, tool, status) ([`ListingCount`]), exact after a crash;
//! - one-minute buckets of creations and of completions, failures and cancellations
//!   ([`ThroughputBucket`]), kept for [`THROUGHPUT_RETENTION_MS`].
//!
//! A page ([`Index::listing`](super::Index::listing)) walks one index newest first —
//! the owner's, the tool's or the status's when the filter names one, else every task's —
//! checks the rest of the filter on each entry and stops when the page is full or after a
//! *budget* of entries: the work of one request is bounded whatever the filter, and a page
//! cut short by the budget says where to go on ([`ListingPage::next`]).

use serde::{Deserialize, Serialize};

/// A task's status as the listing index keeps it (the store names no task type): the five
/// statuses of the Tasks extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ListedStatus {
    /// `working`.
    Working,
    /// `input_required`.
    InputRequired,
    /// `completed`.
    Completed,
    /// `failed`.
    Failed,
    /// `cancelled`.
    Cancelled,
}

impl ListedStatus {
    /// Every status, in the order the console shows them.
    pub const ALL: [ListedStatus; 5] = [
        ListedStatus::Working,
        ListedStatus::InputRequired,
        ListedStatus::Completed,
        ListedStatus::Failed,
        ListedStatus::Cancelled,
    ];

    /// The wire spelling (`input_required`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            ListedStatus::Working => "working",
            ListedStatus::InputRequired => "input_required",
            ListedStatus::Completed => "completed",
            ListedStatus::Failed => "failed",
            ListedStatus::Cancelled => "cancelled",
        }
    }

    /// The status of a wire spelling.
    pub fn parse(s: &str) -> Option<ListedStatus> {
        ListedStatus::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// The one-byte code the stores key their indexes by (frozen: it is persisted).
    pub fn code(self) -> u8 {
        match self {
            ListedStatus::Working => 0,
            ListedStatus::InputRequired => 1,
            ListedStatus::Completed => 2,
            ListedStatus::Failed => 3,
            ListedStatus::Cancelled => 4,
        }
    }

    /// The status of a code; `None` for a code no build wrote.
    pub fn from_code(code: u8) -> Option<ListedStatus> {
        ListedStatus::ALL.into_iter().find(|st| st.code() == code)
    }

    /// `completed`, `failed` and `cancelled`.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            ListedStatus::Completed | ListedStatus::Failed | ListedStatus::Cancelled
        )
    }
}

/// The longest status message the listing keeps, in bytes (cut at a character boundary):
/// what a list row shows and text search reads; the record holds the whole message.
pub const MAX_LISTED_MESSAGE: usize = 240;

/// What a [`WriteOp::Put`](super::WriteOp::Put) tells the listing index about its task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listing {
    /// The tool the task runs.
    pub tool: String,
    /// Its status.
    pub status: ListedStatus,
    /// Its status message, at most [`MAX_LISTED_MESSAGE`] bytes ([`Listing::new`] cuts it).
    pub message: Option<String>,
    /// When it last changed (ms since the epoch): the minute a terminal status is counted in.
    pub updated_ms: u64,
}

impl Listing {
    /// A listing, the message cut to [`MAX_LISTED_MESSAGE`] bytes.
    pub fn new(
        tool: impl Into<String>,
        status: ListedStatus,
        message: Option<&str>,
        updated_ms: u64,
    ) -> Listing {
        Listing {
            tool: tool.into(),
            status,
            message: message.map(|m| cut(m, MAX_LISTED_MESSAGE).to_owned()),
            updated_ms,
        }
    }
}

/// `s` cut to at most `max` bytes at a character boundary.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// One task as the listing index holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedTask {
    /// The task id.
    pub id: String,
    /// Its owner ([`owner_key`](super::owner_key)).
    pub owner: String,
    /// When it was created (ms since the epoch).
    pub created_ms: u64,
    /// Its tool, status, message and last update.
    pub listing: Listing,
}

impl ListedTask {
    /// Its place in the listing order.
    pub fn cursor(&self) -> ListingCursor {
        ListingCursor {
            created_ms: self.created_ms,
            id: self.id.clone(),
        }
    }
}

/// What a page of [`Index::listing`](super::Index::listing) keeps: every condition
/// must hold (all `None`: every task).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListingFilter {
    /// This status only.
    pub status: Option<ListedStatus>,
    /// This tool only (exact name).
    pub tool: Option<String>,
    /// This owner only ([`owner_key`](super::owner_key)).
    pub owner: Option<String>,
    /// Created at or after (ms since the epoch).
    pub created_from: Option<u64>,
    /// Created before (ms since the epoch).
    pub created_to: Option<u64>,
    /// A case-insensitive substring of the id or of the status message. Kept lowercased:
    /// build it with [`ListingFilter::with_text`].
    pub text: Option<String>,
}

/// The index a page walks: chosen by [`ListingFilter::index`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListingIndex<'a> {
    /// Every task, by creation time.
    Created,
    /// One owner's tasks (the owner index).
    Owner(&'a str),
    /// One tool's tasks.
    Tool(&'a str),
    /// The tasks in one status.
    Status(ListedStatus),
}

impl ListingFilter {
    /// `self` searching for `text` (lowercased; an empty text searches nothing).
    pub fn with_text(mut self, text: &str) -> ListingFilter {
        let text = text.trim();
        self.text = (!text.is_empty()).then(|| text.to_lowercase());
        self
    }

    /// The index a page walks: the owner's, else the tool's, else the status's (in this order:
    /// an owner usually holds fewer tasks than a tool has, and a status is the coarsest), else
    /// every task's. The rest of the filter is checked on each entry.
    pub fn index(&self) -> ListingIndex<'_> {
        if let Some(owner) = &self.owner {
            ListingIndex::Owner(owner)
        } else if let Some(tool) = &self.tool {
            ListingIndex::Tool(tool)
        } else if let Some(status) = self.status {
            ListingIndex::Status(status)
        } else {
            ListingIndex::Created
        }
    }

    /// Whether `task` passes every condition.
    pub fn matches(&self, task: &ListedTask) -> bool {
        self.status.is_none_or(|s| task.listing.status == s)
            && self.tool.as_deref().is_none_or(|t| task.listing.tool == t)
            && self.owner.as_deref().is_none_or(|o| task.owner == o)
            && self.created_from.is_none_or(|f| task.created_ms >= f)
            && self.created_to.is_none_or(|t| task.created_ms < t)
            && self.text.as_deref().is_none_or(|text| {
                task.id.to_lowercase().contains(text)
                    || task
                        .listing
                        .message
                        .as_deref()
                        .is_some_and(|m| m.to_lowercase().contains(text))
            })
    }

    /// The creation-time bounds of a walk that starts below `before`: `[from, to)` in ms,
    /// `to` being the cursor's time + 1 when there is a cursor (entries of that millisecond
    /// after the cursor's id are skipped by [`before_cursor`]).
    pub(crate) fn walk_bounds(&self, before: Option<&ListingCursor>) -> (u64, u64) {
        let from = self.created_from.unwrap_or(0);
        let mut to = self.created_to.unwrap_or(u64::MAX);
        if let Some(c) = before {
            to = to.min(c.created_ms.saturating_add(1));
        }
        (from, to)
    }
}

/// Whether an entry at (`created_ms`, `id`) comes after `cursor` in the newest-first order
/// (strictly older, or as old with a smaller id).
pub(crate) fn before_cursor(created_ms: u64, id: &str, cursor: Option<&ListingCursor>) -> bool {
    cursor.is_none_or(|c| (created_ms, id) < (c.created_ms, c.id.as_str()))
}

/// A place in the listing order (newest first): a page starts after it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ListingCursor {
    /// The creation time of the last entry looked at.
    pub created_ms: u64,
    /// Its id.
    pub id: String,
}

impl ListingCursor {
    /// The cursor as an opaque token for a URL (`<created_ms>.<id>`).
    pub fn token(&self) -> String {
        format!("{}.{}", self.created_ms, self.id)
    }

    /// The cursor of a [`ListingCursor::token`]; `None` when malformed.
    pub fn from_token(token: &str) -> Option<ListingCursor> {
        let (ms, id) = token.split_once('.')?;
        let created_ms = ms.parse().ok()?;
        if id.is_empty() || id.len() > 256 {
            return None;
        }
        Some(ListingCursor {
            created_ms,
            id: id.to_owned(),
        })
    }
}

/// One page of [`Index::listing`](super::Index::listing).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListingPage {
    /// The matching tasks, newest first.
    pub tasks: Vec<ListedTask>,
    /// How many index entries the page looked at.
    pub scanned: u64,
    /// Where the next page starts; `None` when the walk reached the end of its index.
    pub next: Option<ListingCursor>,
    /// Whether the page stopped because of its budget rather than because it was full or the
    /// index ended (it may then be short, even empty, with more to find after `next`).
    pub budget_spent: bool,
}

/// How many index entries a page looks at by default before it stops
/// ([`ListingPage::budget_spent`]).
pub const DEFAULT_LISTING_BUDGET: usize = 20_000;

/// The most tasks one page holds.
pub const MAX_LISTING_PAGE: usize = 500;

/// Fills a page from `entries`, the walk of the chosen index in newest-first order already
/// past the cursor and within the creation-time bounds: keeps the entries `filter` matches
/// until `limit` of them or `budget` entries looked at. Every backend pages through this, so
/// the paging rules are one.
pub(crate) fn fill_page<E>(
    entries: impl Iterator<Item = Result<ListedTask, E>>,
    filter: &ListingFilter,
    limit: usize,
    budget: usize,
) -> Result<ListingPage, E> {
    let limit = limit.clamp(1, MAX_LISTING_PAGE);
    let budget = budget.max(limit);
    let mut page = ListingPage::default();
    for entry in entries {
        let task = entry?;
        page.scanned += 1;
        let last = task.cursor();
        if filter.matches(&task) {
            page.tasks.push(task);
            if page.tasks.len() >= limit {
                page.next = Some(last);
                return Ok(page);
            }
        }
        if page.scanned as usize >= budget {
            page.next = Some(last);
            page.budget_spent = true;
            return Ok(page);
        }
    }
    Ok(page)
}

/// The tasks of one owner with one tool in one status:
/// [`Index::listing_counts`](super::Index::listing_counts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListingCount {
    /// The owner ([`owner_key`](super::owner_key)).
    pub owner: String,
    /// The tool.
    pub tool: String,
    /// The status.
    pub status: ListedStatus,
    /// How many stored tasks.
    pub tasks: u64,
}

/// What a throughput bucket counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ThroughputKind {
    /// Tasks created.
    Created,
    /// Tasks that reached `completed`.
    Completed,
    /// Tasks that reached `failed`.
    Failed,
    /// Tasks that reached `cancelled`.
    Cancelled,
}

impl ThroughputKind {
    /// Every kind.
    pub const ALL: [ThroughputKind; 4] = [
        ThroughputKind::Created,
        ThroughputKind::Completed,
        ThroughputKind::Failed,
        ThroughputKind::Cancelled,
    ];

    /// The one-byte code the stores key buckets by (frozen: it is persisted).
    pub fn code(self) -> u8 {
        match self {
            ThroughputKind::Created => 0,
            ThroughputKind::Completed => 1,
            ThroughputKind::Failed => 2,
            ThroughputKind::Cancelled => 3,
        }
    }

    /// The kind of a code; `None` for a code no build wrote.
    pub fn from_code(code: u8) -> Option<ThroughputKind> {
        ThroughputKind::ALL.into_iter().find(|k| k.code() == code)
    }

    /// The name the console shows.
    pub fn as_str(self) -> &'static str {
        match self {
            ThroughputKind::Created => "created",
            ThroughputKind::Completed => "completed",
            ThroughputKind::Failed => "failed",
            ThroughputKind::Cancelled => "cancelled",
        }
    }
}

/// How many tasks of one kind in one minute:
/// [`Index::throughput`](super::Index::throughput).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThroughputBucket {
    /// The minute's start (ms since the epoch, a multiple of 60,000).
    pub minute_ms: u64,
    /// What is counted.
    pub kind: ThroughputKind,
    /// How many.
    pub count: u64,
}

/// How long throughput buckets are kept: a day.
pub const THROUGHPUT_RETENTION_MS: u64 = 24 * 60 * 60 * 1000;

/// The start of the minute of `ms`.
pub fn minute_of(ms: u64) -> u64 {
    ms - ms % 60_000
}

/// The buckets a write moving a task's listing from `old` (`None`: a creation) to `new`
/// adds one to: its creation (at `created_ms`), and its arrival in a terminal status (at
/// `new.updated_ms`).
pub(crate) fn throughput_of(
    old: Option<&Listing>,
    new: &Listing,
    created_ms: u64,
) -> Vec<(u64, ThroughputKind)> {
    let mut out = Vec::new();
    if old.is_none() {
        out.push((minute_of(created_ms), ThroughputKind::Created));
    }
    let was_terminal = old.is_some_and(|o| o.status.is_terminal());
    if new.status.is_terminal() && !was_terminal {
        let kind = match new.status {
            ListedStatus::Completed => ThroughputKind::Completed,
            ListedStatus::Failed => ThroughputKind::Failed,
            _ => ThroughputKind::Cancelled,
        };
        out.push((minute_of(new.updated_ms), kind));
    }
    out
}

/// A replica of the database the console is served from, with its heartbeat:
/// [`Cluster::nodes`](super::Cluster::nodes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// The node id.
    pub node: String,
    /// Its last heartbeat (ms since the epoch, the database's clock).
    pub heartbeat_ms: u64,
    /// The live tasks it holds the lease of.
    pub leases: u64,
}

/// Who holds a task's lease: [`Cluster::lease_of`](super::Cluster::lease_of).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseInfo {
    /// The node holding it (`None`: nobody, the task is finished or orphaned).
    pub node: Option<String>,
    /// The lease epoch: how many times the task was claimed.
    pub epoch: u64,
    /// Takeovers: claims after the first (`epoch - 1`).
    pub takeovers: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(id: &str, created_ms: u64, status: ListedStatus, message: Option<&str>) -> ListedTask {
        ListedTask {
            id: id.to_owned(),
            owner: "0:alice".to_owned(),
            created_ms,
            listing: Listing::new("sleep", status, message, created_ms),
        }
    }

    #[test]
    fn codes_and_spellings_round_trip() {
        for s in ListedStatus::ALL {
            assert_eq!(ListedStatus::from_code(s.code()), Some(s));
            assert_eq!(ListedStatus::parse(s.as_str()), Some(s));
        }
        assert_eq!(ListedStatus::parse("done"), None);
        for k in ThroughputKind::ALL {
            assert_eq!(ThroughputKind::from_code(k.code()), Some(k));
        }
    }

    #[test]
    fn a_long_message_is_cut_at_a_character_boundary() {
        let message = "é".repeat(200);
        let listing = Listing::new("t", ListedStatus::Working, Some(&message), 0);
        let kept = listing.message.unwrap();
        assert!(kept.len() <= MAX_LISTED_MESSAGE && kept.len() >= MAX_LISTED_MESSAGE - 1);
        assert!(message.starts_with(&kept));
    }

    #[test]
    fn text_search_reads_the_id_and_the_message_ignoring_case() {
        let filter = ListingFilter::default().with_text("  Disk ");
        assert!(filter.matches(&task("tsk_1", 1, ListedStatus::Working, Some("disk full"))));
        assert!(filter.matches(&task("tsk_DISK", 1, ListedStatus::Working, None)));
        assert!(!filter.matches(&task("tsk_2", 1, ListedStatus::Working, Some("ok"))));
        assert_eq!(ListingFilter::default().with_text("  ").text, None);
    }

    #[test]
    fn a_page_stops_when_full_at_its_budget_or_at_the_end() {
        let entries: Vec<ListedTask> = (0..10)
            .rev()
            .map(|i| {
                let status = if i % 3 == 0 {
                    ListedStatus::Failed
                } else {
                    ListedStatus::Working
                };
                task(&format!("tsk_{i}"), i, status, None)
            })
            .collect();
        let walk = || entries.iter().cloned().map(Ok::<_, ()>);
        let failed = ListingFilter {
            status: Some(ListedStatus::Failed),
            ..Default::default()
        };
        // Full: two of 9, 6, 3, 0 — the cursor is the last kept one.
        let page = fill_page(walk(), &failed, 2, 100).unwrap();
        assert_eq!(page.tasks.len(), 2);
        assert_eq!(page.next.as_ref().unwrap().id, "tsk_6");
        assert!(!page.budget_spent);
        // The budget: 3 entries looked at (9, 8, 7), one kept, the cursor at the third.
        let page = fill_page(walk(), &failed, 2, 3).unwrap();
        assert!(page.budget_spent);
        assert_eq!(page.scanned, 3);
        assert_eq!(page.next.as_ref().unwrap().id, "tsk_7");
        // The end: no cursor.
        let page = fill_page(walk(), &failed, 10, 100).unwrap();
        assert_eq!(page.tasks.len(), 4);
        assert_eq!(page.next, None);
    }

    #[test]
    fn cursors_and_bounds() {
        let c = ListingCursor {
            created_ms: 5,
            id: "tsk_b".into(),
        };
        assert_eq!(ListingCursor::from_token(&c.token()), Some(c.clone()));
        assert_eq!(ListingCursor::from_token("x.y"), None);
        assert_eq!(ListingCursor::from_token("5."), None);
        assert!(before_cursor(5, "tsk_a", Some(&c)));
        assert!(!before_cursor(5, "tsk_b", Some(&c)));
        assert!(!before_cursor(6, "tsk_a", Some(&c)));
        assert!(before_cursor(4, "tsk_z", Some(&c)));
        let filter = ListingFilter {
            created_from: Some(2),
            created_to: Some(9),
            ..Default::default()
        };
        assert_eq!(filter.walk_bounds(Some(&c)), (2, 6));
        assert_eq!(filter.walk_bounds(None), (2, 9));
    }

    #[test]
    fn throughput_counts_creations_and_arrivals_in_a_final_status() {
        let working = Listing::new("t", ListedStatus::Working, None, 61_000);
        let done = Listing::new("t", ListedStatus::Completed, None, 130_000);
        assert_eq!(
            throughput_of(None, &working, 61_000),
            vec![(60_000, ThroughputKind::Created)]
        );
        assert_eq!(
            throughput_of(Some(&working), &done, 61_000),
            vec![(120_000, ThroughputKind::Completed)]
        );
        // A rewrite of a finished task (its message, a late no-op) counts nothing.
        assert!(throughput_of(Some(&done), &done, 61_000).is_empty());
    }
}
