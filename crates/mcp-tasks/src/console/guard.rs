//! What the console checks before any handler runs, and what it learns about the request's
//! client: the `Host` and `Origin` rules of the MCP endpoint (DNS-rebinding protection), the
//! client's address (the TCP peer, or what a trusted proxy says) and whether it came over
//! https.

use std::net::IpAddr;

use axum::extract::{FromRequestParts, OriginalUri, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::Response;

use super::{AppState, ConsoleState, viewer};
use crate::transport::http::{check_host, check_origin};

/// How a request reached the console.
#[derive(Debug, Clone, Default)]
pub(super) struct Client {
    /// The client's address (`None` when the server did not say).
    pub(super) address: Option<IpAddr>,
    /// The request came over https (by a trusted proxy's word, or the console always is).
    pub(super) https: bool,
    /// The path the console is mounted at, ending in `/`.
    pub(super) root: String,
}

/// A handler's view of its request: the headers and the [`Client`].
pub(super) struct Caller {
    pub(super) headers: HeaderMap,
    pub(super) client: Client,
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Caller, Self::Rejection> {
        Ok(Caller {
            headers: parts.headers.clone(),
            client: parts
                .extensions
                .get::<Client>()
                .cloned()
                .unwrap_or_default(),
        })
    }
}

/// DNS-rebinding protection (`403` for a `Host` or `Origin` the console does not answer),
/// then the [`Client`] into the request's extensions.
pub(super) async fn check_host_and_origin(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let checked = check_host(
        request.headers(),
        request.uri().authority(),
        &state.settings.allowed_hosts,
    )
    .and_then(|()| check_origin(request.headers(), &state.settings.allowed_origins));
    if let Err(why) = checked {
        tracing::info!(reason = %why, "console: request refused");
        crate::telemetry::refused(StatusCode::FORBIDDEN.as_u16());
        return viewer::error(StatusCode::FORBIDDEN, why);
    }
    let client = client(&state, &request);
    request.extensions_mut().insert(client);
    next.run(request).await
}

fn client(state: &ConsoleState, request: &Request) -> Client {
    let peer = request
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip());
    let trusted = peer.is_some_and(|p| state.settings.trusted_proxies.contains(&p));
    let headers = request.headers();
    let forwarded = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let mut address = peer;
    let mut https = state.settings.secure_cookies;
    if trusted {
        // The nearest address the proxies did not add themselves.
        if let Some(chain) = forwarded("x-forwarded-for") {
            address = chain
                .rsplit(',')
                .filter_map(|a| a.trim().parse::<IpAddr>().ok())
                .find(|a| !state.settings.trusted_proxies.contains(a))
                .or(address);
        }
        if forwarded("x-forwarded-proto").is_some_and(|p| {
            p.rsplit(',')
                .next()
                .is_some_and(|p| p.trim().eq_ignore_ascii_case("https"))
        }) {
            https = true;
        }
    }
    let root = match request.extensions().get::<OriginalUri>() {
        Some(OriginalUri(original)) => super::assets::root(original, request.uri()),
        None => "/".to_owned(),
    };
    Client {
        address,
        https,
        root,
    }
}
