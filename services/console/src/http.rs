//! The console's HTTP side: the router, the access check in front of every page (token as
//! bearer or session), `/login` and the embedded assets.

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde::Deserialize;

use crate::access::SESSION_COOKIE;
use crate::pages;
use crate::state::{AppState, html};
use crate::{actions, breakers, bulk, editor, handlers, history, queues, retry};

/// Every route of the console.
pub(crate) fn router(state: AppState) -> Router {
    let guarded = Router::new()
        .route("/", get(handlers::overview))
        .route("/tasks", get(handlers::tasks))
        .route("/tasks/new", get(editor::new_page).post(editor::create))
        .route("/tasks/{namespace}/{id}", get(handlers::task))
        .route("/tasks/{namespace}/{id}/edit", get(editor::edit_page).post(editor::save))
        .route("/tasks/{namespace}/{id}/{action}", post(actions::task))
        .route("/backfills/{backfill}/cancel", post(actions::backfill_cancel))
        .route("/runs", get(history::runs))
        .route("/runs/{execution}", get(handlers::run))
        .route("/runs/{execution}/cancel", post(actions::run_cancel))
        .route("/runs/{execution}/retry", post(retry::retry))
        .route("/dlq", get(handlers::dlq))
        .route("/dlq/bulk", get(bulk::confirm))
        .route("/dlq/bulk/{action}", post(bulk::act))
        .route("/dlq/{sequence}", get(handlers::dlq_entry))
        .route("/dlq/{sequence}/{action}", post(actions::dlq))
        .route("/breakers", get(breakers::list))
        .route("/breakers/{key}", get(breakers::breaker))
        .route("/breakers/{key}/reset", post(breakers::reset))
        .route("/queues", get(queues::list))
        .route("/queues/{queue}/{action}", post(queues::act))
        .route("/events", get(handlers::events))
        .route("/events/stream", get(handlers::event_stream))
        .route_layer(middleware::from_fn_with_state(state.clone(), guard));
    Router::new()
        .merge(guarded)
        .route("/login", get(login_page).post(login))
        .route("/assets/{file}", get(asset))
        .fallback(|| async {
            html(StatusCode::NOT_FOUND, pages::problem("Not found", &["No such page.".into()]))
        })
        .with_state(state)
}

/// Lets a request through when the console needs no token or the request carries it (bearer
/// or session); otherwise 401 with the sign-in form.
async fn guard(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if state.access.allows(request.headers()) {
        return next.run(request).await;
    }
    let next_path = request.uri().path_and_query().map(|p| p.as_str().to_string()).unwrap_or_default();
    let mut response = html(StatusCode::UNAUTHORIZED, pages::login(false, &safe_next(&next_path)));
    response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// A local path to go back to after signing in (never another site).
fn safe_next(next: &str) -> String {
    if next.starts_with('/') && !next.starts_with("//") && !next.contains('\\') {
        next.to_string()
    } else {
        "/".to_string()
    }
}

#[derive(Deserialize)]
struct LoginQuery {
    #[serde(default)]
    next: String,
}

async fn login_page(axum::extract::Query(query): axum::extract::Query<LoginQuery>) -> Response {
    html(StatusCode::OK, pages::login(false, &safe_next(&query.next)))
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
    #[serde(default)]
    next: String,
}

/// Checks the token and sets the session cookie (HttpOnly, SameSite=Strict).
async fn login(State(state): State<AppState>, axum::Form(form): axum::Form<LoginForm>) -> Response {
    if !state.access.token_ok(&form.token) {
        return html(StatusCode::UNAUTHORIZED, pages::login(true, &safe_next(&form.next)));
    }
    let session = state.access.open_session();
    let cookie = format!("{SESSION_COOKIE}={session}; Path=/; HttpOnly; SameSite=Strict");
    let mut response = Redirect::to(&safe_next(&form.next)).into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

/// Assets embedded in the binary: htmx (pinned, with its licence), the stylesheet and the
/// small live-events script.
const ASSETS: [(&str, &str, &[u8]); 4] = [
    ("htmx-2.0.4.min.js", "text/javascript", include_bytes!("../assets/htmx-2.0.4.min.js")),
    ("htmx-LICENSE", "text/plain; charset=utf-8", include_bytes!("../assets/htmx-LICENSE")),
    ("console.css", "text/css", include_bytes!("../assets/console.css")),
    ("console.js", "text/javascript", include_bytes!("../assets/console.js")),
];

async fn asset(Path(file): Path<String>) -> Response {
    match ASSETS.iter().find(|(name, _, _)| *name == file) {
        Some((_, content_type, bytes)) => (
            [(header::CONTENT_TYPE, *content_type), (header::CACHE_CONTROL, "public, max-age=3600")],
            Body::from(*bytes),
        )
            .into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_in_returns_only_to_local_paths() {
        assert_eq!(safe_next("/tasks?q=x"), "/tasks?q=x");
        assert_eq!(safe_next("//evil.example"), "/");
        assert_eq!(safe_next("https://evil.example"), "/");
        assert_eq!(safe_next("/\\evil"), "/");
    }
}
