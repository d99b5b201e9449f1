//! The redb schema: table definitions, the record header, and the owner, listing, tail and
//! due tables as one write keeps them. Converting an older layout is `layout.rs`; opening
//! (or atomically creating) the file and its storage backends, `file.rs`.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;

use redb::{ReadableTable, TableDefinition, WriteTransaction};

use crate::{Indexer, OwnerEntry, Usage};

/// id → record: a [`RecordHeader`] (sequence number, due time, owner) followed by the
/// snapshot bytes (layouts 2 and 3; in layout 1 the value was the snapshot bytes alone). The
/// header has [`RECORD_HEADER_LEN`] bytes, then the owner when flag bit 2 is set:
///
/// | offset | bytes | field                                                               |
/// |--------|-------|---------------------------------------------------------------------|
/// | 0      | 1     | flags: bit 0 = a sequence number is kept, bit 1 = a due time is set, bit 2 = an owner follows (layout 3) |
/// | 1      | 8     | sequence number, u64 little endian (0 when bit 0 is clear)          |
/// | 9      | 8     | due time in ms since the Unix epoch, u64 little endian (0 when clear) |
/// | 17     | 8     | bit 2 only: creation time in ms since the Unix epoch, u64 little endian |
/// | 25     | 4     | bit 2 only: length `n` of the owner key, u32 little endian          |
/// | 29     | n     | bit 2 only: the owner key (`crate::owner_key`), UTF-8        |
/// | …      | 4     | bit 3 only (layout 6): length `t` of the snapshot's tail kept in [`TAILS`], u32 little endian |
/// | …      | …     | the snapshot bytes (`crate::persist`); with bit 3, all but their last `t`, which are the [`TAILS`] value of the id |
///
/// Other flag bits are reserved (zero). A value shorter than its header or with a reserved
/// bit set is a damaged record: readers hand its bytes on whole, where they fail to decode as
/// a snapshot, and the writer refuses to overwrite it conditionally.
pub(crate) const TASKS: TableDefinition<&str, &[u8]> = TableDefinition::new("tasks");
/// id → the last bytes of its snapshot, kept apart (layout 6) when a put says they never
/// change (`WriteOp::Put::constant_tail`: a task's arguments) and they are at least
/// [`TAIL_APART_MIN`] bytes: written by the put that first stores them, never rewritten by
/// the task's later transitions (a finished task with 1 MiB of arguments wrote them once, not
/// twice), removed with the record. The record's header says how long its tail is (bit 3); a
/// record without the bit has none here.
pub(crate) const TAILS: TableDefinition<&str, &[u8]> = TableDefinition::new("tails");
/// The smallest constant tail kept in [`TAILS`]: smaller ones stay in the record, where they
/// cost no pages of another table.
pub(crate) const TAIL_APART_MIN: usize = 4096;
/// ids of non-terminal tasks.
pub(crate) const LIVE: TableDefinition<&str, ()> = TableDefinition::new("live");
/// (due_ms, id) for the expiry reaper; an entry exists exactly for each stored task whose
/// header has a due time, with that time.
pub(crate) const DUE: TableDefinition<(u64, &str), ()> = TableDefinition::new("due");
/// Free-form metadata.
pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
/// (owner key, created_ms, id) of every record whose header names an owner (layout 3): the
/// owner index that pages one owner's tasks without reading anyone else's.
pub(crate) const OWNERS: TableDefinition<(&str, u64, &str), ()> = TableDefinition::new("owners");
/// owner key → (stored tasks, stored bytes) of the records [`OWNERS`] holds, the bytes being
/// each record's id plus its `tasks` value (plus its tail in [`TAILS`]). Changed in the
/// transaction that changes the records, so it is exact after a crash; the disk quota reads it.
pub(crate) const USAGE: TableDefinition<&str, (u64, u64)> = TableDefinition::new("usage");
/// The listing index (layout 5): (index, value, created_ms, id) of every record whose header
/// names an owner, in three indexes of one table (a transaction pays its commit pages per
/// table it writes, and every transition writes the listing):
///
/// | index | value | holds |
/// |---|---|---|
/// | [`BY_CREATED`] | `""` | the owner and listing ([`StoredListing`]): every listed task in creation order |
/// | [`BY_STATUS`] | the status's wire spelling | nothing (the entry is looked up under [`BY_CREATED`]) |
/// | [`BY_TOOL`] | the tool | nothing |
pub(crate) const LISTING_INDEX: TableDefinition<(u8, &str, u64, &str), &[u8]> =
    TableDefinition::new("listing_index");
/// The [`LISTING_INDEX`] index of every listed task, in creation order.
pub(crate) const BY_CREATED: u8 = 0;
/// The [`LISTING_INDEX`] index of statuses.
pub(crate) const BY_STATUS: u8 = 1;
/// The [`LISTING_INDEX`] index of tools.
pub(crate) const BY_TOOL: u8 = 2;
/// The listing's counters (layout 5), (kind, owner key, tool, minute start ms, code) → count,
/// two kinds in one table:
///
/// | kind | key | counts |
/// |---|---|---|
/// | [`COUNT_TASKS`] | (owner key, tool, 0, status code) | stored tasks |
/// | [`COUNT_THROUGHPUT`] | (`""`, `""`, minute start ms, kind code) | creations and arrivals in a final status in that minute |
pub(crate) const LISTING_COUNTERS: TableDefinition<(u8, &str, &str, u64, u8), u64> =
    TableDefinition::new("listing_counters");
/// The [`LISTING_COUNTERS`] kind of the stored tasks per (owner, tool, status).
pub(crate) const COUNT_TASKS: u8 = 0;
/// The [`LISTING_COUNTERS`] kind of the throughput buckets.
pub(crate) const COUNT_THROUGHPUT: u8 = 1;

/// Layout 4 only: (created_ms, id) → [`StoredListing`], now [`LISTING_INDEX`]'s
/// [`BY_CREATED`]. Read by the conversion and by the read-only administration of a layout-4
/// file.
pub(crate) const V4_LISTING: TableDefinition<(u64, &str), &[u8]> = TableDefinition::new("listing");
/// Layout 4 only: (index, value, created_ms, id), index [`V4_BY_STATUS`] or [`V4_BY_TOOL`]; now
/// [`LISTING_INDEX`].
pub(crate) const V4_LISTING_BY: TableDefinition<(u8, &str, u64, &str), ()> =
    TableDefinition::new("listing_by");
/// Layout 4 only: (owner key, tool, status code) → stored tasks; now [`LISTING_COUNTERS`].
pub(crate) const V4_LISTING_COUNTS: TableDefinition<(&str, &str, u8), u64> =
    TableDefinition::new("listing_counts");
/// Layout 4 only: (minute start ms, kind code) → count; now [`LISTING_COUNTERS`].
pub(crate) const V4_THROUGHPUT: TableDefinition<(u64, u8), u64> =
    TableDefinition::new("throughput");
/// Layout 4's [`V4_LISTING_BY`] index of statuses.
pub(crate) const V4_BY_STATUS: u8 = 0;
/// Layout 4's [`V4_LISTING_BY`] index of tools.
pub(crate) const V4_BY_TOOL: u8 = 1;

/// Layout 1 only: id → due_ms, the reverse of [`DUE`] (now in the record header). Read by the
/// migration and by the read-only administration of a layout-1 file.
pub(crate) const V1_DUE_BY_ID: TableDefinition<&str, u64> = TableDefinition::new("due_by_id");
/// Layout 1 only: id → sequence number of the stored snapshot (now in the record header).
pub(crate) const V1_SEQ: TableDefinition<&str, u64> = TableDefinition::new("seq");

/// The meta key of the table layout version of a redb store (u64, little endian). Written
/// when a store is created or first opened by a build that knows it; a file without it has
/// layout 1 (the layout before the key existed).
pub(crate) const META_SCHEMA_VERSION: &str = "schema_version";
/// The table layout this build writes: the tables above, with snapshot bytes of any version
/// `crate::persist` knows. Layout 1 (tables `tasks` of bare snapshots, `seq`, `live`, `due`,
/// `due_by_id`, `meta`) is converted by the first writable open ([`upgrade_layout`]) and
/// still read by the read-only administration. A store with a larger version is refused,
/// unchanged.
///
/// Layout 2 → 3 adds the owner to the record header and the tables [`OWNERS`] and [`USAGE`];
/// the conversion reads each record's owner and creation time from its snapshot. Layout 3 → 4
/// added the listing index (tables `listing`, `listing_by`, `listing_counts`, `throughput`),
/// read from each record's snapshot. Layout 4 → 5 keeps the same entries in two tables,
/// [`LISTING_INDEX`] and [`LISTING_COUNTERS`] (every transition wrote all four). Layout 5 → 6
/// adds [`TAILS`] and the header's bit 3; no record changes.
pub(crate) const SCHEMA_VERSION: u64 = 6;

/// The length of the fixed part of a [`RecordHeader`] in a `tasks` value.
pub(crate) const RECORD_HEADER_LEN: usize = 17;
const HAS_SEQ: u8 = 1;
const HAS_DUE: u8 = 2;
const HAS_OWNER: u8 = 4;
const HAS_TAIL: u8 = 8;

/// What a `tasks` value (layouts 2 and 3) holds beside the snapshot bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RecordHeader {
    /// The sequence number of the snapshot, for conditional writes (`None`: stored before
    /// sequence numbers were kept, or written unconditionally without one).
    pub(crate) seq: Option<u64>,
    /// When the reaper must next look at the task (its [`DUE`] entry).
    pub(crate) due_ms: Option<u64>,
    /// The task's owner and creation time (its [`OWNERS`] entry); `None` for a record of
    /// layout 2, or one whose snapshot did not decode when it was converted.
    pub(crate) owner: Option<OwnerEntry>,
    /// The length of the snapshot's last bytes kept in [`TAILS`] (layout 6), if any.
    pub(crate) tail: Option<u32>,
}

impl RecordHeader {
    /// The bytes of the record's tail in [`TAILS`] (0 without one): a record stands for its
    /// `tasks` value plus these, and the owner's usage counts both.
    pub(crate) fn tail_len(&self) -> usize {
        self.tail.map_or(0, |t| t as usize)
    }

    /// The `tasks` value of `snapshot` under this header.
    pub(crate) fn encode(&self, snapshot: &[u8]) -> Vec<u8> {
        let owner_len = self.owner.as_ref().map_or(0, |o| 12 + o.owner.len());
        let mut out = Vec::with_capacity(RECORD_HEADER_LEN + owner_len + snapshot.len());
        let flags = if self.seq.is_some() { HAS_SEQ } else { 0 }
            | if self.due_ms.is_some() { HAS_DUE } else { 0 }
            | if self.owner.is_some() { HAS_OWNER } else { 0 }
            | if self.tail.is_some() { HAS_TAIL } else { 0 };
        out.push(flags);
        out.extend_from_slice(&self.seq.unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&self.due_ms.unwrap_or(0).to_le_bytes());
        if let Some(owner) = &self.owner {
            out.extend_from_slice(&owner.created_ms.to_le_bytes());
            let len = u32::try_from(owner.owner.len()).unwrap_or(u32::MAX);
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(&owner.owner.as_bytes()[..len as usize]);
        }
        if let Some(tail) = self.tail {
            out.extend_from_slice(&tail.to_le_bytes());
        }
        out.extend_from_slice(snapshot);
        out
    }

    /// The header and the snapshot bytes of a `tasks` value; `Err` describes a damaged one.
    pub(crate) fn decode(value: &[u8]) -> Result<(RecordHeader, &[u8]), String> {
        let Some((head, snapshot)) = value.split_first_chunk::<RECORD_HEADER_LEN>() else {
            return Err(format!(
                "the record has {} bytes, fewer than its {RECORD_HEADER_LEN}-byte header",
                value.len()
            ));
        };
        let flags = head[0];
        if flags & !(HAS_SEQ | HAS_DUE | HAS_OWNER | HAS_TAIL) != 0 {
            return Err(format!("the record header has unknown flags {flags:#04x}"));
        }
        let field = |at: usize| {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(&head[at..at + 8]);
            u64::from_le_bytes(bytes)
        };
        let (owner, snapshot) = if flags & HAS_OWNER != 0 {
            let Some((fixed, rest)) = snapshot.split_first_chunk::<12>() else {
                return Err("the record header's owner is cut short".to_owned());
            };
            let mut created = [0u8; 8];
            created.copy_from_slice(&fixed[..8]);
            let mut len = [0u8; 4];
            len.copy_from_slice(&fixed[8..]);
            let len = u32::from_le_bytes(len) as usize;
            if rest.len() < len {
                return Err("the record header's owner is cut short".to_owned());
            }
            let (key, snapshot) = rest.split_at(len);
            let key = std::str::from_utf8(key)
                .map_err(|_| "the record header's owner is not UTF-8".to_owned())?;
            let owner = OwnerEntry {
                owner: key.to_owned(),
                created_ms: u64::from_le_bytes(created),
            };
            (Some(owner), snapshot)
        } else {
            (None, snapshot)
        };
        let (tail, snapshot) = if flags & HAS_TAIL != 0 {
            let Some((len, rest)) = snapshot.split_first_chunk::<4>() else {
                return Err("the record header's tail length is cut short".to_owned());
            };
            (Some(u32::from_le_bytes(*len)), rest)
        } else {
            (None, snapshot)
        };
        let header = RecordHeader {
            seq: (flags & HAS_SEQ != 0).then(|| field(1)),
            due_ms: (flags & HAS_DUE != 0).then(|| field(9)),
            owner,
            tail,
        };
        Ok((header, snapshot))
    }
}

use crate::listing::{
    ListedStatus, ListedTask, Listing, THROUGHPUT_RETENTION_MS, ThroughputKind, throughput_of,
};

/// A counter of a write transaction as the table holds it when first read, and as the
/// transaction's writes so far left it (`None`: no entry). See [`OwnerTables::flush`] and
/// [`ListingTables::flush`].
#[derive(Clone, Copy)]
struct Tally<V> {
    stored: Option<V>,
    now: Option<V>,
}

impl<V: PartialEq> Tally<V> {
    fn loaded(stored: Option<V>) -> Self
    where
        V: Copy,
    {
        Tally {
            stored,
            now: stored,
        }
    }

    /// What the table must get at the flush: `None` when it already holds `now`.
    fn change(&self) -> Option<Option<&V>> {
        (self.now != self.stored).then_some(self.now.as_ref())
    }
}

/// The tally of `key` in `tallies`, read from its table by `load` the first time.
fn tally_of<K: Ord, V: Copy + PartialEq>(
    tallies: &mut BTreeMap<K, Tally<V>>,
    key: K,
    load: impl FnOnce() -> Result<Option<V>, redb::Error>,
) -> Result<&mut Tally<V>, redb::Error> {
    Ok(match tallies.entry(key) {
        Entry::Occupied(e) => e.into_mut(),
        Entry::Vacant(e) => e.insert(Tally::loaded(load()?)),
    })
}

/// The [`LISTING_INDEX`] key of the entry of task `id` created at `created_ms`.
pub(crate) fn created_key(created_ms: u64, id: &str) -> (u8, &'static str, u64, &str) {
    (BY_CREATED, "", created_ms, id)
}

/// The [`LISTING_COUNTERS`] key of the tasks of `owner` with `tool` in status `status`.
pub(crate) fn tasks_key<'a>(
    owner: &'a str,
    tool: &'a str,
    status: u8,
) -> (u8, &'a str, &'a str, u64, u8) {
    (COUNT_TASKS, owner, tool, 0, status)
}

/// The [`LISTING_COUNTERS`] key of the throughput bucket of `kind` in the minute starting at
/// `minute`.
pub(crate) fn bucket_key(minute: u64, kind: u8) -> (u8, &'static str, &'static str, u64, u8) {
    (COUNT_THROUGHPUT, "", "", minute, kind)
}

/// The owner index and usage counters a write keeps beside the records.
///
/// The usage counters are kept in memory for the life of the value and written by
/// [`OwnerTables::flush`], which every writer calls before it commits: a group commit of
/// many tasks of one owner writes that owner's counter once (each insert walks and rewrites
/// the counter's leaf), and not at all when the batch leaves it as it was.
pub(crate) struct OwnerTables<'t> {
    pub(crate) owners: redb::Table<'t, (&'static str, u64, &'static str), ()>,
    pub(crate) usage: redb::Table<'t, &'static str, (u64, u64)>,
    tally: BTreeMap<String, Tally<(u64, u64)>>,
}

impl<'t> OwnerTables<'t> {
    /// Opens both tables in `txn`.
    pub(crate) fn open(txn: &'t WriteTransaction) -> Result<Self, redb::TableError> {
        Ok(Self {
            owners: txn.open_table(OWNERS)?,
            usage: txn.open_table(USAGE)?,
            tally: BTreeMap::new(),
        })
    }

    /// The usage counter of `owner` as this transaction's writes left it.
    fn usage_of(&mut self, owner: &str) -> Result<&mut Tally<(u64, u64)>, redb::Error> {
        let usage = &self.usage;
        tally_of(&mut self.tally, owner.to_owned(), || {
            Ok(usage.get(owner)?.map(|v| v.value()))
        })
    }

    /// Writes the usage counters this value changed. Must run before the transaction
    /// commits; the counters read afterwards come from the table again.
    pub(crate) fn flush(&mut self) -> Result<(), redb::Error> {
        for (owner, tally) in std::mem::take(&mut self.tally) {
            match tally.change() {
                None => {}
                Some(None) => {
                    self.usage.remove(owner.as_str())?;
                }
                Some(Some(value)) => {
                    self.usage.insert(owner.as_str(), *value)?;
                }
            }
        }
        Ok(())
    }

    /// Replaces the record of `id` whose `tasks` value had the owner entry and stored length
    /// `old` (its tail included, [`RecordHeader::tail_len`]; `None`: not stored) by the value
    /// `new`, in the index and the usage. The common case — the same owner entry, another
    /// size — changes only the usage (every table a transaction writes costs its commit
    /// pages), and nothing when the size is the same.
    pub(crate) fn replace(
        &mut self,
        id: &str,
        old: Option<(Option<OwnerEntry>, usize)>,
        new: &[u8],
    ) -> Result<(), redb::Error> {
        let (new_owner, new_len) = match RecordHeader::decode(new) {
            Ok((header, _)) => (header.owner.clone(), new.len() + header.tail_len()),
            Err(_) => (None, new.len()),
        };
        let Some((old_owner, old_len)) = old else {
            return self.account(id, new, 1);
        };
        if old_owner != new_owner {
            if let Some(owner) = old_owner {
                self.change(id, &owner, (id.len() + old_len) as u64, -1)?;
            }
            return self.account(id, new, 1);
        }
        let Some(owner) = new_owner else {
            return Ok(());
        };
        if old_len == new_len {
            return Ok(());
        }
        let tally = self.usage_of(&owner.owner)?;
        let (tasks, bytes) = tally.now.unwrap_or((0, 0));
        let bytes = bytes
            .saturating_sub(old_len as u64)
            .saturating_add(new_len as u64);
        tally.now = Some((tasks.max(1), bytes));
        Ok(())
    }

    /// Adds (`sign` > 0) or removes the `tasks` value `value` of `id` to or from its owner's
    /// index entry and usage; nothing for a record without an owner or a damaged one.
    pub(crate) fn account(&mut self, id: &str, value: &[u8], sign: i8) -> Result<(), redb::Error> {
        let Ok((header, _)) = RecordHeader::decode(value) else {
            return Ok(());
        };
        let Some(owner) = &header.owner else {
            return Ok(());
        };
        let size = id.len() + value.len() + header.tail_len();
        self.change(id, owner, size as u64, sign)
    }

    /// Adds (`sign` > 0) or removes the record of `id`, `size` bytes, of `owner`.
    fn change(
        &mut self,
        id: &str,
        owner: &OwnerEntry,
        size: u64,
        sign: i8,
    ) -> Result<(), redb::Error> {
        let key = owner.owner.as_str();
        if sign > 0 {
            self.owners.insert((key, owner.created_ms, id), ())?;
        } else {
            self.owners.remove((key, owner.created_ms, id))?;
        }
        let tally = self.usage_of(key)?;
        let mut usage = tally
            .now
            .map_or_else(Usage::default, |(tasks, bytes)| Usage { tasks, bytes });
        usage.add(size, sign);
        // No entry for an owner without tasks (as the table would have it after a removal).
        tally.now = (usage.tasks != 0).then_some((usage.tasks, usage.bytes));
        Ok(())
    }
}

/// A [`LISTING_INDEX`] value under [`BY_CREATED`] (postcard; frozen with layout 4, the same in
/// layout 5: a change is a new layout).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct StoredListing {
    pub(crate) owner: String,
    pub(crate) tool: String,
    pub(crate) status: u8,
    pub(crate) message: Option<String>,
    pub(crate) updated_ms: u64,
}

impl StoredListing {
    pub(crate) fn new(owner: &str, listing: &Listing) -> StoredListing {
        StoredListing {
            owner: owner.to_owned(),
            tool: listing.tool.clone(),
            status: listing.status.code(),
            message: listing.message.clone(),
            updated_ms: listing.updated_ms,
        }
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).unwrap_or_default()
    }

    /// The entry of `value`; `None` when it does not decode (a damaged page: the entry is
    /// then skipped by listings and replaced by the next write of its task).
    pub(crate) fn decode(value: &[u8]) -> Option<StoredListing> {
        postcard::from_bytes(value).ok()
    }

    /// The listing it holds; `None` for a status code no build wrote.
    pub(crate) fn listing(&self) -> Option<Listing> {
        Some(Listing {
            tool: self.tool.clone(),
            status: ListedStatus::from_code(self.status)?,
            message: self.message.clone(),
            updated_ms: self.updated_ms,
        })
    }

    /// The listed task of the entry at (`created_ms`, `id`).
    pub(crate) fn task(&self, created_ms: u64, id: &str) -> Option<ListedTask> {
        Some(ListedTask {
            id: id.to_owned(),
            owner: self.owner.clone(),
            created_ms,
            listing: self.listing()?,
        })
    }
}

/// The listing index, its counters and the throughput buckets a write keeps beside the
/// records (layout 5: [`LISTING_INDEX`] and [`LISTING_COUNTERS`]).
///
/// The counters and the buckets are kept in memory for the life of the value and written by
/// [`ListingTables::flush`], which every writer calls before it commits: a group commit of
/// many transitions writes each counter and bucket it changed once, not once per transition,
/// and leaves alone one that ends where it started.
pub(crate) struct ListingTables<'t> {
    pub(crate) index: redb::Table<'t, (u8, &'static str, u64, &'static str), &'static [u8]>,
    pub(crate) counters: redb::Table<'t, (u8, &'static str, &'static str, u64, u8), u64>,
    counted: BTreeMap<(String, String, u8), Tally<u64>>,
    buckets: BTreeMap<(u64, u8), Tally<u64>>,
    /// Buckets of minutes before this one are dropped at the flush (see
    /// [`ListingTables::count_throughput`]); 0 when none are.
    drop_before: u64,
}

impl<'t> ListingTables<'t> {
    /// Opens both tables in `txn`.
    pub(crate) fn open(txn: &'t WriteTransaction) -> Result<Self, redb::TableError> {
        Ok(Self {
            index: txn.open_table(LISTING_INDEX)?,
            counters: txn.open_table(LISTING_COUNTERS)?,
            counted: BTreeMap::new(),
            buckets: BTreeMap::new(),
            drop_before: 0,
        })
    }

    /// Writes the counters and buckets this value changed, and drops the buckets past
    /// their retention. Must run before the transaction commits.
    pub(crate) fn flush(&mut self) -> Result<(), redb::Error> {
        for ((owner, tool, status), tally) in std::mem::take(&mut self.counted) {
            let key = tasks_key(&owner, &tool, status);
            match tally.change() {
                None => {}
                Some(None) => {
                    self.counters.remove(key)?;
                }
                Some(Some(n)) => {
                    self.counters.insert(key, *n)?;
                }
            }
        }
        let drop_before = std::mem::take(&mut self.drop_before);
        if drop_before > 0 {
            let stale: Vec<(u64, u8)> = self
                .counters
                .range(bucket_key(0, 0)..bucket_key(drop_before, 0))?
                .map(|e| e.map(|(k, _)| (k.value().3, k.value().4)))
                .collect::<Result<_, _>>()?;
            for (minute, kind) in stale {
                self.counters.remove(bucket_key(minute, kind))?;
            }
        }
        for (key, tally) in std::mem::take(&mut self.buckets) {
            // A bucket of a dropped minute that was counted again after the drop: the drop
            // above took its stored value, so it is written whatever it held.
            let change = if key.0 < drop_before {
                Some(tally.now.as_ref())
            } else {
                tally.change()
            };
            match change {
                None | Some(None) => {}
                Some(Some(n)) => {
                    self.counters.insert(bucket_key(key.0, key.1), *n)?;
                }
            }
        }
        Ok(())
    }

    /// Moves the listing of task `id`, created at `created_ms` by `owner`, to `new`
    /// (`None`: the task is deleted): its entry, its status and tool entries, the counters,
    /// and the throughput of a creation or an arrival in a final status. Writes nothing when
    /// nothing changes, and only the entry when only the message or the update time does.
    pub(crate) fn relist(
        &mut self,
        id: &str,
        created_ms: u64,
        owner: &str,
        new: Option<&Listing>,
    ) -> Result<(), redb::Error> {
        let old = self
            .index
            .get(created_key(created_ms, id))?
            .and_then(|v| StoredListing::decode(v.value()));
        let old_listing = old.as_ref().and_then(StoredListing::listing);
        let new_entry = new.map(|l| StoredListing::new(owner, l));
        if old == new_entry {
            return Ok(());
        }
        self.move_entries(id, created_ms, old.as_ref(), new_entry.as_ref())?;
        match (new, &new_entry) {
            (Some(listing), Some(entry)) => {
                self.index
                    .insert(created_key(created_ms, id), entry.encode().as_slice())?;
                for (minute, kind) in throughput_of(old_listing.as_ref(), listing, created_ms) {
                    self.count_throughput(minute, kind)?;
                }
            }
            _ => {
                self.index.remove(created_key(created_ms, id))?;
            }
        }
        Ok(())
    }

    /// Takes the task whose `tasks` value is `value` out of the listing (nothing for a
    /// record without an owner entry or a damaged header).
    pub(crate) fn forget(&mut self, id: &str, value: &[u8]) -> Result<(), redb::Error> {
        if let Ok((
            RecordHeader {
                owner: Some(owner), ..
            },
            _,
        )) = RecordHeader::decode(value)
        {
            self.relist(id, owner.created_ms, &owner.owner, None)?;
        }
        Ok(())
    }

    /// Lists the task whose `tasks` value is `value`, its listing read from its snapshot
    /// (administration's writes of records it got no listing for).
    pub(crate) fn remember(
        &mut self,
        id: &str,
        value: &[u8],
        indexer: &dyn Indexer,
    ) -> Result<(), redb::Error> {
        if let Ok((
            RecordHeader {
                owner: Some(owner), ..
            },
            snapshot,
        )) = RecordHeader::decode(value)
            && let Some(listing) = indexer.listing(snapshot)
        {
            self.relist(id, owner.created_ms, &owner.owner, Some(&listing))?;
        }
        Ok(())
    }

    /// Moves the status and tool entries and the counter of task `id`, created at
    /// `created_ms`, from `old` to `new` (`None`: not listed), touching only what differs: a
    /// change of status leaves the tool's entry as it is (a task's tool never changes).
    pub(super) fn move_entries(
        &mut self,
        id: &str,
        created_ms: u64,
        old: Option<&StoredListing>,
        new: Option<&StoredListing>,
    ) -> Result<(), redb::Error> {
        let status =
            |e: &StoredListing| ListedStatus::from_code(e.status).map_or("", ListedStatus::as_str);
        for (index, was, is) in [
            (BY_STATUS, old.map(status), new.map(status)),
            (
                BY_TOOL,
                old.map(|e| e.tool.as_str()),
                new.map(|e| e.tool.as_str()),
            ),
        ] {
            if was != is {
                if let Some(value) = was {
                    self.index.remove((index, value, created_ms, id))?;
                }
                if let Some(value) = is {
                    self.index
                        .insert((index, value, created_ms, id), [].as_slice())?;
                }
            }
        }
        fn key(e: &StoredListing) -> (&str, &str, u8) {
            (e.owner.as_str(), e.tool.as_str(), e.status)
        }
        let (was, is) = (old.map(key), new.map(key));
        if was != is {
            if let Some(key) = was {
                let tally = self.counter(key)?;
                // No entry for a count of zero (nor below: a damaged count stays at none).
                tally.now = tally.now.filter(|n| *n > 1).map(|n| n - 1);
            }
            if let Some(key) = is {
                let tally = self.counter(key)?;
                tally.now = Some(tally.now.unwrap_or(0).saturating_add(1));
            }
        }
        Ok(())
    }

    /// The counter of `key` as this transaction's writes left it.
    fn counter(&mut self, key: (&str, &str, u8)) -> Result<&mut Tally<u64>, redb::Error> {
        let counters = &self.counters;
        tally_of(
            &mut self.counted,
            (key.0.to_owned(), key.1.to_owned(), key.2),
            || {
                Ok(counters
                    .get(tasks_key(key.0, key.1, key.2))?
                    .map(|v| v.value()))
            },
        )
    }

    /// Adds one to a throughput bucket; the first count of a minute also drops the buckets
    /// older than [`THROUGHPUT_RETENTION_MS`] (at the flush; from here on they count as gone).
    fn count_throughput(&mut self, minute: u64, kind: ThroughputKind) -> Result<(), redb::Error> {
        let key = (minute, kind.code());
        let drop_before = self.drop_before;
        let counters = &self.counters;
        let tally = tally_of(&mut self.buckets, key, || {
            // A bucket of a minute already dropped counts from nothing (the flush writes such
            // a bucket whatever it held).
            if minute < drop_before {
                return Ok(None);
            }
            Ok(counters.get(bucket_key(minute, key.1))?.map(|v| v.value()))
        })?;
        let first = tally.now.is_none();
        tally.now = Some(tally.now.unwrap_or(0).saturating_add(1));
        if first {
            // Every bucket before `oldest` is gone from here on, a bucket counted again since
            // an earlier drop included.
            let oldest = minute.saturating_sub(THROUGHPUT_RETENTION_MS);
            self.drop_before = self.drop_before.max(oldest);
            for (_, tally) in self.buckets.range_mut(..(oldest, 0)) {
                tally.now = None;
            }
        }
        Ok(())
    }
}

/// [`TAILS`] of a read transaction; `None` in a file of a layout before 6 (read as it is by
/// the administration), which keeps no tails.
pub(crate) fn open_tails(
    txn: &redb::ReadTransaction,
) -> Result<Option<redb::ReadOnlyTable<&'static str, &'static [u8]>>, redb::TableError> {
    match txn.open_table(TAILS) {
        Ok(t) => Ok(Some(t)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The snapshot bytes of the `tasks` value `value` of `id` as they were put: after the
/// header, followed by the tail kept in [`TAILS`] when the header says there is one. A
/// damaged header hands the value on whole, and a tail the table lacks is left out: either
/// then fails to decode as a snapshot, naming the task.
pub(crate) fn record_bytes<T>(
    id: &str,
    value: &[u8],
    tails: Option<&T>,
) -> Result<Vec<u8>, redb::StorageError>
where
    T: ReadableTable<&'static str, &'static [u8]>,
{
    let Ok((header, snapshot)) = RecordHeader::decode(value) else {
        return Ok(value.to_vec());
    };
    if header.tail.is_none() {
        return Ok(snapshot.to_vec());
    }
    // Sized by what is stored, never by the header's length (a damaged header cannot ask
    // for gigabytes); a tail of another length fails to decode, naming the task.
    match tails.map(|t| t.get(id)).transpose()?.flatten() {
        Some(tail) => Ok([snapshot, tail.value()].concat()),
        None => {
            tracing::error!(
                id,
                "a record's tail is not stored: the record will not decode"
            );
            Ok(snapshot.to_vec())
        }
    }
}

/// Removes from [`TAILS`] the tail of the record of `id` whose `tasks` value was `value`,
/// when its header names one: what every deletion or whole rewrite of a record does.
pub(crate) fn forget_tail(
    tails: &mut redb::Table<&str, &[u8]>,
    id: &str,
    value: &[u8],
) -> Result<(), redb::StorageError> {
    if RecordHeader::decode(value).is_ok_and(|(h, _)| h.tail.is_some()) {
        tails.remove(id)?;
    }
    Ok(())
}

/// Moves the [`DUE`] entry of `id` from `old` to `new` (nothing when they are equal).
fn move_due(
    due: &mut redb::Table<(u64, &str), ()>,
    id: &str,
    old: Option<u64>,
    new: Option<u64>,
) -> Result<(), redb::Error> {
    if old == new {
        return Ok(());
    }
    if let Some(old) = old {
        due.remove((old, id))?;
    }
    if let Some(new) = new {
        due.insert((new, id), ())?;
    }
    Ok(())
}

/// What a write must know of the record (a `tasks` value) it replaces or removes: its due
/// time, or that its header is damaged (its due entry is then unknown). Shared by the writer
/// and the `store` commands that write.
pub(crate) enum OldDue {
    Known(Option<u64>),
    Damaged,
}

/// The [`OldDue`] of the `tasks` value a write replaces or removes (`None`: not stored).
pub(crate) fn old_due(value: Option<&[u8]>) -> OldDue {
    match value.map(RecordHeader::decode) {
        None => OldDue::Known(None),
        Some(Ok((header, _))) => OldDue::Known(header.due_ms),
        Some(Err(_)) => OldDue::Damaged,
    }
}

/// Moves the due entry of `id` away from what `old` says to `new`. For a damaged record the
/// whole [`DUE`] table is searched for entries of `id` (a rare repair path; every other write
/// knows the old entry from the header).
pub(crate) fn replace_due(
    due: &mut redb::Table<(u64, &str), ()>,
    id: &str,
    old: OldDue,
    new: Option<u64>,
) -> Result<(), redb::Error> {
    match old {
        OldDue::Known(old) => move_due(due, id, old, new),
        OldDue::Damaged => {
            let mut stale = Vec::new();
            for entry in due.iter()? {
                let (key, _) = entry?;
                let (at, entry_id) = key.value();
                if entry_id == id {
                    stale.push(at);
                }
            }
            for at in stale {
                due.remove((at, id))?;
            }
            if let Some(new) = new {
                due.insert((new, id), ())?;
            }
            Ok(())
        }
    }
}
