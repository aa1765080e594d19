//! Limits on password guessing: each client address and each user name may fail
//! [`MAX_FAILURES`] logins per [`WINDOW`]; past that, logins are answered 429 without checking
//! the password, until the window that began with the first failure has passed.
//!
//! An attempt counts as a failure from the moment it starts and is forgiven when its password
//! turns out right, so a burst of concurrent guesses cannot all pass the check before the
//! first of them fails. The state lives in this process's memory (the console runs as one
//! replica), bounded to [`MAX_TRACKED`] addresses and names: when full, expired windows are
//! dropped first, then the oldest.
//!
//! A name is limited whether or not it exists (the answer must not tell), so anyone may keep
//! an operator's name refused for a window at a time; the other operators still log in. Behind
//! a reverse proxy the client's address is the one the proxy forwarded, when the proxy is
//! trusted ([`crate::client_address`]); else every client has the proxy's address, and the
//! address limit applies to all of them together.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failed logins allowed per client address and per user name within [`WINDOW`].
pub const MAX_FAILURES: u32 = 5;
/// How long failures are remembered, from the first failure of a window.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Addresses and names tracked at most (about 50 bytes each).
pub const MAX_TRACKED: usize = 10_000;

/// What a failure is counted against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    /// A client address; IPv6 by its /64 prefix, which one host usually holds whole.
    Client(IpAddr),
    /// A user name, hashed: names come from the form and may be long, their hash is 8 bytes.
    Name(u64),
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    window_start: Instant,
    count: u32,
}

impl Failures {
    fn expired(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.window_start) >= WINDOW
    }
}

/// A login refused without a password check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("too many failed logins; retry in {} s", retry_after.as_secs())]
pub struct Throttled {
    /// Until the window passes (whole seconds, at least one).
    pub retry_after: Duration,
}

/// A login attempt counted as a failure until [`LoginThrottle::forgive`] says otherwise.
#[derive(Debug)]
#[must_use = "a successful attempt must be forgiven"]
pub struct Attempt {
    keys: Vec<Key>,
}

/// The failed logins of the last window, per client address and per user name.
#[derive(Debug)]
pub struct LoginThrottle {
    names: RandomState,
    failures: Mutex<HashMap<Key, Failures>>,
}

impl Default for LoginThrottle {
    fn default() -> Self {
        Self {
            names: RandomState::new(),
            failures: Mutex::new(HashMap::new()),
        }
    }
}

impl LoginThrottle {
    /// Starts a login attempt by `user` from `client` (unknown for a Unix socket), counting it
    /// as a failure of both; refused when either has failed [`MAX_FAILURES`] times in its
    /// window already (then nothing is counted).
    pub fn begin(
        &self,
        client: Option<IpAddr>,
        user: &str,
        now: Instant,
    ) -> Result<Attempt, Throttled> {
        let mut keys = vec![Key::Name(self.names.hash_one(user))];
        if let Some(client) = client {
            keys.push(Key::Client(network_of(client)));
        }
        let mut failures = self.lock();
        let mut retry_after = Duration::ZERO;
        for key in &keys {
            if let Some(entry) = failures.get(key) {
                if !entry.expired(now) && entry.count >= MAX_FAILURES {
                    let left = WINDOW.saturating_sub(now.duration_since(entry.window_start));
                    retry_after = retry_after.max(left);
                }
            }
        }
        if !retry_after.is_zero() {
            // Whole seconds, rounded up, as Retry-After states them.
            let seconds = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
            return Err(Throttled {
                retry_after: Duration::from_secs(seconds.max(1)),
            });
        }
        for key in &keys {
            if !failures.contains_key(key) && failures.len() >= MAX_TRACKED {
                make_room(&mut failures, now);
            }
            let entry = failures.entry(*key).or_insert(Failures {
                window_start: now,
                count: 0,
            });
            if entry.expired(now) {
                *entry = Failures {
                    window_start: now,
                    count: 0,
                };
            }
            entry.count += 1;
        }
        Ok(Attempt { keys })
    }

    /// Takes back the failure `attempt` was counted as: its password was right.
    pub fn forgive(&self, attempt: Attempt) {
        let mut failures = self.lock();
        for key in attempt.keys {
            if let Some(entry) = failures.get_mut(&key) {
                entry.count = entry.count.saturating_sub(1);
                if entry.count == 0 {
                    failures.remove(&key);
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Failures>> {
        // Every change under the lock is a single insert, update or remove.
        self.failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The address a client is limited by: IPv4 whole, IPv6 by its /64.
fn network_of(client: IpAddr) -> IpAddr {
    match client {
        IpAddr::V4(_) => client,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut segments = v6.segments();
                segments[4..].fill(0);
                IpAddr::from(segments)
            }
        },
    }
}

/// Frees a slot in a full map: expired windows go first, else the one that began longest ago.
fn make_room(failures: &mut HashMap<Key, Failures>, now: Instant) {
    failures.retain(|_, entry| !entry.expired(now));
    if failures.len() >= MAX_TRACKED {
        let oldest = failures
            .iter()
            .min_by_key(|(_, entry)| entry.window_start)
            .map(|(key, _)| *key);
        if let Some(oldest) = oldest {
            failures.remove(&oldest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOME: Option<IpAddr> = Some(IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1)));
    const AWAY: Option<IpAddr> = Some(IpAddr::V4(std::net::Ipv4Addr::new(198, 51, 100, 7)));

    fn fail(throttle: &LoginThrottle, client: Option<IpAddr>, user: &str, now: Instant) {
        let _failed = throttle
            .begin(client, user, now)
            .expect("not throttled yet");
    }

    #[test]
    fn a_name_is_refused_after_five_failures_until_its_window_passes() {
        let throttle = LoginThrottle::default();
        let start = Instant::now();
        for n in 0..MAX_FAILURES {
            // A different address each time: the name alone is limited.
            let client = Some(IpAddr::from([10, 0, 0, u8::try_from(n).expect("small")]));
            fail(&throttle, client, "olivia", start);
        }
        let refused = throttle
            .begin(AWAY, "olivia", start + Duration::from_millis(20_500))
            .expect_err("sixth attempt");
        assert_eq!(refused.retry_after, Duration::from_secs(40));
        assert!(throttle.begin(AWAY, "victor", start).is_ok());
        assert!(throttle.begin(AWAY, "olivia", start + WINDOW).is_ok());
    }

    #[test]
    fn an_address_is_refused_after_five_failures_whatever_the_names() {
        let throttle = LoginThrottle::default();
        let now = Instant::now();
        for n in 0..MAX_FAILURES {
            fail(&throttle, HOME, &format!("guess-{n}"), now);
        }
        assert!(throttle.begin(HOME, "someone-else", now).is_err());
        assert!(throttle.begin(AWAY, "someone-else", now).is_ok());
        // One IPv6 host holds its whole /64.
        let v6 = |last: u16| Some(IpAddr::from([0x2001, 0xdb8, 0, 1, 0, 0, 0, last]));
        for n in 0..MAX_FAILURES {
            fail(&throttle, v6(u16::try_from(n).expect("small")), "x", now);
        }
        assert!(throttle.begin(v6(999), "y", now).is_err());
    }

    #[test]
    fn right_passwords_are_forgiven_and_concurrent_guesses_count_at_once() {
        let throttle = LoginThrottle::default();
        let now = Instant::now();
        for _ in 0..20 {
            let attempt = throttle.begin(HOME, "olivia", now).expect("not throttled");
            throttle.forgive(attempt);
        }
        // Five guesses begun side by side, none finished: the sixth is refused already.
        let pending: Vec<Attempt> = (0..MAX_FAILURES)
            .map(|_| throttle.begin(HOME, "olivia", now).expect("within limit"))
            .collect();
        assert!(throttle.begin(HOME, "olivia", now).is_err());
        for attempt in pending {
            throttle.forgive(attempt);
        }
        assert!(throttle.begin(HOME, "olivia", now).is_ok());
    }

    #[test]
    fn memory_stays_bounded_under_a_flood_of_names() {
        let throttle = LoginThrottle::default();
        let now = Instant::now();
        for n in 0..MAX_TRACKED + 500 {
            fail(&throttle, None, &format!("name-{n}"), now);
        }
        assert_eq!(throttle.lock().len(), MAX_TRACKED);
    }
}
