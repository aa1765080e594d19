//! The sizes the inbox's CHECK constraints allow, in one place: the receiver refuses (400) what
//! would exceed them before a row reaches the database, and the migration test holds these
//! numbers against the constraints themselves, so the two cannot drift apart.

/// Longest provider name, in characters (`CHECK (char_length(provider) BETWEEN 1 AND 64)`).
pub const MAX_PROVIDER_CHARS: usize = 64;

/// Longest event id, in characters (`CHECK (char_length(event_id) BETWEEN 1 AND 255)`).
pub const MAX_EVENT_ID_CHARS: usize = 255;

/// Whether PostgreSQL's `text` can hold `text`: every character but NUL, which a JSON string
/// may carry (`\u0000`) and the server refuses with a data exception (SQLSTATE 22021).
pub fn is_storable_text(text: &str) -> bool {
    !text.contains('\0')
}
