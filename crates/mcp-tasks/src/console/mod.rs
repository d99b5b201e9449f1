//! The operator console (feature `console`): every stored task at a glance, followed live and
//! acted on, in a browser.
//!
//! The protocol has no `tasks/list`: no client can enumerate tasks, so a view across all of
//! them is the server's. [`router`] (or [`Console::router`], to configure it) is an axum
//! [`Router`] an embedder nests where it likes (`serve --console-listen ADDR` serves it on an
//! address of its own). It serves:
//!
//! - pages with stable URLs — `/` (overview), `/tasks?status=…&tool=…` (the list; its filters
//!   are the query string), `/tasks/TASK_ID` (a task; 404 for one the viewer may not see) —
//!   one HTML shell and a script without a build step, embedded in the binary (`assets/`);
//! - the JSON API those pages read (`/api/…`, docs/CONSOLE.md), from the store's listing
//!   index ([`crate::store::listing`]): bounded work per request whatever the store holds;
//! - live updates as server-sent events (`/api/events`) fed by the runtime's committed
//!   changes (on a store shared by replicas, by the database's notifications of every node);
//! - with [`Console::actions`], cancelling a task, every task a filter matches, and purging
//!   finished tasks, each logged with the principal that did it.
//!
//! With an [`Authenticator`] the console asks for a token (a login form stores it in an
//! `HttpOnly`, `SameSite=Strict` cookie; an `Authorization` header works too), shows a
//! principal only its own tasks, and lets only a credential with the `admin` scope see every
//! tenant and act. Actions from a browser need the CSRF token of `/api/overview` in the
//! `X-Console-Csrf` header, and a cross-site `Origin` is refused. Every response carries a
//! Content-Security-Policy without inline scripts; the pages load nothing from elsewhere.

// Handlers answer refusals as ready-made responses (`Result<_, Response>`), as axum's own
// extractors do; the size of the error variant does not matter on this path.
#![allow(clippy::result_large_err)]

mod actions;
mod api;
mod assets;
mod live;
mod query;
mod viewer;

use std::sync::Arc;

use axum::Router;
use axum::routing::{delete, get, post};

use crate::auth::Authenticator;
use crate::runtime::{Runtime, RuntimeHandle};
use crate::shared::Shared;

/// The console of a runtime, to configure before [`Console::router`] builds its router.
#[derive(Clone)]
pub struct Console {
    handle: RuntimeHandle,
    authenticator: Option<Arc<dyn Authenticator>>,
    actions: bool,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console")
            .field("authenticated", &self.authenticator.is_some())
            .field("actions", &self.actions)
            .finish_non_exhaustive()
    }
}

impl Console {
    /// The console of `runtime`: read-only, without authentication (for a console only its
    /// operators can reach).
    pub fn new(runtime: &Runtime) -> Console {
        Console::for_handle(runtime.handle())
    }

    /// The console of the runtime behind `handle`.
    pub fn for_handle(handle: RuntimeHandle) -> Console {
        Console {
            handle,
            authenticator: None,
            actions: false,
        }
    }

    /// Asks every viewer for a credential `authenticator` accepts (the MCP endpoint's, say):
    /// a principal sees its own tasks only, one whose credential has the `admin` scope sees
    /// every tenant and may act.
    pub fn authenticator(mut self, authenticator: Arc<dyn Authenticator>) -> Console {
        self.authenticator = Some(authenticator);
        self
    }

    /// Enables the actions (cancel a task, cancel every task a filter matches, purge finished
    /// tasks); with an authenticator, for `admin` credentials only. Off by default.
    pub fn actions(mut self, enabled: bool) -> Console {
        self.actions = enabled;
        self
    }

    /// The console's router: nest it under any path (`Router::nest("/console", …)`) or serve
    /// it on an address of its own.
    pub fn router(self) -> Router {
        let shared = self.handle.shared().clone();
        let csrf_key = shared.request_state.derive_key("mcp-tasks console csrf");
        let state = Arc::new(ConsoleState {
            shared,
            handle: self.handle,
            authenticator: self.authenticator,
            actions: self.actions,
            csrf_key,
        });
        Router::new()
            .route("/", get(assets::page))
            .route("/tasks", get(assets::page))
            .route("/tasks/{id}", get(assets::task_page))
            .route("/assets/{file}", get(assets::asset))
            .route("/api/overview", get(api::overview))
            .route("/api/tasks", get(api::tasks))
            .route("/api/tasks/count", get(api::count))
            .route("/api/tasks/{id}", get(api::task))
            .route("/api/events", get(live::events))
            .route("/api/session", post(viewer::login))
            .route("/api/session", delete(viewer::logout))
            .route("/api/tasks/{id}/cancel", post(actions::cancel_one))
            .route("/api/cancel", post(actions::cancel_matching))
            .route("/api/purge", post(actions::purge))
            .fallback(assets::not_found)
            .layer(axum::middleware::map_response(assets::security_headers))
            .with_state(state)
    }
}

/// The console of `runtime`, read-only and without authentication: [`Console::new`] then
/// [`Console::router`].
pub fn router(runtime: &Runtime) -> Router {
    Console::new(runtime).router()
}

/// What every handler of one console shares.
pub(crate) struct ConsoleState {
    shared: Arc<Shared>,
    handle: RuntimeHandle,
    authenticator: Option<Arc<dyn Authenticator>>,
    actions: bool,
    csrf_key: Vec<u8>,
}

type AppState = Arc<ConsoleState>;
