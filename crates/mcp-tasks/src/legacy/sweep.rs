//! The sweep of legacy session records: deletes what the sessions of an owner that never
//! writes again left in the store once their ids expired (their records, tombstones
//! included, and their owner's emptied index), without waiting for that owner's next write.
//!
//! A sweep walks the meta keys of session records, then those of owner indexes, a page at a
//! time ([`crate::store::Store::meta_page`]), at most a budget of keys per sweep, and goes on
//! from where it stopped at the next one (back to the start after the last key): the work of
//! one sweep is bounded, and every key is seen once per walk of the whole prefix. Each record
//! carries its session's expiry, so a record is deleted on its own, whether or not an index
//! lists it; an index loses its expired entries and is deleted once empty.
//!
//! Several processes may sweep one shared store: deleting a key already deleted is nothing,
//! and a record is deleted only once its session id expired, when no request can write it
//! any more (a request that started just before still writes one with the same expiry, which
//! the next sweep deletes). Within a process, an index is rewritten under the same per-owner
//! lock as a request's write. Between processes, an index rewritten by a sweep while another
//! process adds a session to it can lose that entry: the record is still deleted at its
//! expiry by the walk over records, and the owner counts one record fewer against
//! `max_session_records` until then. A record written without an expiry (before the expiry
//! was recorded in it) cannot be judged and is left alone.

use std::sync::Weak;
use std::time::Duration;

use super::Legacy;
use super::session::{self, INDEX_PREFIX, RecordIndex, STATE_PREFIX, SessionState};
use crate::store::{StoreError, WriteOp};

/// How often the adapter sweeps.
pub(crate) const SWEEP_EVERY: Duration = Duration::from_secs(60);
/// Most meta keys one timed sweep reads (of records and of indexes together).
pub(crate) const SWEEP_BUDGET: usize = 1024;
/// Keys read (and deletions committed) at a time.
const SWEEP_PAGE: usize = 128;

/// Where the walks over records and over indexes stopped (`None`: at the start).
#[derive(Debug, Default)]
pub(crate) struct Cursors {
    records: Option<String>,
    indexes: Option<String>,
}

/// What one sweep did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Swept {
    /// Meta keys read.
    pub(crate) read: usize,
    /// Session records (tombstones included) deleted.
    pub(crate) records: usize,
    /// Owner indexes deleted (every session they listed expired).
    pub(crate) indexes: usize,
    /// Both walks reached the end of their prefix in this sweep.
    pub(crate) complete: bool,
}

impl Legacy {
    /// One sweep of at most `budget` meta keys (at least one key of each prefix is read);
    /// see the module docs. One sweep at a time per adapter.
    pub(crate) async fn sweep_records(&self, budget: usize) -> Result<Swept, StoreError> {
        let mut cursors = self.sweep.lock().await;
        let now_ms = self.shared.now_ms();
        let mut swept = Swept::default();
        let half = (budget / 2).max(1);
        let records_done = self
            .sweep_prefix(
                STATE_PREFIX,
                &mut cursors.records,
                half,
                &mut swept,
                |key, value| {
                    let expired = SessionState::decode(value)
                        .is_some_and(|st| st.expires_at_ms != 0 && st.expires_at_ms <= now_ms);
                    expired.then(|| key.to_owned())
                },
            )
            .await?;
        let mut indexes: Vec<String> = Vec::new();
        let indexes_done = self
            .sweep_prefix(
                INDEX_PREFIX,
                &mut cursors.indexes,
                budget.saturating_sub(swept.read).max(1),
                &mut swept,
                |key, value| {
                    let mut index = RecordIndex::decode(value);
                    if !index.expire(now_ms).is_empty() {
                        indexes.push(key.to_owned());
                    }
                    None
                },
            )
            .await?;
        for key in indexes {
            if self.prune_index(&key, now_ms).await? {
                swept.indexes += 1;
            }
        }
        swept.complete = records_done && indexes_done;
        if swept.records > 0 || swept.indexes > 0 {
            tracing::debug!(
                records = swept.records,
                indexes = swept.indexes,
                "swept expired legacy session records"
            );
        }
        Ok(swept)
    }

    /// Walks `prefix` from `cursor`, at most `budget` keys, deleting the keys `expired` names
    /// a page at a time. Whether the walk reached the end (the cursor is then back at the
    /// start).
    async fn sweep_prefix(
        &self,
        prefix: &str,
        cursor: &mut Option<String>,
        budget: usize,
        swept: &mut Swept,
        mut expired: impl FnMut(&str, &[u8]) -> Option<String>,
    ) -> Result<bool, StoreError> {
        let mut left = budget;
        while left > 0 {
            let want = left.min(SWEEP_PAGE);
            let page = self
                .shared
                .store
                .meta_page(prefix, cursor.as_deref(), want)
                .await?;
            left -= page.len().min(left);
            swept.read += page.len();
            let ops: Vec<WriteOp> = page
                .iter()
                .filter_map(|(key, value)| expired(key, value))
                .map(|key| WriteOp::DeleteMeta { key })
                .collect();
            if !ops.is_empty() {
                swept.records += ops.len();
                self.shared.store.commit(ops).await?;
            }
            if page.len() < want {
                *cursor = None;
                return Ok(true);
            }
            *cursor = page.last().map(|(key, _)| key.clone());
        }
        Ok(false)
    }

    /// Drops the expired sessions of the index at `key` (read again under the owner's lock)
    /// with their records, and the index itself once empty. Whether it was deleted.
    async fn prune_index(&self, key: &str, now_ms: u64) -> Result<bool, StoreError> {
        let stripe = session::stripe(key, self.record_locks.len());
        let _one_writer = self.record_locks[stripe].lock().await;
        let Some(bytes) = self.shared.store.meta_get(key).await? else {
            return Ok(false);
        };
        let mut index = RecordIndex::decode(&bytes);
        let gone = index.expire(now_ms);
        if gone.is_empty() {
            return Ok(false);
        }
        let mut ops: Vec<WriteOp> = gone
            .iter()
            .map(|nonce| WriteOp::DeleteMeta {
                key: session::state_key_of(nonce),
            })
            .collect();
        let emptied = index.is_empty();
        ops.push(if emptied {
            WriteOp::DeleteMeta {
                key: key.to_owned(),
            }
        } else {
            WriteOp::PutMeta {
                key: key.to_owned(),
                value: index.encode(),
            }
        });
        self.shared.store.commit(ops).await?;
        Ok(emptied)
    }
}

/// Sweeps every [`SWEEP_EVERY`] while the adapter lives (it holds the adapter only during a
/// sweep); stops when the adapter is dropped or the store closed.
pub(crate) async fn sweep_periodically(legacy: Weak<Legacy>) {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        let Some(legacy) = legacy.upgrade() else {
            return;
        };
        match legacy.sweep_records(SWEEP_BUDGET).await {
            Ok(_) => {}
            Err(StoreError::Closed) => return,
            Err(e) => tracing::warn!(error = %e, "legacy session record sweep failed"),
        }
    }
}
