//! The console's pages and assets: one HTML shell for every page (the script renders the page
//! its URL names), the script, the style sheet and the icon, embedded in the binary with
//! `include_bytes!` — written by hand, without a build step (docs/CONSOLE.md) — and the
//! security headers every console response carries.

use axum::extract::{OriginalUri, Path, State};
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::api::visible_record;
use super::guard::Caller;
use super::viewer;

const SHELL: &str = include_str!("assets/console.html");
const SCRIPT: &[u8] = include_bytes!("assets/console.js");
const STYLE: &[u8] = include_bytes!("assets/console.css");
const ICON: &[u8] = include_bytes!("assets/favicon.svg");

/// The Content-Security-Policy of every console response: scripts and styles from the console
/// itself only (no inline script, no `eval`), nothing from elsewhere.
pub(super) const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; \
    frame-ancestors 'none'";

/// Adds the security headers to every response.
pub(super) async fn security_headers(mut response: Response) -> Response {
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

/// The path the console is mounted at, ending in `/` (`/` when it is not nested): the
/// request's original path less the path the console's router saw.
pub(super) fn root(original: &Uri, inner: &Uri) -> String {
    let full = original.path();
    let own = inner.path();
    let prefix = if own != "/" && full.ends_with(own) {
        &full[..full.len() - own.len()]
    } else {
        full.trim_end_matches('/')
    };
    format!("{}/", prefix.trim_end_matches('/'))
}

/// `text` escaped for an HTML attribute.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('"', "&quot;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The shell with `status`.
fn shell(original: &Uri, inner: &Uri, status: StatusCode) -> Response {
    let html = SHELL
        .replace("{{ROOT}}", &escape(&root(original, inner)))
        .replace("{{STATUS}}", status.as_str());
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        html,
    )
        .into_response()
}

/// `GET /` and `GET /tasks`: the shell.
pub(super) async fn page(OriginalUri(original): OriginalUri, uri: Uri) -> Response {
    shell(&original, &uri, StatusCode::OK)
}

/// `GET /tasks/TASK_ID`: the shell, with 404 for a task the viewer may not see (a viewer
/// who must sign in first gets the shell: its login form leads back here).
pub(super) async fn task_page(
    State(state): State<AppState>,
    OriginalUri(original): OriginalUri,
    uri: Uri,
    caller: Caller,
    Path(id): Path<String>,
) -> Response {
    let status = match viewer::viewer(&state, &caller).await {
        Ok(viewer) => match visible_record(&state, &viewer, &id).await {
            Ok(Some(_)) => StatusCode::OK,
            Ok(None) => StatusCode::NOT_FOUND,
            Err(r) => return r,
        },
        Err(_) => StatusCode::OK,
    };
    shell(&original, &uri, status)
}

/// Any other path: the not-found page (JSON under `api/`).
pub(super) async fn not_found(OriginalUri(original): OriginalUri, uri: Uri) -> Response {
    if uri.path().starts_with("/api/") {
        return viewer::error(
            StatusCode::NOT_FOUND,
            "no such API route (docs/CONSOLE.md lists them)",
        );
    }
    shell(&original, &uri, StatusCode::NOT_FOUND)
}

/// `GET /assets/FILE`.
pub(super) async fn asset(Path(file): Path<String>) -> Response {
    let (body, kind): (&'static [u8], &str) = match file.as_str() {
        "console.js" => (SCRIPT, "text/javascript; charset=utf-8"),
        "console.css" => (STYLE, "text/css; charset=utf-8"),
        "favicon.svg" => (ICON, "image/svg+xml"),
        _ => return (StatusCode::NOT_FOUND, "no such asset").into_response(),
    };
    (
        [
            (header::CONTENT_TYPE, kind),
            // The assets change with the binary: revalidated, never stale after an upgrade.
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_is_where_the_console_is_mounted() {
        let u = |s: &str| s.parse::<Uri>().unwrap();
        assert_eq!(root(&u("/"), &u("/")), "/");
        assert_eq!(root(&u("/tasks"), &u("/tasks")), "/");
        assert_eq!(root(&u("/console/tasks/x"), &u("/tasks/x")), "/console/");
        assert_eq!(root(&u("/console/"), &u("/")), "/console/");
        assert_eq!(root(&u("/console"), &u("/")), "/console/");
        assert_eq!(escape("/a\"<"), "/a&quot;&lt;");
    }

    #[test]
    fn the_shell_loads_only_its_own_assets() {
        assert!(SHELL.contains("{{ROOT}}assets/console.js"));
        assert!(!SHELL.contains("<script>"), "no inline script");
        assert!(!SHELL.contains("style="), "no inline style");
        assert!(!SHELL.contains("http://") && !SHELL.contains("https://"));
    }
}
