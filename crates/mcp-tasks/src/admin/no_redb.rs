//! Without the feature `redb`: every redb location answers [`AdminError::Unsupported`].

use std::path::Path;

use super::{AdminError, BackupReport, CompactReport, Dump, Row, StatsReport};
use crate::store::inspect::{InspectFuture, Inspector};

fn no_redb() -> AdminError {
    AdminError::Unsupported("this build has no redb support (cargo feature `redb`)".into())
}

/// No reader can exist.
pub(crate) enum RedbReader {}

impl RedbReader {
    pub(crate) async fn open(_path: &Path) -> Result<RedbReader, AdminError> {
        Err(no_redb())
    }

    pub(crate) async fn backup(&self, _to: &Path) -> Result<BackupReport, AdminError> {
        match *self {}
    }
}

impl Inspector for RedbReader {
    fn scan(&self, _after: Option<String>, _limit: usize) -> InspectFuture<'_, Vec<Row>> {
        match *self {}
    }

    fn row<'a>(&'a self, _id: &'a str) -> InspectFuture<'a, Option<Row>> {
        match *self {}
    }

    fn facts(&self, _now_ms: u64) -> InspectFuture<'_, StatsReport> {
        match *self {}
    }

    fn usage_by_owner(&self) -> InspectFuture<'_, Option<Vec<(String, crate::store::Usage)>>> {
        match *self {}
    }
}

pub(crate) async fn check_pages(_path: &Path) -> Result<(RedbReader, Option<String>), AdminError> {
    Err(no_redb())
}

pub(crate) async fn compact(_path: &Path) -> Result<CompactReport, AdminError> {
    Err(no_redb())
}

pub(crate) async fn delete(_path: &Path, _ids: Vec<String>) -> Result<(), AdminError> {
    Err(no_redb())
}

pub(crate) async fn dump(_path: &Path) -> Result<Dump, AdminError> {
    Err(no_redb())
}

pub(crate) async fn load(_path: &Path, _dump: Dump) -> Result<(u64, u64), AdminError> {
    Err(no_redb())
}
