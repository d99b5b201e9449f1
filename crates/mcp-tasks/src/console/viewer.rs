//! Who is looking: the console's authentication (the runtime's [`Authenticator`], through an
//! `Authorization` header or the login cookie), what a viewer may see, and the CSRF check of
//! actions.

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::Sha256;

use super::{AppState, ConsoleState};
use crate::auth::Identity;
use crate::store::owner_key;
use crate::task::Owner;

/// The login cookie's name.
const COOKIE: &str = "mcp_tasks_console";
/// The header an action from a browser carries its CSRF token in.
pub(super) const CSRF_HEADER: &str = "x-console-csrf";
/// The scope that sees every tenant and may act.
pub(super) const ADMIN_SCOPE: &str = "admin";

/// Who is looking.
#[derive(Debug, Clone)]
pub(super) struct Viewer {
    /// `None`: the console has no authentication (everyone sees everything).
    pub(super) identity: Option<Identity>,
    /// The credential came in the login cookie (a browser: actions need the CSRF token).
    pub(super) by_cookie: bool,
    /// The credential (for the CSRF token); empty without authentication.
    credential: String,
}

impl Viewer {
    /// Whether the viewer sees every tenant (and may act, when actions are on).
    pub(super) fn admin(&self) -> bool {
        self.identity
            .as_ref()
            .is_none_or(|i| i.scopes.contains(ADMIN_SCOPE))
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
            }),
            None => serde_json::Value::Null,
        }
    }

    /// The CSRF token of this viewer's credential.
    pub(super) fn csrf(&self, state: &ConsoleState) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&state.csrf_key)
            .expect("HMAC accepts keys of any length");
        mac.update(self.credential.as_bytes());
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
    }
}

/// A JSON error response.
pub(super) fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into() }))).into_response()
}

/// The viewer of a request, or the 401 that asks for a credential.
pub(super) async fn viewer(state: &ConsoleState, headers: &HeaderMap) -> Result<Viewer, Response> {
    let Some(auth) = &state.authenticator else {
        return Ok(Viewer {
            identity: None,
            by_cookie: false,
            credential: String::new(),
        });
    };
    let (credential, by_cookie) = match headers.get(header::AUTHORIZATION) {
        Some(value) => (value.to_str().unwrap_or_default().to_owned(), false),
        None => match cookie(headers) {
            Some(token) => (format!("Bearer {token}"), true),
            None => return Err(login_required("sign in with a token")),
        },
    };
    let identity = authenticate(auth.as_ref(), &credential)
        .await
        .map_err(|why| login_required(format!("the credential was refused: {why}")))?;
    Ok(Viewer {
        identity: Some(identity),
        by_cookie,
        credential,
    })
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
) -> Result<Identity, String> {
    let value =
        HeaderValue::from_str(authorization).map_err(|_| "a malformed credential".to_owned())?;
    let (parts, ()) = Request::builder()
        .method(Method::GET)
        .uri("/")
        .header(header::AUTHORIZATION, value)
        .body(())
        .map_err(|e| e.to_string())?
        .into_parts();
    auth.authenticate(&parts).await.map_err(|e| e.to_string())
}

/// The login cookie's value.
fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_owned())
        .filter(|v| !v.is_empty())
}

/// Refuses an action the viewer may not take: without actions enabled, without the `admin`
/// scope, from another site, or from a browser without the CSRF token.
pub(super) fn may_act(
    state: &ConsoleState,
    viewer: &Viewer,
    headers: &HeaderMap,
) -> Result<(), Response> {
    if !state.actions {
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

/// `POST api/session` `{"token": "…"}`: checks the token and sets the login cookie.
pub(super) async fn login(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(auth) = &state.authenticator else {
        return error(StatusCode::NOT_FOUND, "this console has no authentication");
    };
    if let Err(refused) = same_origin(&headers) {
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
    match authenticate(auth.as_ref(), &format!("Bearer {token}")).await {
        Ok(identity) => {
            tracing::info!(tenant = %identity.owner.tenant, principal = %identity.owner.principal,
                "console: signed in");
            let cookie = format!("{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict");
            let mut response = StatusCode::NO_CONTENT.into_response();
            if let Ok(value) = HeaderValue::from_str(&cookie) {
                response.headers_mut().insert(header::SET_COOKIE, value);
            }
            response
        }
        Err(why) => error(
            StatusCode::UNAUTHORIZED,
            format!("the token was refused: {why}"),
        ),
    }
}

/// `DELETE api/session`: forgets the login cookie.
pub(super) async fn logout() -> Response {
    let mut response = StatusCode::NO_CONTENT.into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static(
            "mcp_tasks_console=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0",
        ),
    );
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
