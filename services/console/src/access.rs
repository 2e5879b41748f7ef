//! Who may look and who may act: the auth token (as `Authorization: Bearer` or through a
//! session cookie set by `/login`) and the CSRF token every action's form carries.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, header};

/// Name of the session cookie `/login` sets.
pub(crate) const SESSION_COOKIE: &str = "jetsched_console_session";
/// Sessions kept at most (the oldest is forgotten first: its holder logs in again).
const MAX_SESSIONS: usize = 10_000;

/// The console's access rules; cheap to clone.
#[derive(Clone)]
pub(crate) struct Access {
    token: Option<Arc<str>>,
    sessions: Arc<Mutex<Sessions>>,
    /// Random per process: a page's forms carry it; a POST without it is refused.
    csrf: Arc<str>,
    pub(crate) allow_actions: bool,
}

#[derive(Default)]
struct Sessions {
    ids: HashSet<String>,
    order: std::collections::VecDeque<String>,
}

impl Access {
    pub(crate) fn new(token: Option<String>, allow_actions: bool) -> Access {
        Access {
            token: token.map(Arc::from),
            sessions: Arc::default(),
            csrf: Arc::from(uuid::Uuid::new_v4().simple().to_string()),
            allow_actions,
        }
    }

    /// The CSRF token the pages put in their forms.
    pub(crate) fn csrf(&self) -> &str {
        &self.csrf
    }

    pub(crate) fn csrf_ok(&self, given: &str) -> bool {
        constant_time_eq(given.as_bytes(), self.csrf.as_bytes())
    }

    /// Whether the token given at `/login` is the right one.
    pub(crate) fn token_ok(&self, given: &str) -> bool {
        self.token.as_deref().is_some_and(|token| constant_time_eq(given.trim().as_bytes(), token.as_bytes()))
    }

    /// A new session after a successful login: the cookie's value.
    pub(crate) fn open_session(&self) -> String {
        let id = format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
        let mut sessions = self.sessions.lock().expect("sessions lock");
        if sessions.order.len() == MAX_SESSIONS
            && let Some(oldest) = sessions.order.pop_front()
        {
            sessions.ids.remove(&oldest);
        }
        sessions.ids.insert(id.clone());
        sessions.order.push_back(id.clone());
        id
    }

    /// Whether a request may see the console: no token configured, the bearer token, or a
    /// session opened by `/login`.
    pub(crate) fn allows(&self, headers: &HeaderMap) -> bool {
        let Some(token) = self.token.as_deref() else { return true };
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if bearer.is_some_and(|given| constant_time_eq(given.trim().as_bytes(), token.as_bytes())) {
            return true;
        }
        match cookie(headers, SESSION_COOKIE) {
            Some(session) => self.sessions.lock().expect("sessions lock").ids.contains(session),
            None => false,
        }
    }
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub(crate) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// Compares without stopping at the first difference, so timing tells nothing of the token.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(name.clone(), value.parse().unwrap());
        }
        map
    }

    #[test]
    fn without_a_token_everyone_may_look() {
        let access = Access::new(None, false);
        assert!(access.allows(&HeaderMap::new()));
        assert!(!access.token_ok(""));
    }

    #[test]
    fn a_token_is_needed_as_bearer_or_session() {
        let access = Access::new(Some("s3cret".into()), true);
        assert!(!access.allows(&HeaderMap::new()));
        assert!(access.allows(&headers(&[(header::AUTHORIZATION, "Bearer s3cret")])));
        assert!(!access.allows(&headers(&[(header::AUTHORIZATION, "Bearer s3cre")])));
        assert!(!access.allows(&headers(&[(header::COOKIE, "jetsched_console_session=forged")])));
        let session = access.open_session();
        let cookie = format!("theme=dark; {SESSION_COOKIE}={session}");
        assert!(access.allows(&headers(&[(header::COOKIE, &cookie)])));
        assert!(access.token_ok(" s3cret\n") && !access.token_ok("nope"));
    }

    #[test]
    fn csrf_tokens_differ_per_process_and_are_checked() {
        let (a, b) = (Access::new(None, true), Access::new(None, true));
        assert_ne!(a.csrf(), b.csrf());
        assert!(a.csrf_ok(a.csrf()) && !a.csrf_ok(b.csrf()) && !a.csrf_ok(""));
    }
}
