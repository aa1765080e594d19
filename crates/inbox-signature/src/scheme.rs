//! The one trait every provider implements, and the values it exchanges with the receiver.
//!
//! A provider module says which bytes its provider signs and how ([`Scheme::verify`] and
//! [`Scheme::sign`]), how a configured secret becomes a key, and — as plain data in its
//! [`Profile`] — where the event id and type are, whether a request carries a batch, which
//! handshakes it answers and what acknowledgement the provider expects. The receiver interprets
//! the profile; nothing here does I/O.

use std::time::Duration;

use crate::{HeaderSource, KeyError, SignError, SigningKey, VerifyError};

/// Default tolerance of the timestamped schemes, in both directions: 300 s, as in the
/// providers' reference libraries.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

/// What a verifier sees of a request.
#[derive(Clone, Copy)]
pub struct Request<'a> {
    /// The HTTP method, upper case.
    pub method: &'a str,
    /// The full URL the provider called (scheme, host, path and query), for the schemes that
    /// sign it; empty when unknown.
    pub url: &'a str,
    /// The request headers.
    pub headers: &'a dyn HeaderSource,
    /// The exact body bytes.
    pub body: &'a [u8],
}

impl<'a> Request<'a> {
    /// A `POST` with no known URL, which is what most schemes need.
    #[must_use]
    pub fn post(headers: &'a dyn HeaderSource, body: &'a [u8]) -> Self {
        Self {
            method: "POST",
            url: "",
            headers,
            body,
        }
    }

    /// The same request, at `url`.
    #[must_use]
    pub fn at(self, url: &'a str) -> Self {
        Self { url, ..self }
    }

    /// The value of a header, or [`VerifyError::MissingHeader`] naming it.
    pub(crate) fn required(&self, name: &str) -> Result<&'a str, VerifyError> {
        self.headers
            .header(name)
            .ok_or_else(|| VerifyError::MissingHeader(name.to_owned()))
    }

    /// The query string of the URL (without `?`), empty when there is none.
    #[must_use]
    pub fn query(&self) -> &'a str {
        let without_fragment = self.url.split('#').next().unwrap_or_default();
        without_fragment
            .split_once('?')
            .map_or("", |(_, query)| query)
    }
}

impl std::fmt::Debug for Request<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("method", &self.method)
            .field("url", &self.url)
            .field("body_bytes", &self.body.len())
            .finish_non_exhaustive()
    }
}

/// What a sender signs (tests, the simulator, `receiver sign`, the benchmark).
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    /// The HTTP method, upper case.
    pub method: &'a str,
    /// The URL the request goes to, for the schemes that sign it.
    pub url: &'a str,
    /// The body as the sender composed it.
    pub body: &'a [u8],
    /// The message id, for the schemes that sign one.
    pub id: &'a str,
    /// The unix time of sending, in seconds, for the timestamped schemes.
    pub timestamp: i64,
}

impl<'a> Outgoing<'a> {
    /// A `POST` of `body` with no URL.
    #[must_use]
    pub fn post(body: &'a [u8], id: &'a str, timestamp: i64) -> Self {
        Self {
            method: "POST",
            url: "",
            body,
            id,
            timestamp,
        }
    }
}

/// A signed message: the headers to send, and the body (changed by the schemes that put their
/// signature inside it, such as Adyen and Mailgun). Header names are lowercase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    /// Headers to add to the request.
    pub headers: Vec<(String, String)>,
    /// The body to send.
    pub body: Vec<u8>,
}

/// A successful verification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verified {
    /// Index, in the keys passed to [`Scheme::verify`], of the key that matched.
    pub key_index: usize,
    /// The signed timestamp (unix seconds) for the timestamped schemes, `None` otherwise.
    pub timestamp: Option<i64>,
}

/// Which of the three families a scheme belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// HMAC over a signed string.
    Hmac,
    /// A public-key signature (Ed25519, ECDSA P-256).
    Asymmetric,
    /// A static credential compared as a whole (token header, Basic auth).
    Credential,
}

/// Where a value is found in a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    /// A request header (lowercase name).
    Header(String),
    /// A JSON pointer into the body (or into the batch item).
    JsonPointer(String),
    /// A field of a form-encoded body.
    FormField(String),
    /// Several JSON pointers, their values joined with `:`; present only when all are.
    JoinedPointers(Vec<String>),
    /// No id at all: every delivery is its own event, under a fresh id. For providers whose
    /// notifications are idempotent "something changed" signals without an id (Dropbox), where
    /// folding identical bodies would drop a later change.
    EveryDelivery,
}

impl Field {
    /// A header.
    #[must_use]
    pub fn header(name: &str) -> Self {
        Self::Header(name.to_ascii_lowercase())
    }

    /// A JSON pointer.
    #[must_use]
    pub fn pointer(pointer: &str) -> Self {
        Self::JsonPointer(pointer.to_owned())
    }

    /// Several JSON pointers, their values joined (see [`Field::JoinedPointers`]).
    #[must_use]
    pub fn joined(pointers: &[&str]) -> Self {
        Self::JoinedPointers(pointers.iter().map(|&pointer| pointer.to_owned()).collect())
    }
}

/// How each item of a batch is keyed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ItemId {
    /// These JSON pointers into the item, joined with `:` (Adyen keys on several fields).
    Pointers(Vec<String>),
    /// The SHA-256 of the item's exact bytes, for providers whose items carry no id (Meta's
    /// `entry[]`): a redelivery repeats the bytes, a new event never does, since it carries
    /// its own time and message ids.
    ContentHash,
}

/// A request that carries several events, each stored as its own row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// JSON pointer to the array of items; empty when the body itself is the array.
    pub items: String,
    /// Optional JSON pointer, inside each item, to the object that is stored (Adyen wraps each
    /// notification in `NotificationRequestItem`); empty for the item itself.
    pub unwrap: String,
    /// How an item is keyed.
    pub id: ItemId,
    /// JSON pointer, inside the stored object, to the event type.
    pub event_type: Option<String>,
}

/// A handshake a provider performs; the receiver answers it at once and stores nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeKind {
    /// A signed POST recognised by [`Scheme::handshake`].
    SignedPost,
    /// A GET with a challenge in the query (Meta, Dropbox), answered by [`Scheme::handshake`]
    /// without a signature (there is none).
    Get,
}

/// The answer to a handshake: 200 with a body, or 204 with none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandshakeReply {
    /// The `Content-Type` of the answer.
    pub content_type: &'static str,
    /// The answer body; empty for [`HandshakeReply::no_content`].
    pub body: Vec<u8>,
    /// 200, or 204 (Discord's webhook events want nothing else).
    pub status: u16,
}

impl HandshakeReply {
    /// 200 with `body`.
    #[must_use]
    pub fn ok(content_type: &'static str, body: Vec<u8>) -> Self {
        Self {
            content_type,
            body,
            status: 200,
        }
    }

    /// 204, no body.
    #[must_use]
    pub fn no_content() -> Self {
        Self {
            content_type: "",
            body: Vec::new(),
            status: 204,
        }
    }
}

/// The acknowledgement a provider expects for a stored event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ack {
    /// `{"status":"accepted"}` or `{"status":"duplicate"}`.
    Status,
    /// A fixed text body (Adyen expects `[accepted]`).
    Text(String),
    /// A fixed JSON body (Discord expects an interaction response, `{"type":5}`).
    Json(String),
    /// 204 and no body (Discord's webhook events).
    NoContent,
}

/// Where a provider puts what the receiver needs besides the signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// Where the event id is; the first source present wins.
    pub event_id: Vec<Field>,
    /// Where the event type is; the first source present wins.
    pub event_type: Vec<Field>,
    /// Set when a request carries several events.
    pub batch: Option<Batch>,
    /// Set when the provider performs a handshake.
    pub handshake: Option<HandshakeKind>,
    /// The acknowledgement body.
    pub ack: Ack,
    /// Whether the provider signs the URL it called (so a `public_url` matters).
    pub signs_url: bool,
}

impl Profile {
    /// Id and type from these fields; no batch, no handshake, the JSON status answer.
    #[must_use]
    pub fn fields(event_id: Vec<Field>, event_type: Vec<Field>) -> Self {
        Self {
            event_id,
            event_type,
            batch: None,
            handshake: None,
            ack: Ack::Status,
            signs_url: false,
        }
    }

    /// The same profile with a handshake.
    #[must_use]
    pub fn with_handshake(self, kind: HandshakeKind) -> Self {
        Self {
            handshake: Some(kind),
            ..self
        }
    }

    /// The same profile, marked as signing the URL.
    #[must_use]
    pub fn signing_url(self) -> Self {
        Self {
            signs_url: true,
            ..self
        }
    }
}

/// One provider's verification scheme. Implementations are small and pure; the catalog
/// ([`crate::catalog`]) builds them from the provider file's options.
pub trait Scheme: std::fmt::Debug + Send + Sync {
    /// The scheme's name as written in the configuration file (kebab-case).
    fn name(&self) -> &'static str;

    /// The family the scheme belongs to.
    fn family(&self) -> Family {
        Family::Hmac
    }

    /// The timestamp tolerance, for the schemes that sign a timestamp.
    fn tolerance(&self) -> Option<Duration> {
        None
    }

    /// The header names that carry signature material, so the receiver can reject a request
    /// that repeats one of them.
    fn signature_headers(&self) -> Vec<&str>;

    /// The headers whose values the signature covers (lowercase), such as a signed message id
    /// or timestamp: an event id read from one of them cannot be changed without breaking the
    /// signature, one read from any other header can. None by default, which errs on the safe
    /// side: the receiver then treats an id from a header as unsigned and suppresses replays.
    fn signed_headers(&self) -> Vec<&str> {
        Vec::new()
    }

    /// Whether the signature covers a single-use value (a nonce) but neither the body nor the
    /// event id, as Mailgun's covers only `{timestamp}{token}`: whoever captured a delivery can
    /// send any event under its signature until the timestamp expires, and only the nonce,
    /// seen again, gives the copy away. [`Scheme::signed_nonce`] reads it.
    fn signs_nonce_not_id(&self) -> bool {
        false
    }

    /// The signed nonce of a verified request's body (see [`Scheme::signs_nonce_not_id`]);
    /// `None` for the other schemes. A request that carries several events shares one nonce,
    /// so only schemes of one event per request have one.
    fn signed_nonce(&self, _body: &[u8]) -> Option<String> {
        None
    }

    /// Turns a configured secret (or public key) into a key, the way the provider writes it.
    /// Secrets read from files should be trimmed by the caller: a trailing newline would
    /// otherwise become part of the key.
    ///
    /// # Errors
    /// [`KeyError`] naming what is wrong, never the value.
    fn key_from_secret(&self, secret: &str) -> Result<SigningKey, KeyError>;

    /// Verifies a request.
    ///
    /// `keys` are tried in order (rotation); the index of the first key that matched is
    /// returned. `now_unix` is the current unix time in seconds, injected so tests are
    /// deterministic. With no keys, a well-formed request fails with [`VerifyError::NoMatch`].
    /// Headers are parsed first, then the signature is checked, and only then the timestamp, so
    /// that a stale or future timestamp is reported only for a request that is otherwise
    /// authentic.
    ///
    /// # Errors
    /// The [`VerifyError`] that explains the refusal.
    fn verify(
        &self,
        request: &Request<'_>,
        keys: &[SigningKey],
        now_unix: i64,
    ) -> Result<Verified, VerifyError>;

    /// The headers (and body) a provider would send for this message.
    ///
    /// # Errors
    /// [`SignError`] when the key cannot sign (a public key) or the message lacks what the
    /// scheme signs.
    fn sign(&self, key: &SigningKey, message: &Outgoing<'_>) -> Result<Signed, SignError>;

    /// Where the event id and type are, batches, handshakes and the acknowledgement.
    fn profile(&self) -> Profile;

    /// The answer to a handshake, when `request` is one; `None` for an ordinary event.
    ///
    /// For a signed POST it is called after [`Scheme::verify`] succeeded, with the key that
    /// matched (Zoom answers with an HMAC made with it). For a GET it is called with no key.
    ///
    /// # Errors
    /// [`VerifyError`] for a handshake that fails its own check (Meta's verify token).
    fn handshake(
        &self,
        _request: &Request<'_>,
        _key: Option<&SigningKey>,
    ) -> Option<Result<HandshakeReply, VerifyError>> {
        None
    }
}
