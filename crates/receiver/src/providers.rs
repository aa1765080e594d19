//! The provider file: which providers this receiver accepts, how each signs its requests,
//! where its secrets come from, and where its event id and type are found.
//!
//! ```toml
//! [providers.stripe]                       # accepted at POST /webhooks/stripe
//! scheme = "stripe"
//! secrets = [{ env = "STRIPE_WEBHOOK_SECRET" }, { file = "/run/secrets/stripe-old", name = "old" }]
//!
//! [providers.acme]
//! scheme = "hmac-sha256"
//! signature_header = "X-Acme-Signature"
//! encoding = "hex"                         # or "base64"
//! prefix = "sha256="                       # optional
//! event_id = { json_pointer = "/id" }      # or { header = "X-Acme-Delivery" }
//! event_type = { json_pointer = "/type" }  # optional
//! secrets = [{ env = "ACME_SECRET" }]
//! ```
//!
//! Secrets are read once at start-up, from environment variables or files, and never
//! printed: [`SigningKey`]'s `Debug` is redacted and errors name the source, not the value.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use inbox_signature::{DigestEncoding, GenericHmac, Scheme, SigningKey};
use serde::Deserialize;

/// The provider file's format, shown by `receiver serve --help` and `receiver check-config --help`.
pub const PROVIDER_FILE_HELP: &str = r#"PROVIDER FILE (--config, TOML)
One table per provider; its name is the URL path (POST /webhooks/<name>) and the first half of
the dedup key. Names: 1-64 characters of a-z, 0-9, '-' and '_'.

  [providers.<name>]
  scheme = "stripe" | "github" | "standard-webhooks" | "shopify" | "slack" | "hmac-sha256"
  secrets = [{ env = "VAR", name = "current" }, { file = "path", name = "previous" }]
      Tried in order (rotation). Each secret comes from exactly one environment variable or
      file (relative to the provider file; a trailing newline is ignored). `name` labels it in
      inbox_receiver_signature_verified_total{provider,secret} (default: its position).
      Standard Webhooks secrets are written whsec_<base64>; Stripe's whsec_ string is used whole.
  unsigned = true            accept unverified requests (local development only; no secrets)
  tolerance = "5m"           stripe, standard-webhooks, slack: accepted clock distance, both ways
  drop_headers = ["x-..."]   headers not to store, beyond Authorization, Cookie and the like
  form_event_id_field = "trigger_id"
                             slack: the form field that keys form-encoded bodies (slash commands)

  Generic scheme "hmac-sha256" (HMAC-SHA256 of the raw body in one header):
  signature_header = "X-Signature"
  encoding = "hex" | "base64"                  (default hex)
  prefix = "sha256="                           (optional; required in the header when set)
  event_id = { json_pointer = "/id" }          or { header = "X-Delivery-Id" }
  event_type = { json_pointer = "/type" }      optional, or { header = "..." }

Event ids: stripe body `id`; github X-GitHub-Delivery; standard-webhooks webhook-id (or
svix-id); shopify X-Shopify-Event-Id (or X-Shopify-Webhook-Id); slack body `event_id`, or the
form field above (for interactivity, inside its `payload` JSON). A provider without secrets is refused at start-up unless `unsigned = true`.
Example: config/providers.example.toml."#;

/// Longest event id the inbox stores (the column's CHECK constraint).
pub const MAX_EVENT_ID_CHARS: usize = 255;

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
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
enum SchemeName {
    Stripe,
    Github,
    StandardWebhooks,
    Shopify,
    Slack,
    HmacSha256,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum EncodingName {
    Hex,
    Base64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProviderSpec {
    scheme: SchemeName,
    #[serde(default)]
    secrets: Vec<SecretSource>,
    #[serde(default)]
    unsigned: bool,
    #[serde(default, with = "humantime_serde_opt")]
    tolerance: Option<Duration>,
    signature_header: Option<String>,
    encoding: Option<EncodingName>,
    prefix: Option<String>,
    event_id: Option<FieldSource>,
    event_type: Option<FieldSource>,
    form_event_id_field: Option<String>,
    #[serde(default)]
    drop_headers: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProviderFile {
    #[serde(default)]
    providers: BTreeMap<String, ProviderSpec>,
}

/// Durations in the file are written like `"300s"` or `"5m"`.
mod humantime_serde_opt {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let text: Option<String> = Option::deserialize(d)?;
        text.map(|t| humantime::parse_duration(&t).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// Where a provider's event id and type come from, and how its body is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// Both read with JSON pointers (or a header) as configured.
    Fields {
        /// Where the id is.
        event_id: FieldSource,
        /// Where the type is, if anywhere.
        event_type: Option<FieldSource>,
    },
    /// Slack: JSON Events API bodies (`event_id`, `event.type`) with the `url_verification`
    /// handshake, or form-encoded bodies keyed by a field (slash commands), or by that field
    /// of the JSON in their `payload` field (interactivity).
    Slack {
        /// The form field that identifies a form-encoded request.
        form_id_field: String,
    },
    /// Shopify: `X-Shopify-Event-Id`, falling back to `X-Shopify-Webhook-Id`.
    Shopify,
    /// Standard Webhooks: the signed message id, `webhook-id`, or `svix-id` when the request
    /// uses Svix's spelling of the headers; the type is the body's `type` when the body is JSON.
    StandardWebhooks,
}

/// One configured provider, ready to verify requests.
#[derive(Debug)]
pub struct Provider {
    /// The name in the URL and in the dedup key.
    pub name: String,
    /// The signature scheme.
    pub scheme: Scheme,
    /// Keys tried in order (rotation).
    pub keys: Vec<SigningKey>,
    /// Metric label of each key, parallel to `keys`.
    pub key_names: Vec<String>,
    /// Accept requests without verifying them (local development only).
    pub unsigned: bool,
    /// Where the event id and type are found.
    pub identity: Identity,
    /// Lower-case header names not to store, beyond the built-in credential headers.
    pub drop_headers: Vec<String>,
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
        let file: ProviderFile = toml::from_str(text).map_err(|err| ConfigError::Parse {
            path: path.to_owned(),
            message: err.message().to_owned(),
        })?;
        let mut by_name = BTreeMap::new();
        for (name, spec) in file.providers {
            let provider = build_provider(&name, spec, path, env)?;
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
}

fn valid_provider_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c.is_ascii_digit())
        && name.len() <= 64
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

fn build_provider(
    name: &str,
    spec: ProviderSpec,
    path: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Provider, ConfigError> {
    let fail = |message: String| ConfigError::Provider {
        provider: name.to_owned(),
        message,
    };
    if !valid_provider_name(name) {
        return Err(fail(
            "provider names are 1-64 characters of a-z, 0-9, '-' and '_', starting with a letter or digit".into(),
        ));
    }
    let only_for = |field: &str, present: bool, schemes: &str| {
        if present {
            Err(fail(format!("`{field}` applies only to scheme {schemes}")))
        } else {
            Ok(())
        }
    };
    let generic = spec.scheme == SchemeName::HmacSha256;
    only_for(
        "signature_header",
        spec.signature_header.is_some() && !generic,
        "hmac-sha256",
    )?;
    only_for(
        "encoding",
        spec.encoding.is_some() && !generic,
        "hmac-sha256",
    )?;
    only_for("prefix", spec.prefix.is_some() && !generic, "hmac-sha256")?;
    only_for(
        "event_id",
        spec.event_id.is_some() && !generic,
        "hmac-sha256",
    )?;
    only_for(
        "event_type",
        spec.event_type.is_some() && !generic,
        "hmac-sha256",
    )?;
    only_for(
        "form_event_id_field",
        spec.form_event_id_field.is_some() && spec.scheme != SchemeName::Slack,
        "slack",
    )?;
    let timestamped = matches!(
        spec.scheme,
        SchemeName::Stripe | SchemeName::StandardWebhooks | SchemeName::Slack
    );
    only_for(
        "tolerance",
        spec.tolerance.is_some() && !timestamped,
        "stripe, standard-webhooks and slack",
    )?;
    let tolerance = spec.tolerance.unwrap_or(inbox_signature::DEFAULT_TOLERANCE);

    let json_pointer = |pointer: &str| FieldSource::JsonPointer(pointer.to_owned());
    let header = |name: &str| FieldSource::Header(name.to_owned());
    let (scheme, identity) = match spec.scheme {
        SchemeName::Stripe => (
            Scheme::Stripe { tolerance },
            Identity::Fields {
                event_id: json_pointer("/id"),
                event_type: Some(json_pointer("/type")),
            },
        ),
        SchemeName::Github => (
            Scheme::Github,
            Identity::Fields {
                event_id: header("x-github-delivery"),
                event_type: Some(header("x-github-event")),
            },
        ),
        SchemeName::StandardWebhooks => (
            Scheme::StandardWebhooks { tolerance },
            Identity::StandardWebhooks,
        ),
        SchemeName::Shopify => (Scheme::Shopify, Identity::Shopify),
        SchemeName::Slack => (
            Scheme::Slack { tolerance },
            Identity::Slack {
                form_id_field: spec
                    .form_event_id_field
                    .unwrap_or_else(|| DEFAULT_SLACK_FORM_ID_FIELD.to_owned()),
            },
        ),
        SchemeName::HmacSha256 => {
            let signature_header = spec
                .signature_header
                .ok_or_else(|| fail("scheme hmac-sha256 needs `signature_header`".into()))?;
            let event_id = spec.event_id.ok_or_else(|| {
                fail("scheme hmac-sha256 needs `event_id = { json_pointer = \"/id\" }` or `{ header = \"...\" }`".into())
            })?;
            for source in std::iter::once(&event_id).chain(spec.event_type.as_ref()) {
                if let FieldSource::JsonPointer(pointer) = source {
                    if !pointer.is_empty() && !pointer.starts_with('/') {
                        return Err(fail(format!(
                            "JSON pointer {pointer:?} must be empty or start with '/'"
                        )));
                    }
                }
            }
            let encoding = match spec.encoding.unwrap_or(EncodingName::Hex) {
                EncodingName::Hex => DigestEncoding::Hex,
                EncodingName::Base64 => DigestEncoding::Base64,
            };
            (
                Scheme::HmacSha256(GenericHmac {
                    header: signature_header,
                    encoding,
                    prefix: spec.prefix,
                }),
                Identity::Fields {
                    event_id,
                    event_type: spec.event_type,
                },
            )
        }
    };

    let mut keys = Vec::with_capacity(spec.secrets.len());
    let mut key_names = Vec::with_capacity(spec.secrets.len());
    for (index, source) in spec.secrets.iter().enumerate() {
        let secret = read_secret(source, path, env).map_err(&fail)?;
        let key = scheme
            .key_from_secret(&secret)
            .map_err(|err| fail(format!("secret #{} is not usable: {err}", index + 1)))?;
        keys.push(key);
        key_names.push(source.name.clone().unwrap_or_else(|| index.to_string()));
    }
    if keys.is_empty() && !spec.unsigned {
        return Err(fail(
            "no secret configured: add `secrets = [{ env = \"VAR\" }]` (or `{ file = \"path\" }`), \
             or set `unsigned = true` to accept unverified requests in local development"
                .into(),
        ));
    }
    if !keys.is_empty() && spec.unsigned {
        return Err(fail(
            "`unsigned = true` together with secrets is contradictory".into(),
        ));
    }
    Ok(Provider {
        name: name.to_owned(),
        scheme,
        keys,
        key_names,
        unsigned: spec.unsigned,
        identity,
        drop_headers: spec
            .drop_headers
            .iter()
            .map(|h| h.to_ascii_lowercase())
            .collect(),
    })
}

fn read_secret(
    source: &SecretSource,
    config_path: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let secret = match (&source.env, &source.file) {
        (Some(var), None) => {
            env(var).ok_or_else(|| format!("environment variable {var} is not set"))?
        }
        (None, Some(file)) => {
            // Relative paths are relative to the provider file.
            let file = config_path.parent().unwrap_or(Path::new(".")).join(file);
            std::fs::read_to_string(&file)
                .map_err(|err| format!("cannot read secret file {}: {err}", file.display()))?
        }
        _ => return Err("each secret needs exactly one of `env` or `file`".into()),
    };
    let secret = secret.trim_end_matches(['\n', '\r']).to_owned();
    if secret.is_empty() {
        return Err("a configured secret is empty".into());
    }
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Providers, ConfigError> {
        Providers::parse(text, Path::new("providers.toml"), &|var| match var {
            "SECRET" => Some("s3cr3t-value".to_owned()),
            "WHSEC" => Some("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned()),
            _ => None,
        })
    }

    #[test]
    fn every_scheme_parses_with_its_defaults() {
        let providers = parse(
            r#"
            [providers.stripe]
            scheme = "stripe"
            secrets = [{ env = "SECRET" }]
            [providers.github]
            scheme = "github"
            secrets = [{ env = "SECRET", name = "current" }, { env = "SECRET" }]
            [providers.svix]
            scheme = "standard-webhooks"
            secrets = [{ env = "WHSEC" }]
            tolerance = "2m"
            [providers.shopify]
            scheme = "shopify"
            secrets = [{ env = "SECRET" }]
            [providers.slack]
            scheme = "slack"
            secrets = [{ env = "SECRET" }]
            [providers.acme]
            scheme = "hmac-sha256"
            signature_header = "X-Acme-Signature"
            event_id = { header = "X-Acme-Id" }
            secrets = [{ env = "SECRET" }]
            "#,
        )
        .expect("valid file");
        let names: Vec<&str> = providers.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            ["acme", "github", "shopify", "slack", "stripe", "svix"]
        );
        let stripe = providers.get("stripe").expect("stripe");
        assert!(
            matches!(stripe.scheme, Scheme::Stripe { tolerance } if tolerance == Duration::from_secs(300))
        );
        let svix = providers.get("svix").expect("svix");
        assert!(
            matches!(svix.scheme, Scheme::StandardWebhooks { tolerance } if tolerance == Duration::from_secs(120))
        );
        let github = providers.get("github").expect("github");
        assert_eq!(github.key_names, ["current", "1"]);
        let slack = providers.get("slack").expect("slack");
        assert_eq!(
            slack.identity,
            Identity::Slack {
                form_id_field: "trigger_id".into()
            }
        );
    }

    #[test]
    fn a_standard_webhooks_secret_must_be_whsec_base64_and_is_never_echoed() {
        let err = parse(
            "[providers.svix]\nscheme = \"standard-webhooks\"\nsecrets = [{ env = \"SECRET\" }]\n",
        )
        .expect_err("not base64");
        assert!(err.to_string().contains("svix"), "{err}");
        assert!(!err.to_string().contains("s3cr3t"), "secret leaked: {err}");
    }

    #[test]
    fn a_provider_without_secrets_fails_unless_marked_unsigned() {
        let err = parse("[providers.x]\nscheme = \"github\"\n").expect_err("no secret");
        assert!(err.to_string().contains("no secret configured"), "{err}");
        let providers = parse("[providers.x]\nscheme = \"github\"\nunsigned = true\n")
            .expect("unsigned is allowed");
        assert!(providers.get("x").is_some_and(|p| p.unsigned));
    }

    #[test]
    fn a_missing_environment_variable_is_named_and_the_value_never_shown() {
        let err = parse("[providers.x]\nscheme = \"github\"\nsecrets = [{ env = \"NOPE\" }]\n")
            .expect_err("unset variable");
        assert_eq!(
            err.to_string(),
            "provider \"x\": environment variable NOPE is not set"
        );
    }

    #[test]
    fn fields_of_other_schemes_and_unknown_fields_are_rejected() {
        let err = parse(
            "[providers.x]\nscheme = \"github\"\nsecrets = [{ env = \"SECRET\" }]\nprefix = \"v=\"\n",
        )
        .expect_err("prefix on github");
        assert!(err.to_string().contains("`prefix` applies only"), "{err}");
        let err = parse("[providers.x]\nscheme = \"github\"\nsecret = \"inline\"\n")
            .expect_err("unknown field");
        assert!(err.to_string().contains("unknown field"), "{err}");
        assert!(!err.to_string().contains("inline"), "value leaked: {err}");
    }

    #[test]
    fn generic_scheme_requires_header_and_event_id() {
        let err = parse("[providers.x]\nscheme = \"hmac-sha256\"\nunsigned = true\n")
            .expect_err("no header");
        assert!(err.to_string().contains("signature_header"), "{err}");
        let err = parse(
            "[providers.x]\nscheme = \"hmac-sha256\"\nunsigned = true\nsignature_header = \"X-Sig\"\n",
        )
        .expect_err("no event id");
        assert!(err.to_string().contains("event_id"), "{err}");
    }

    #[test]
    fn the_example_file_parses_as_shipped_and_with_every_provider_uncommented() {
        let example =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/providers.example.toml");
        let text = std::fs::read_to_string(&example).expect("example file");
        let env = |var: &str| match var {
            "SVIX_WEBHOOK_SECRET" => Some("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned()),
            _ => Some(format!("value of {var}")),
        };
        let shipped = Providers::parse(&text, &example, &env).expect("shipped example");
        assert_eq!(shipped.iter().count(), 1);

        // The commented providers are documentation: they must stay valid too.
        let is_setting = |line: &str| {
            line.split_once(" = ").is_some_and(|(key, _)| {
                !key.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c == '_')
            })
        };
        let uncommented: String = text
            .lines()
            .map(|line| match line.strip_prefix("# ") {
                Some(rest) if rest.starts_with("[providers.") || is_setting(rest) => rest,
                _ => line,
            })
            .collect::<Vec<_>>()
            .join("\n");
        let folder = std::env::temp_dir().join(format!("providers-example-{}", std::process::id()));
        std::fs::create_dir_all(folder.join("secrets")).expect("temp folder");
        std::fs::write(folder.join("secrets/stripe-previous"), "whsec_old\n").expect("secret");
        let parsed = Providers::parse(&uncommented, &folder.join("providers.toml"), &env);
        std::fs::remove_dir_all(&folder).expect("cleanup");
        let all = parsed.expect("every example provider");
        let names: Vec<&str> = all.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            ["acme", "demo", "github", "shopify", "slack", "stripe", "svix"]
        );
        let stripe = all.get("stripe").expect("stripe");
        assert_eq!(stripe.key_names, ["current", "previous"]);
    }

    #[test]
    fn provider_names_are_restricted_to_url_safe_lowercase() {
        let err = parse("[providers.\"Bad Name\"]\nscheme = \"github\"\nunsigned = true\n")
            .expect_err("bad name");
        assert!(err.to_string().contains("provider names"), "{err}");
    }
}
