//! Who may log in: user names, roles and argon2 password hashes, read from the environment or
//! a file, never a password in clear.
//!
//! One user per entry, `name:role:hash`, entries separated by white space (a file may hold one
//! per line; `#` starts a comment line). The role is `viewer` (reads) or `operator` (reads and
//! repairs); the hash is an argon2 PHC string as `console hash-password` prints it.

use std::collections::HashMap;
use std::fmt;

use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;

/// What a user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Sees everything, changes nothing.
    Viewer,
    /// Also replays, pauses and resumes.
    Operator,
}

impl Role {
    /// The word used in the users list and shown in the console.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Viewer => "viewer",
            Self::Operator => "operator",
        }
    }
}

/// Why a users list was refused.
#[derive(Debug, thiserror::Error)]
pub enum UsersError {
    /// An entry is not `name:role:hash`.
    #[error("users entry {entry} is not name:role:hash")]
    Malformed {
        /// Which entry (1-based), not its content: it holds a hash.
        entry: usize,
    },
    /// Unknown role word.
    #[error("users entry {entry}: role must be viewer or operator")]
    UnknownRole {
        /// Which entry (1-based).
        entry: usize,
    },
    /// The hash is not a PHC string.
    #[error("users entry {entry}: the password hash is not an argon2 PHC string ($argon2id$...)")]
    BadHash {
        /// Which entry (1-based).
        entry: usize,
    },
    /// The same name twice.
    #[error("user {name:?} is listed twice")]
    Duplicate {
        /// The name.
        name: String,
    },
    /// Nobody could log in.
    #[error("no console users: set CONSOLE_USERS or --users-file")]
    Empty,
}

struct User {
    role: Role,
    hash: String,
}

/// The users who may log in.
pub struct Users {
    users: HashMap<String, User>,
}

impl fmt::Debug for Users {
    // Hashes stay out of debug output.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<&String> = self.users.keys().collect();
        names.sort();
        f.debug_struct("Users").field("names", &names).finish()
    }
}

impl Users {
    /// Parses a users list (see the module documentation).
    pub fn parse(text: &str) -> Result<Self, UsersError> {
        let mut users = HashMap::new();
        let entries = text
            .lines()
            .filter(|line| !line.trim_start().starts_with('#'))
            .flat_map(str::split_whitespace);
        for (index, entry) in entries.enumerate() {
            let number = index + 1;
            let mut fields = entry.splitn(3, ':');
            let (Some(name), Some(role), Some(hash)) =
                (fields.next(), fields.next(), fields.next())
            else {
                return Err(UsersError::Malformed { entry: number });
            };
            if name.is_empty() {
                return Err(UsersError::Malformed { entry: number });
            }
            let role = match role {
                "viewer" => Role::Viewer,
                "operator" => Role::Operator,
                _ => return Err(UsersError::UnknownRole { entry: number }),
            };
            if PasswordHash::new(hash).is_err() {
                return Err(UsersError::BadHash { entry: number });
            }
            let user = User {
                role,
                hash: hash.to_owned(),
            };
            if users.insert(name.to_owned(), user).is_some() {
                return Err(UsersError::Duplicate {
                    name: name.to_owned(),
                });
            }
        }
        if users.is_empty() {
            return Err(UsersError::Empty);
        }
        Ok(Self { users })
    }

    /// The role of `name` when `password` is theirs. An unknown name costs a hash verification
    /// too, so the answer's timing does not tell which names exist.
    pub fn authenticate(&self, name: &str, password: &str) -> Option<Role> {
        match self.users.get(name) {
            Some(user) => verify(&user.hash, password).then_some(user.role),
            None => {
                if let Some(any) = self.users.values().next() {
                    let _ = verify(&any.hash, password);
                }
                None
            }
        }
    }
}

fn verify(hash: &str, password: &str) -> bool {
    PasswordHash::new(hash)
        .map(|parsed| {
            Argon2::default()
                .verify_password(password.as_bytes(), &parsed)
                .is_ok()
        })
        .unwrap_or(false)
}

/// An argon2id PHC string of `password` with a fresh salt and argon2's default cost.
pub fn hash_password(password: &str) -> Result<String, argon2::password_hash::Error> {
    hash_with(&Argon2::default(), password)
}

/// An argon2id PHC string of `password` with `argon2`'s parameters (tests use cheap ones).
pub fn hash_with(
    argon2: &Argon2<'_>,
    password: &str,
) -> Result<String, argon2::password_hash::Error> {
    let salt = SaltString::generate(&mut OsRng);
    Ok(argon2
        .hash_password(password.as_bytes(), &salt)?
        .to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cheap(password: &str) -> String {
        let params = argon2::Params::new(8, 1, 1, None).expect("valid parameters");
        let argon2 = Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
        hash_with(&argon2, password).expect("hashing works")
    }

    #[test]
    fn users_log_in_with_their_own_password_and_get_their_role() {
        let text = format!(
            "# the team\nalice:operator:{}\n  bob:viewer:{}",
            cheap("alice-pass"),
            cheap("bob-pass")
        );
        let users = Users::parse(&text).expect("valid list");
        assert_eq!(
            users.authenticate("alice", "alice-pass"),
            Some(Role::Operator)
        );
        assert_eq!(users.authenticate("bob", "bob-pass"), Some(Role::Viewer));
        assert_eq!(users.authenticate("bob", "alice-pass"), None);
        assert_eq!(users.authenticate("carol", "alice-pass"), None);
        assert_eq!(users.authenticate("alice", ""), None);
    }

    #[test]
    fn malformed_lists_are_refused_without_echoing_hashes() {
        let hash = cheap("x");
        assert!(matches!(Users::parse(""), Err(UsersError::Empty)));
        assert!(matches!(
            Users::parse("alice"),
            Err(UsersError::Malformed { entry: 1 })
        ));
        assert!(matches!(
            Users::parse(&format!("alice:admin:{hash}")),
            Err(UsersError::UnknownRole { entry: 1 })
        ));
        assert!(matches!(
            Users::parse("alice:viewer:plaintext-password"),
            Err(UsersError::BadHash { entry: 1 })
        ));
        let twice = format!("alice:viewer:{hash} alice:operator:{hash}");
        let err = Users::parse(&twice).expect_err("duplicate");
        assert!(!err.to_string().contains(&hash));
        let users = Users::parse(&format!("alice:viewer:{hash}")).expect("valid");
        assert!(!format!("{users:?}").contains(&hash));
    }
}
