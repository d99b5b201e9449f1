//! Who is looking: the console's authentication (the runtime's [`Authenticator`], through an
//! `Authorization` header or a sign-in session's cookie), the endpoint's scope policy, what a
//! viewer may see, and the CSRF check of actions.

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::Sha256;

use super::guard::{Caller, Client};
use super::session::{self, SessionId};
use super::{AppState, ConsoleState};
use crate::auth::{Access, AuthError, Identity};
use crate::store::owner_key;
use crate::task::Owner;

/// The session cookie's name.
const COOKIE: &str = "mcp_tasks_console";
/// Its name when it is `Secure` and the console is served at `/` (browsers then refuse to let
/// any other path or subdomain set or shadow it).
const HOST_COOKIE: &str = "__Host-mcp_tasks_console";
/// The header an action from a browser carries its CSRF token in.
pub(super) const CSRF_HEADER: &str = "x-console-csrf";
/// The scope that sees every tenant and may act.
pub(super) const ADMIN_SCOPE: &str = "admin";

/// Who is looking.
#[derive(Debug, Clone)]
pub(super) struct Viewer {
    /// `None`: the console has no authentication (everyone sees everything).
    pub(super) identity: Option<Identity>,
    /// What the endpoint's scope policy lets the credential do.
    access: Access,
    /// The credential came with a session cookie (a browser: actions need the CSRF token).
    pub(super) by_cookie: bool,
    /// What the CSRF token is bound to: the session, or the `Authorization` value; empty
    /// without authentication.
    csrf_basis: Vec<u8>,
}

impl Viewer {
    /// Whether the viewer sees every tenant.
    pub(super) fn admin(&self) -> bool {
        self.identity
            .as_ref()
            .is_none_or(|i| i.scopes.contains(ADMIN_SCOPE))
    }

    /// Whether the viewer's credential may change tasks (not a read-only one).
    pub(super) fn may_write(&self) -> bool {
        self.access == Access::Full
    }

    /// The owner key the viewer is restricted to; `None` for an admin.
    pub(super) fn scope(&self) -> Option<String> {
        match &self.identity {
            Some(i) if !self.admin() => Some(owner_key(&i.owner.tenant, &i.owner.principal)),
            _ => None,
        }
    }

    /// Whether the viewer may see a task of `owner`.
    pub(super) fn may_see(&self, owner: &Owner) -> bool {
        match &self.identity {
            Some(i) if !self.admin() => i.owner.same_as(owner),
            _ => true,
        }
    }

    /// Whether the viewer may see a task of the owner key `key`.
    pub(super) fn may_see_key(&self, key: &str) -> bool {
        self.scope().is_none_or(|own| own == key)
    }

    /// The key its open event streams are counted under.
    pub(super) fn stream_key(&self) -> String {
        match &self.identity {
            Some(i) => owner_key(&i.owner.tenant, &i.owner.principal),
            None => String::new(),
        }
    }

    /// The principal actions are logged with.
    pub(super) fn principal(&self) -> String {
        match &self.identity {
            Some(i) => format!("{}/{}", i.owner.tenant, i.owner.principal),
            None => "(console without authentication)".to_owned(),
        }
    }

    /// The viewer as `/api/overview` shows it.
    pub(super) fn json(&self) -> serde_json::Value {
        match &self.identity {
            Some(i) => json!({
                "tenant": i.owner.tenant,
                "principal": i.owner.principal,
                "admin": self.admin(),
                "readOnly": !self.may_write(),
            }),
            None => serde_json::Value::Null,
        }
    }

    /// The CSRF token of this viewer's session or credential.
    pub(super) fn csrf(&self, state: &ConsoleState) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&state.csrf_key)
            .expect("HMAC accepts keys of any length");
        mac.update(&self.csrf_basis);
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
    }
}

/// A JSON error response.
pub(super) fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into() }))).into_response()
}

/// The viewer of a request, or the refusal: `401` that asks for a credential, `403` for a
/// credential the endpoint's scope policy refuses, `429` for a throttled address or principal.
pub(super) async fn viewer(state: &ConsoleState, caller: &Caller) -> Result<Viewer, Response> {
    let Some(auth) = &state.settings.authenticator else {
        return Ok(Viewer {
            identity: None,
            access: Access::Full,
            by_cookie: false,
            csrf_basis: Vec::new(),
        });
    };
    let headers = &caller.headers;
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        let credential = value.to_str().unwrap_or_default().to_owned();
        let identity = checked(state, &caller.client, auth.as_ref(), &credential).await?;
        let access = policy(state, &identity)?;
        return Ok(Viewer {
            identity: Some(identity),
            access,
            by_cookie: false,
            csrf_basis: credential.into_bytes(),
        });
    }
    let Some(id) = cookie(headers).and_then(|c| SessionId::parse(&c)) else {
        return Err(login_required("sign in with a token"));
    };
    let now = state.shared.now_ms();
    let credential =
        match session::resume(&state.shared.store, &state.settings.sessions, &id, now).await {
            Ok(credential) => credential,
            Err(session::Ended::Unavailable(why)) => {
                tracing::warn!(error = %why, "console: sessions cannot be read");
                return Err(error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "sessions cannot be read right now",
                ));
            }
            Err(ended) => {
                crate::telemetry::auth_failure("console", "session");
                let why = match ended {
                    session::Ended::Expired => "the session expired: sign in again",
                    _ => "the session ended: sign in again",
                };
                return Err(login_required(why));
            }
        };
    let identity = match authenticate(auth.as_ref(), &credential).await {
        Ok(identity) => identity,
        Err(why) => {
            // Revoked or expired since the login: the session ends with it.
            session::end(&state.shared.store, &id).await;
            crate::telemetry::auth_failure("console", "session");
            tracing::info!(reason = %why, "console: a session's credential is no longer accepted; it ended");
            return Err(login_required(
                "the credential of this session is no longer accepted: sign in again",
            ));
        }
    };
    let access = match policy(state, &identity) {
        Ok(access) => access,
        Err(refused) => {
            session::end(&state.shared.store, &id).await;
            return Err(refused);
        }
    };
    Ok(Viewer {
        identity: Some(identity),
        access,
        by_cookie: true,
        csrf_basis: id.bind(&state.csrf_key),
    })
}

/// The identity of `credential` (an `Authorization` value), throttled: `429` unchecked for an
/// address or claimed principal with too many refused credentials; a refusal counts.
async fn checked(
    state: &ConsoleState,
    client: &Client,
    auth: &dyn crate::auth::Authenticator,
    credential: &str,
) -> Result<Identity, Response> {
    let claimed = crate::auth::claimed_principal(credential);
    if let Err(retry_after) = state.throttle.check(client.address, claimed.as_deref()) {
        crate::telemetry::auth_failure("console", "throttled");
        tracing::info!(address = ?client.address, claimed = ?claimed,
            "console: refused: too many refused credentials from this address or for this principal");
        return Err(throttled(retry_after));
    }
    match authenticate(auth, credential).await {
        Ok(identity) => Ok(identity),
        Err(why) => {
            if matches!(why, AuthError::InvalidToken(_) | AuthError::Missing) {
                state.throttle.failed(client.address, claimed.as_deref());
                crate::telemetry::auth_failure("console", "invalid_token");
            }
            tracing::info!(reason = %why, address = ?client.address, claimed = ?claimed,
                "console: credential refused");
            Err(match why {
                AuthError::Unavailable(_) => {
                    error(StatusCode::SERVICE_UNAVAILABLE, why.to_string())
                }
                _ => login_required(format!("the credential was refused: {why}")),
            })
        }
    }
}

/// The endpoint's scope policy ([`Identity::access`]): `403` for a credential it refuses.
fn policy(state: &ConsoleState, identity: &Identity) -> Result<Access, Response> {
    identity
        .access(&state.settings.required_scopes)
        .map_err(|why| {
            crate::telemetry::auth_failure("console", "insufficient_scope");
            tracing::info!(tenant = %identity.owner.tenant, principal = %identity.owner.principal,
            reason = %why, "console: credential refused by the scope policy");
            error(
                StatusCode::FORBIDDEN,
                format!("the MCP endpoint refuses this credential, so does the console: {why}"),
            )
        })
}

/// `429` with `Retry-After` for a throttled address or principal.
fn throttled(retry_after: std::time::Duration) -> Response {
    let mut response = error(
        StatusCode::TOO_MANY_REQUESTS,
        format!(
            "too many refused credentials from this address or for this principal: retry in {} s",
            retry_after.as_secs()
        ),
    );
    if let Ok(value) = HeaderValue::from_str(&retry_after.as_secs().to_string()) {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
}

/// The 401 of a request without an accepted credential.
fn login_required(message: impl Into<String>) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        Json(json!({ "error": message.into(), "login": true })),
    )
        .into_response()
}

/// Asks the authenticator about `authorization` (an `Authorization` header's value).
async fn authenticate(
    auth: &dyn crate::auth::Authenticator,
    authorization: &str,
) -> Result<Identity, AuthError> {
    let value = HeaderValue::from_str(authorization)
        .map_err(|_| AuthError::InvalidToken("a malformed credential".to_owned()))?;
    let (parts, ()) = Request::builder()
        .method(Method::GET)
        .uri("/")
        .header(header::AUTHORIZATION, value)
        .body(())
        .map_err(|e| AuthError::InvalidToken(e.to_string()))?
        .into_parts();
    auth.authenticate(&parts).await
}

/// The session cookie's value (either name).
fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE || *name == HOST_COOKIE)
        .map(|(_, value)| value.to_owned())
        .filter(|v| !v.is_empty())
}

/// The `Set-Cookie` value of the session cookie for `client`: `value` for `max_age` seconds
/// (0 forgets it), scoped to the console's path, `HttpOnly`, `SameSite=Strict`, and `Secure`
/// (named `__Host-…` at `/`) when the request came over https.
fn set_cookie(client: &Client, value: &str, max_age: u64) -> Option<HeaderValue> {
    let name = if client.https && client.root == "/" {
        HOST_COOKIE
    } else {
        COOKIE
    };
    let secure = if client.https { "; Secure" } else { "" };
    // The path without its trailing `/` (a browser sends the cookie to `/console` and below).
    let path = match client.root.trim_end_matches('/') {
        "" => "/",
        p => p,
    };
    HeaderValue::from_str(&format!(
        "{name}={value}; Path={path}; Max-Age={max_age}; HttpOnly; SameSite=Strict{secure}"
    ))
    .ok()
}

/// Refuses an action the viewer may not take: without actions enabled, without the `admin`
/// scope, from another site, or from a browser without the CSRF token.
pub(super) fn may_act(
    state: &ConsoleState,
    viewer: &Viewer,
    headers: &HeaderMap,
) -> Result<(), Response> {
    if !state.settings.actions {
        return Err(error(
            StatusCode::FORBIDDEN,
            "actions are disabled on this console (serve --console-actions enables them)",
        ));
    }
    if !viewer.admin() {
        return Err(error(
            StatusCode::FORBIDDEN,
            "actions need a credential with the `admin` scope",
        ));
    }
    if !viewer.may_write() {
        return Err(error(
            StatusCode::FORBIDDEN,
            "a read-only credential (`tasks:read`) never acts, whatever else it carries",
        ));
    }
    same_origin(headers)?;
    // A browser sends ambient credentials (the cookie; or none at all without authentication):
    // it must prove it read the token from a page of this console.
    if viewer.by_cookie || viewer.identity.is_none() {
        let sent = headers
            .get(CSRF_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let expected = viewer.csrf(state);
        let ok = sent.len() == expected.len()
            && sent
                .bytes()
                .zip(expected.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if !ok {
            return Err(error(
                StatusCode::FORBIDDEN,
                "missing or wrong CSRF token (X-Console-Csrf): reload the page",
            ));
        }
    }
    Ok(())
}

/// Refuses a request a browser sent from another site (`Origin` not this host,
/// `Sec-Fetch-Site: cross-site`).
fn same_origin(headers: &HeaderMap) -> Result<(), Response> {
    let refuse = || error(StatusCode::FORBIDDEN, "cross-site requests are refused");
    if headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|s| s == "cross-site")
    {
        return Err(refuse());
    }
    if let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        let host = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let bare = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .unwrap_or("");
        if origin == "null" || bare != host {
            return Err(refuse());
        }
    }
    Ok(())
}

/// `POST api/session` `{"token": "…"}`: checks the token (throttled), then opens a session
/// and sets its cookie.
pub(super) async fn login(State(state): State<AppState>, caller: Caller, body: Bytes) -> Response {
    let Some(auth) = &state.settings.authenticator else {
        return error(StatusCode::NOT_FOUND, "this console has no authentication");
    };
    if let Err(refused) = same_origin(&caller.headers) {
        return refused;
    }
    let token = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| {
            v.get("token")
                .and_then(|t| t.as_str())
                .map(|t| t.trim().to_owned())
        })
        .unwrap_or_default();
    let valid =
        !token.is_empty() && token.len() <= 8192 && token.bytes().all(|b| b.is_ascii_graphic());
    if !valid {
        return error(
            StatusCode::BAD_REQUEST,
            "send {\"token\": \"…\"} with a bearer token or JWT",
        );
    }
    let credential = format!("Bearer {token}");
    let identity = match checked(&state, &caller.client, auth.as_ref(), &credential).await {
        Ok(identity) => identity,
        Err(refused) => return refused,
    };
    if let Err(refused) = policy(&state, &identity) {
        return refused;
    }
    let now = state.shared.now_ms();
    // Each login sweeps one page of ended sessions: the table stays as large as the sessions
    // in use.
    let after = ConsoleState::lock(&state.sweep_after).take();
    let next = session::sweep(&state.shared.store, &state.settings.sessions, after, now).await;
    *ConsoleState::lock(&state.sweep_after) = next;
    let id = match session::create(
        &state.shared.store,
        &state.settings.sessions,
        &credential,
        now,
    )
    .await
    {
        Ok(id) => id,
        Err(why) => {
            tracing::warn!(error = %why, "console: a session could not be opened");
            return error(StatusCode::SERVICE_UNAVAILABLE, why);
        }
    };
    tracing::info!(tenant = %identity.owner.tenant, principal = %identity.owner.principal,
        "console: signed in");
    let mut response = StatusCode::NO_CONTENT.into_response();
    if let Some(value) = set_cookie(
        &caller.client,
        &id.cookie_value(),
        state.settings.sessions.ttl.as_secs(),
    ) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

/// `DELETE api/session`: ends the session and forgets its cookie.
pub(super) async fn logout(State(state): State<AppState>, caller: Caller) -> Response {
    if let Err(refused) = same_origin(&caller.headers) {
        return refused;
    }
    if let Some(id) = cookie(&caller.headers).and_then(|c| SessionId::parse(&c)) {
        session::end(&state.shared.store, &id).await;
        tracing::info!("console: signed out");
    }
    let mut response = StatusCode::NO_CONTENT.into_response();
    if let Some(value) = set_cookie(&caller.client, "", 0) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cookie_is_found_among_others() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; mcp_tasks_console=tok; b=2"),
        );
        assert_eq!(cookie(&h).as_deref(), Some("tok"));
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("mcp_tasks_console="),
        );
        assert_eq!(cookie(&h), None);
    }

    #[test]
    fn another_origin_is_refused() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:9"));
        assert!(same_origin(&h).is_ok());
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:9"),
        );
        assert!(same_origin(&h).is_ok());
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        assert!(same_origin(&h).is_err());
        h.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(same_origin(&h).is_err());
        let mut h = HeaderMap::new();
        h.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(same_origin(&h).is_err());
    }
}
