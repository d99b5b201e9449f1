//! The store conformance suite (`mcp_tasks_testkit::support::store_conformance`) on the
//! in-memory store and on redb; `tests/pg/postgres.rs` runs it on PostgreSQL.

use mcp_tasks::store::{Durability, Store, StoreOptions};
use mcp_tasks_testkit::support::store_conformance;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_store_conforms() {
    store_conformance::check(&Store::memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redb_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions {
        durability: Durability::None,
        ..StoreOptions::default()
    };
    let store = Store::open_async(dir.path().join("conformance.redb"), options)
        .await
        .unwrap();
    store_conformance::check(&store).await;
    store.close().await;
}
