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
//! With an [`Authenticator`] the console asks for a credential (a login form opens a
//! server-side session whose id an `HttpOnly`, `SameSite=Strict` cookie carries; an
//! `Authorization` header works too), applies the MCP endpoint's scope policy
//! ([`Console::required_scopes`]: a credential the endpoint refuses gets nothing here, a
//! read-only one never acts), shows a principal only its own tasks, and lets only a credential
//! with the `admin` scope see every tenant and act. Refused credentials are throttled per
//! address and claimed principal. Like the endpoint, it answers only the `Host` names and
//! `Origin`s it is told to (loopback names by default): a page on another name — a DNS
//! rebinding — is refused before any handler runs. Actions from a browser need the CSRF token
//! of `/api/overview` in the `X-Console-Csrf` header, and a cross-site `Origin` is refused.
//! Every response carries a Content-Security-Policy without inline scripts; the pages load
//! nothing from elsewhere. docs/CONSOLE.md ("Security") has the threat model and the tests
//! behind each defence.

// Handlers answer refusals as ready-made responses (`Result<_, Response>`), as axum's own
// extractors do; the size of the error variant does not matter on this path.
#![allow(clippy::result_large_err)]

mod actions;
mod api;
mod assets;
mod guard;
mod live;
mod query;
mod session;
mod viewer;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::middleware::from_fn_with_state;
use axum::routing::{delete, get, post};

use crate::auth::{Authenticator, FailureThrottle};
use crate::runtime::{Runtime, RuntimeHandle};
use crate::shared::Shared;

pub use session::SessionPolicy;

/// The console of a runtime, to configure before [`Console::router`] builds its router.
#[derive(Clone)]
pub struct Console {
    handle: RuntimeHandle,
    settings: Settings,
}

/// What [`Console`]'s builder methods set; the router's state keeps it as it is.
#[derive(Clone)]
struct Settings {
    authenticator: Option<Arc<dyn Authenticator>>,
    actions: bool,
    allowed_hosts: Vec<String>,
    allowed_origins: Vec<String>,
    required_scopes: Vec<String>,
    sessions: SessionPolicy,
    secure_cookies: bool,
    trusted_proxies: Vec<IpAddr>,
    max_streams_per_principal: usize,
    max_login_failures: u32,
    login_failure_window: Duration,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.settings;
        f.debug_struct("Console")
            .field("authenticated", &s.authenticator.is_some())
            .field("actions", &s.actions)
            .field("allowed_hosts", &s.allowed_hosts)
            .field("allowed_origins", &s.allowed_origins)
            .field("required_scopes", &s.required_scopes)
            .field("sessions", &s.sessions)
            .field("secure_cookies", &s.secure_cookies)
            .field("trusted_proxies", &s.trusted_proxies)
            .field("max_streams_per_principal", &s.max_streams_per_principal)
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
            settings: Settings {
                authenticator: None,
                actions: false,
                allowed_hosts: Vec::new(),
                allowed_origins: Vec::new(),
                required_scopes: Vec::new(),
                sessions: SessionPolicy::default(),
                secure_cookies: false,
                trusted_proxies: Vec::new(),
                max_streams_per_principal: 16,
                max_login_failures: 10,
                login_failure_window: Duration::from_secs(60),
            },
        }
    }

    /// Asks every viewer for a credential `authenticator` accepts (the MCP endpoint's, say):
    /// a principal sees its own tasks only, one whose credential has the `admin` scope sees
    /// every tenant and may act.
    pub fn authenticator(mut self, authenticator: Arc<dyn Authenticator>) -> Console {
        self.settings.authenticator = Some(authenticator);
        self
    }

    /// Enables the actions (cancel a task, cancel every task a filter matches, purge finished
    /// tasks); with an authenticator, for `admin` credentials only. Off by default.
    pub fn actions(mut self, enabled: bool) -> Console {
        self.settings.actions = enabled;
        self
    }

    /// Answers one more `Host` name besides the loopback names (`localhost`, `127.0.0.1`,
    /// `[::1]`, any port): `name` for any port, `name:port`, or `*` for every host (behind a
    /// proxy that checks it). Any other `Host` is `403` before any handler runs, as on the MCP
    /// endpoint ([`crate::transport::http::HttpConfig::allowed_hosts`]).
    pub fn allow_host(mut self, host: impl Into<String>) -> Console {
        self.settings.allowed_hosts.push(host.into());
        self
    }

    /// Answers requests from one more `Origin` besides loopback ones (`https://ops.example`;
    /// `*` for all).
    pub fn allow_origin(mut self, origin: impl Into<String>) -> Console {
        self.settings.allowed_origins.push(origin.into());
        self
    }

    /// The scopes the MCP endpoint requires ([`crate::auth::ProtectedResource::scopes`]): a
    /// credential lacking one of them is refused here too, unless it carries
    /// [`crate::auth::READ_ONLY_SCOPE`], which may look but never act
    /// ([`crate::auth::Identity::access`]).
    pub fn required_scopes(
        mut self,
        scopes: impl IntoIterator<Item = impl Into<String>>,
    ) -> Console {
        self.settings.required_scopes = scopes.into_iter().map(Into::into).collect();
        self
    }

    /// How long sign-in sessions last (default 12 h, 30 min idle).
    pub fn sessions(mut self, policy: SessionPolicy) -> Console {
        self.settings.sessions = policy;
        self
    }

    /// Marks the session cookie `Secure` (and names it `__Host-…` when the console is served
    /// at `/`) on every response: for a console reached over https only. Without it, the
    /// cookie is `Secure` when a [trusted proxy](Console::trusted_proxy) says the request came
    /// over https (`X-Forwarded-Proto: https`).
    pub fn secure_cookies(mut self, secure: bool) -> Console {
        self.settings.secure_cookies = secure;
        self
    }

    /// Trusts the proxy at `address`: its `X-Forwarded-Proto` and `X-Forwarded-For` say how and
    /// from where a request came (for the cookie's `Secure` and the login throttle). Headers
    /// from any other peer are ignored.
    pub fn trusted_proxy(mut self, address: IpAddr) -> Console {
        self.settings.trusted_proxies.push(address);
        self
    }

    /// The most live event streams (`/api/events`) one principal may hold open (default 16;
    /// `429` beyond).
    pub fn max_streams_per_principal(mut self, n: usize) -> Console {
        self.settings.max_streams_per_principal = n;
        self
    }

    /// Throttles refused logins and credentials: `max_failures` per address or claimed
    /// principal within `window`, then `429` until the window passes (default 10 a minute; 0
    /// turns it off).
    pub fn login_throttle(mut self, max_failures: u32, window: Duration) -> Console {
        self.settings.max_login_failures = max_failures;
        self.settings.login_failure_window = window;
        self
    }

    /// The console's router: nest it under any path (`Router::nest("/console", …)`) or serve
    /// it on an address of its own.
    pub fn router(self) -> Router {
        let shared = self.handle.shared().clone();
        let csrf_key = shared.request_state.derive_key("mcp-tasks console csrf");
        let settings = self.settings;
        let state = Arc::new(ConsoleState {
            shared,
            handle: self.handle,
            csrf_key,
            throttle: FailureThrottle::new(
                settings.max_login_failures,
                settings.login_failure_window,
            ),
            settings,
            streams: Mutex::new(HashMap::new()),
            follower: Mutex::new(None),
            sweep_after: Mutex::new(None),
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
            .layer(from_fn_with_state(
                state.clone(),
                guard::check_host_and_origin,
            ))
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
    settings: Settings,
    csrf_key: Vec<u8>,
    /// Refused logins and credentials per address and claimed principal.
    throttle: FailureThrottle,
    /// Open event streams per principal (owner key; `""` without authentication).
    streams: Mutex<HashMap<String, usize>>,
    /// On a store shared by replicas: the one reader of every node's commits that feeds
    /// this console's event streams (started with the first stream, ended after the last).
    follower: Mutex<Option<live::Follower>>,
    /// Where the next sweep of ended sessions carries on.
    sweep_after: Mutex<Option<String>>,
}

impl ConsoleState {
    fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        mutex.lock().unwrap_or_else(|e| e.into_inner())
    }
}

type AppState = Arc<ConsoleState>;
