//! Logged-in sessions, held in the console's memory: a random id in an HttpOnly cookie, the
//! user and role it stands for, its CSRF token, and when it expires. A restart logs everyone
//! out; the console runs as one replica.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::RngCore;
use subtle::ConstantTimeEq;

use crate::users::Role;

/// The names of the console's cookies: the session's, and the login form's token. Sent with
/// `Secure`, each carries the `__Host-` prefix: a browser then takes it only from this host
/// over HTTPS, with `Path=/` and no `Domain`, so a page on a sibling subdomain cannot plant a
/// session or a login token of its choosing. Without `Secure` (plain HTTP on loopback) a
/// browser refuses the prefix, and the names go without it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CookieNames {
    /// The session cookie.
    pub session: &'static str,
    /// The login form's double-submit token.
    pub login: &'static str,
}

impl CookieNames {
    /// The names for cookies sent with `Secure` or without.
    pub fn new(secure: bool) -> Self {
        if secure {
            Self {
                session: "__Host-console_session",
                login: "__Host-console_login",
            }
        } else {
            Self {
                session: "console_session",
                login: "console_login",
            }
        }
    }
}

/// A logged-in user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// The user name.
    pub user: String,
    /// Their role.
    pub role: Role,
    /// The token every state-changing form of this session must carry.
    pub csrf_token: String,
    expires_at: Instant,
}

impl Session {
    /// True when `token` is this session's CSRF token (compared in constant time).
    pub fn csrf_matches(&self, token: &str) -> bool {
        !token.is_empty() && bool::from(self.csrf_token.as_bytes().ct_eq(token.as_bytes()))
    }
}

/// A random token of 32 bytes, hex-encoded.
pub fn random_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// Every live session.
#[derive(Debug)]
pub struct SessionStore {
    lifetime: Duration,
    sessions: Mutex<HashMap<String, Session>>,
}

impl SessionStore {
    /// Sessions that end `lifetime` after their login.
    pub fn new(lifetime: Duration) -> Self {
        Self {
            lifetime,
            sessions: Mutex::new(HashMap::new()),
        }
    }

    /// Opens a session for `user`; returns its id (the cookie's value).
    pub fn open(&self, user: &str, role: Role) -> String {
        let id = random_token();
        let session = Session {
            user: user.to_owned(),
            role,
            csrf_token: random_token(),
            expires_at: Instant::now() + self.lifetime,
        };
        let mut sessions = self.lock();
        let now = Instant::now();
        sessions.retain(|_, session| session.expires_at > now);
        sessions.insert(id.clone(), session);
        id
    }

    /// The session `id` stands for, unless it expired (then it is forgotten).
    pub fn get(&self, id: &str) -> Option<Session> {
        let mut sessions = self.lock();
        let session = sessions.get(id)?;
        if session.expires_at <= Instant::now() {
            sessions.remove(id);
            return None;
        }
        Some(session.clone())
    }

    /// Ends the session `id`.
    pub fn close(&self, id: &str) {
        self.lock().remove(id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        // A panic while holding the lock leaves the map consistent (single inserts/removes).
        self.sessions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_lives_until_its_lifetime_ends_or_logout() {
        let store = SessionStore::new(Duration::from_secs(60));
        let id = store.open("alice", Role::Operator);
        let session = store.get(&id).expect("open");
        assert_eq!(session.user, "alice");
        assert!(store.get("not-a-session").is_none());
        store.close(&id);
        assert!(store.get(&id).is_none());

        let expired = SessionStore::new(Duration::ZERO);
        let id = expired.open("alice", Role::Viewer);
        assert!(expired.get(&id).is_none());
    }

    #[test]
    fn csrf_tokens_match_only_exactly() {
        let store = SessionStore::new(Duration::from_secs(60));
        let session = store.get(&store.open("bob", Role::Viewer)).expect("open");
        let token = session.csrf_token.clone();
        assert!(session.csrf_matches(&token));
        assert!(!session.csrf_matches(""));
        assert!(!session.csrf_matches(&token[..10]));
        assert_ne!(
            session.csrf_token,
            store
                .get(&store.open("bob", Role::Viewer))
                .expect("open")
                .csrf_token
        );
    }
}
