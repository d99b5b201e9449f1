//! The store a suite's embedded runtime runs on: the same test body runs once on redb and once
//! on PostgreSQL (a schema of its own per test; skipped with a message when PostgreSQL is not
//! reachable, unless `MCP_TASKS_REQUIRE_POSTGRES` is set; and without the `postgres` feature).
//! [`on_both_stores!`](crate::on_both_stores) makes the two tests of one body.

use mcp_tasks::{Runtime, RuntimeBuilder};

/// Which store a test body runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The embedded store: a redb file in the test's directory.
    Redb,
    /// PostgreSQL: a schema of the test's own.
    Postgres,
}

/// Where one test's runtimes keep their tasks.
pub struct Place {
    /// The store the test runs on.
    pub backend: Backend,
    /// The test's directory (the redb files; on PostgreSQL, whatever else the test keeps).
    pub dir: tempfile::TempDir,
    #[cfg(feature = "postgres")]
    pg: Option<super::pg::Pg>,
}

impl Place {
    /// `None` (after saying why) when the backend is not available here.
    pub async fn new(backend: Backend) -> Option<Place> {
        let dir = tempfile::tempdir().unwrap();
        match backend {
            Backend::Redb => Some(Place {
                backend,
                dir,
                #[cfg(feature = "postgres")]
                pg: None,
            }),
            #[cfg(feature = "postgres")]
            Backend::Postgres => {
                let pg = super::pg::fresh().await?;
                Some(Place {
                    backend,
                    dir,
                    pg: Some(pg),
                })
            }
            #[cfg(not(feature = "postgres"))]
            Backend::Postgres => {
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED: built without the `postgres` feature"
                );
                None
            }
        }
    }

    /// A builder over this place's store `name`: the redb file `name.redb`, or on PostgreSQL
    /// the test's schema as node `a` (every runtime of a test is the same node, so a restart
    /// resumes its tasks as on redb).
    pub async fn builder(&self, name: &str) -> RuntimeBuilder {
        #[cfg(feature = "postgres")]
        if let Some(pg) = &self.pg {
            let store = mcp_tasks::store::Store::postgres(
                &pg.url,
                pg.options("a", std::time::Duration::from_secs(15)),
            )
            .await
            .expect("open the PostgreSQL store");
            return Runtime::builder_with_store(store);
        }
        Runtime::builder(self.dir.path().join(format!("{name}.redb")))
    }

    /// Drops the PostgreSQL schema (nothing to do on redb: the directory goes with `self`).
    pub async fn finish(self) {
        #[cfg(feature = "postgres")]
        if let Some(pg) = self.pg {
            pg.drop().await;
        }
    }
}

/// `async fn name(backend: Backend) { … }` becomes the tests `name::redb` and
/// `name::postgres` (`#[tokio::test]`s on two worker threads, so the calling crate needs
/// `tokio` with its `macros` feature).
#[macro_export]
macro_rules! on_both_stores {
    ($(#[$meta:meta])* async fn $name:ident($backend:ident: Backend) $body:block) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            $(#[$meta])*
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redb() {
                body($crate::support::backend::Backend::Redb).await
            }

            $(#[$meta])*
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                body($crate::support::backend::Backend::Postgres).await
            }

            async fn body($backend: $crate::support::backend::Backend) $body
        }
    };
}
