//! The provider file: which providers this receiver accepts, how each signs its requests,
//! where its secrets come from, where its event id and type are found, and how it is answered.
//!
//! ```toml
//! [providers.stripe]                       # accepted at POST /webhooks/stripe
//! scheme = "stripe"
//! secrets = [{ env = "STRIPE_WEBHOOK_SECRET" }, { file = "/run/secrets/stripe-old", name = "old" }]
//!
//! [providers.twilio]
//! scheme = "twilio"
//! public_url = "https://hooks.example.com/webhooks/twilio"   # the URL Twilio signs
//! secrets = [{ env = "TWILIO_AUTH_TOKEN" }]
//!
//! [providers.acme]                         # an unlisted HMAC provider, described here
//! scheme = "template"
//! signature_header = "X-Acme-Signature"
//! signed = "{timestamp}.{body}"
//! timestamp_header = "X-Acme-Timestamp"
//! event_id = { json_pointer = "/id" }
//! secrets = [{ env = "ACME_SECRET" }]
//! ```
//!
//! Secrets are read once at start-up, from environment variables or files, and never
//! printed: [`SigningKey`]'s `Debug` is redacted and errors name the source, not the value.
//! Public keys (Discord, SendGrid, Standard Webhooks v1a) are not secret and may be written
//! inline (`public_keys = ["..."]`); nothing is fetched at request time.

mod help;
mod spec;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use inbox_core::inbox::ReplayCheck;
use inbox_signature::{Ack, Batch, Field, Profile, Scheme, SigningKey};
use serde::Deserialize;

pub use help::PROVIDER_FILE_HELP;

pub use inbox_core::limits::{MAX_EVENT_ID_CHARS, MAX_PROVIDER_CHARS};

/// The widest `tolerance` that still protects anything: past a day, a captured delivery stays
/// valid for as long as its signature does. Wider ones load (the published vectors' tests need
/// years) but `check-config` and `serve` warn about them.
pub const MAX_SENSIBLE_TOLERANCE: std::time::Duration = std::time::Duration::from_secs(86_400);

/// Form field that keys Slack's form-encoded bodies (slash commands), unless configured.
pub const DEFAULT_SLACK_FORM_ID_FIELD: &str = "trigger_id";

/// Why the provider file was rejected. Messages name files, variables and fields, never values.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read provider file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML of the expected shape.
    #[error("provider file {path} is invalid: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        message: String,
    },
    /// One provider's entry is wrong.
    #[error("provider {provider:?}: {message}")]
    Provider {
        /// The provider name.
        provider: String,
        /// What is wrong.
        message: String,
    },
}

/// Where one secret comes from.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SecretSource {
    /// Environment variable holding the secret.
    pub env: Option<String>,
    /// File holding the secret (a trailing newline is ignored).
    pub file: Option<PathBuf>,
    /// Label for metrics and logs (which secret verified a request); defaults to its position.
    pub name: Option<String>,
}

/// Where an event id or type is found.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum FieldSource {
    /// A JSON pointer into the body, e.g. `/data/id`.
    JsonPointer(String),
    /// A request header.
    Header(String),
    /// A field of a form-encoded body.
    FormField(String),
    /// Several JSON pointers, their values joined with `:`.
    JsonPointers(Vec<String>),
    /// No id: every delivery is its own event (set by providers whose bodies carry none).
    #[serde(skip)]
    EveryDelivery,
}

impl From<&Field> for FieldSource {
    fn from(field: &Field) -> Self {
        match field {
            Field::Header(name) => Self::Header(name.clone()),
            Field::JsonPointer(pointer) => Self::JsonPointer(pointer.clone()),
            Field::FormField(name) => Self::FormField(name.clone()),
            Field::JoinedPointers(pointers) => Self::JsonPointers(pointers.clone()),
            Field::EveryDelivery => Self::EveryDelivery,
        }
    }
}

/// Where a provider's event id and type come from, and how its body is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// Both read from fields; the first source present wins.
    Fields {
        /// Where the id is.
        event_id: Vec<FieldSource>,
        /// Where the type is, if anywhere.
        event_type: Vec<FieldSource>,
    },
    /// Slack: JSON Events API bodies (`event_id`, `event.type`), or form-encoded bodies keyed
    /// by a field (slash commands), or by that field of the JSON in their `payload` field
    /// (interactivity).
    Slack {
        /// The form field that identifies a form-encoded request.
        form_id_field: String,
    },
    /// A request carrying several events (SendGrid, Adyen, HubSpot, Meta): one row per item.
    Batch(Batch),
}

/// One configured provider, ready to verify requests.
#[derive(Debug)]
pub struct Provider {
    /// The name in the URL and in the dedup key.
    pub name: String,
    /// The signature scheme.
    pub scheme: Arc<dyn Scheme>,
    /// Keys tried in order (rotation).
    pub keys: Vec<SigningKey>,
    /// Metric label of each key, parallel to `keys`.
    pub key_names: Vec<String>,
    /// Accept requests without verifying them (local development only).
    pub unsigned: bool,
    /// Where the event id and type are found.
    pub identity: Identity,
    /// The URL the provider calls, for the schemes that sign it; `None` rebuilds it from the
    /// request (scheme, `Host`, path and query).
    pub public_url: Option<String>,
    /// The answer to a stored (or duplicate) event.
    pub ack: Ack,
    /// Whether the provider performs a handshake, and which kind.
    pub profile: Profile,
    /// Lower-case header names not to store, beyond the built-in credential headers.
    pub drop_headers: Vec<String>,
    /// When set, only these (lower-case) headers are stored.
    pub keep_headers: Option<Vec<String>>,
    /// When set, its events are processed one at a time per key, in sequence order.
    pub ordering: Option<crate::ordering::OrderingSpec>,
    /// Whether a copy of an earlier delivery under a new id is a replay, stored apart and never
    /// handed to a handler ([`Provider::replay_check`]).
    pub suppress_replays: bool,
}

impl Provider {
    /// How the events of a verified request with `body` are checked for replays: by the nonce
    /// the signature covers, for a scheme that signs one instead of the id (Mailgun's token);
    /// else by their body; not at all when the provider does not suppress replays.
    pub fn replay_check(&self, body: &[u8]) -> ReplayCheck {
        if !self.suppress_replays {
            return ReplayCheck::Off;
        }
        match self.scheme.signed_nonce(body) {
            Some(nonce) => ReplayCheck::SameNonce(nonce),
            None => ReplayCheck::SameBody,
        }
    }
}

/// Every configured provider, by name.
#[derive(Debug, Default)]
pub struct Providers {
    by_name: BTreeMap<String, Provider>,
}

impl Providers {
    /// Reads and validates the provider file, resolving every secret.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, path, &|name| std::env::var(name).ok())
    }

    /// Validates provider file text; `env` looks up environment variables (injected for tests).
    pub fn parse(
        text: &str,
        path: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let file: spec::ProviderFile = toml::from_str(text).map_err(|err| ConfigError::Parse {
            path: path.to_owned(),
            message: err.message().to_owned(),
        })?;
        let mut by_name = BTreeMap::new();
        for (name, spec) in file.providers {
            let provider = spec::build_provider(&name, spec, path, env)?;
            by_name.insert(name, provider);
        }
        Ok(Self { by_name })
    }

    /// The provider called `name`.
    pub fn get(&self, name: &str) -> Option<&Provider> {
        self.by_name.get(name)
    }

    /// Every provider, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Provider> {
        self.by_name.values()
    }

    /// Whether no provider is configured.
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// Providers (by name) whose timestamp tolerance is over [`MAX_SENSIBLE_TOLERANCE`], with it.
    pub fn wide_tolerances(&self) -> Vec<(&str, std::time::Duration)> {
        self.iter()
            .filter_map(|provider| {
                provider
                    .scheme
                    .tolerance()
                    .filter(|tolerance| *tolerance > MAX_SENSIBLE_TOLERANCE)
                    .map(|tolerance| (provider.name.as_str(), tolerance))
            })
            .collect()
    }

    /// Signed providers (by name) whose scheme signs the URL it called but with no
    /// `public_url`: the signed URL is then rebuilt from the request's `Host` (or
    /// `Forwarded`), which the sender chooses, so a delivery captured on another host of the
    /// same account (staging) verifies here too.
    pub fn signing_urls_without_public_url(&self) -> Vec<&str> {
        self.iter()
            .filter(|provider| {
                !provider.unsigned
                    && provider.public_url.is_none()
                    && provider.scheme.profile().signs_url
            })
            .map(|provider| provider.name.as_str())
            .collect()
    }

    /// Pairs of providers (by name) that share a secret or key: each one's deliveries verify
    /// on the other's path too, so a delivery can be replayed under the wrong provider.
    pub fn sharing_a_key(&self) -> Vec<(&str, &str)> {
        let providers: Vec<&Provider> = self.iter().collect();
        let mut pairs = Vec::new();
        for (index, first) in providers.iter().enumerate() {
            for second in &providers[index + 1..] {
                let shared = first
                    .keys
                    .iter()
                    .any(|key| second.keys.iter().any(|other| key.same_key(other)));
                if shared {
                    pairs.push((first.name.as_str(), second.name.as_str()));
                }
            }
        }
        pairs
    }
}
