//! The provider file's shape and how one entry becomes a [`Provider`]: the scheme from the
//! catalog, its keys, its identity and its answer.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr as _;
use std::time::Duration;

use inbox_signature::providers::{self, Options, TemplateOptions};
use inbox_signature::{Ack, Algorithm, DigestEncoding, Family, Scheme, TimestampFormat};
use serde::Deserialize;

use super::{
    ConfigError, FieldSource, Identity, Provider, SecretSource, DEFAULT_SLACK_FORM_ID_FIELD,
};

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum EncodingName {
    Hex,
    Base64,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum AlgorithmName {
    Sha1,
    Sha256,
    Sha512,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
enum TimestampFormatName {
    Unix,
    UnixMs,
    Rfc3339,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ProviderSpec {
    scheme: String,
    #[serde(default)]
    secrets: Vec<SecretSource>,
    #[serde(default)]
    public_keys: Vec<String>,
    #[serde(default)]
    unsigned: bool,
    #[serde(default, with = "humantime_serde_opt")]
    tolerance: Option<Duration>,
    public_url: Option<String>,
    signature_header: Option<String>,
    signed: Option<String>,
    algorithm: Option<AlgorithmName>,
    encoding: Option<EncodingName>,
    prefix: Option<String>,
    timestamp_header: Option<String>,
    timestamp_format: Option<TimestampFormatName>,
    id_header: Option<String>,
    hex_key: Option<bool>,
    verify_token: Option<SecretSource>,
    event_id: Option<FieldSource>,
    event_type: Option<FieldSource>,
    form_event_id_field: Option<String>,
    answer: Option<String>,
    #[serde(default)]
    drop_headers: Vec<String>,
    keep_headers: Option<Vec<String>>,
    ordering: Option<crate::ordering::OrderingSpec>,
    suppress_replays: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ProviderFile {
    #[serde(default)]
    pub(super) providers: BTreeMap<String, ProviderSpec>,
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

fn valid_provider_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c.is_ascii_digit())
        && name.len() <= super::MAX_PROVIDER_CHARS
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

pub(super) fn build_provider(
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
    let options = scheme_options(&spec, path, env).map_err(&fail)?;
    let scheme = providers::build(&spec.scheme, &options).map_err(&fail)?;
    let identity = identity(&spec, scheme.as_ref()).map_err(&fail)?;
    let public_url = check_public_url(spec.public_url.as_deref()).map_err(&fail)?;
    let (keys, key_names) = keys(&spec, scheme.as_ref(), path, env).map_err(&fail)?;
    let profile = scheme.profile();
    if let Some(ordering) = &spec.ordering {
        ordering.validate().map_err(&fail)?;
    }
    let suppress_replays = spec
        .suppress_replays
        .unwrap_or_else(|| replayable_under_new_ids(&spec, scheme.as_ref(), &identity));
    Ok(Provider {
        name: name.to_owned(),
        ack: spec.answer.clone().map_or(profile.ack.clone(), Ack::Text),
        profile,
        scheme,
        keys,
        key_names,
        unsigned: spec.unsigned,
        identity,
        public_url,
        drop_headers: lowercase(&spec.drop_headers),
        keep_headers: spec.keep_headers.as_deref().map(lowercase),
        ordering: spec.ordering,
        suppress_replays,
    })
}

/// Whether anyone who saw one delivery could send it again as a new event, which is when
/// replays are suppressed unless the file says otherwise: the event id may come from a header
/// the signature does not cover, so a copy of the signed body under a fresh id still verifies.
/// A signed timestamp does not prevent it: within its tolerance (Linear's 60 s, a template's
/// 5 min) the copy is as good as the original. Where the id is read from the signed body or a
/// signed header, a copy carries the same id and is a duplicate already. Where the signature
/// covers a nonce and neither the body nor the id (Mailgun), a copy is one that carries a nonce
/// seen before. Providers with no id
/// (Dropbox) or that sign the URL (Twilio) legitimately send one body more than once; a static
/// credential or no signature at all lets its holder send anything.
fn replayable_under_new_ids(spec: &ProviderSpec, scheme: &dyn Scheme, identity: &Identity) -> bool {
    let signed = scheme.signed_headers();
    let id_from_unsigned_header = matches!(identity, Identity::Fields { event_id, .. }
        if event_id.iter().any(|source| matches!(source, FieldSource::Header(name)
            if !signed.iter().any(|signed| signed.eq_ignore_ascii_case(name)))));
    !spec.unsigned
        && scheme.family() != Family::Credential
        && !scheme.profile().signs_url
        && (id_from_unsigned_header || scheme.signs_nonce_not_id())
}

fn lowercase(names: &[String]) -> Vec<String> {
    names.iter().map(|h| h.to_ascii_lowercase()).collect()
}

/// The catalog's options from the entry: tolerance, verify token and the template settings.
fn scheme_options(
    spec: &ProviderSpec,
    path: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Options, String> {
    let verify_token = spec
        .verify_token
        .as_ref()
        .map(|source| read_secret(source, path, env))
        .transpose()?;
    if spec.tolerance.is_some_and(|tolerance| tolerance.is_zero()) {
        return Err("`tolerance` must be more than 0s: every timestamp would be refused".into());
    }
    Ok(Options {
        tolerance: spec.tolerance,
        template: template_options(spec)?,
        verify_token,
    })
}

fn template_options(spec: &ProviderSpec) -> Result<Option<TemplateOptions>, String> {
    let any = spec.signed.is_some()
        || spec.algorithm.is_some()
        || spec.encoding.is_some()
        || spec.prefix.is_some()
        || spec.timestamp_header.is_some()
        || spec.timestamp_format.is_some()
        || spec.id_header.is_some()
        || spec.hex_key.is_some();
    for name in [
        &spec.signature_header,
        &spec.timestamp_header,
        &spec.id_header,
    ]
    .into_iter()
    .flatten()
    {
        check_header_name(name)?;
    }
    let Some(signature_header) = spec.signature_header.clone() else {
        if any {
            return Err(
                "the template settings need `signature_header` (schemes template and hmac-sha256)"
                    .into(),
            );
        }
        return Ok(None);
    };
    Ok(Some(TemplateOptions {
        signature_header,
        signed: spec.signed.clone(),
        algorithm: match spec.algorithm.unwrap_or(AlgorithmName::Sha256) {
            AlgorithmName::Sha1 => Algorithm::Sha1,
            AlgorithmName::Sha256 => Algorithm::Sha256,
            AlgorithmName::Sha512 => Algorithm::Sha512,
        },
        encoding: match spec.encoding.unwrap_or(EncodingName::Hex) {
            EncodingName::Hex => DigestEncoding::Hex,
            EncodingName::Base64 => DigestEncoding::Base64,
        },
        prefix: spec.prefix.clone(),
        timestamp_header: spec.timestamp_header.clone(),
        timestamp_format: match spec.timestamp_format.unwrap_or(TimestampFormatName::Unix) {
            TimestampFormatName::Unix => TimestampFormat::UnixSeconds,
            TimestampFormatName::UnixMs => TimestampFormat::UnixMillis,
            TimestampFormatName::Rfc3339 => TimestampFormat::Rfc3339,
        },
        id_header: spec.id_header.clone(),
        hex_key: spec.hex_key.unwrap_or(false),
    }))
}

/// Where the id and type are: the entry's `event_id` / `event_type` when given, else the
/// scheme's profile (Slack's form handling and batches included).
fn identity(spec: &ProviderSpec, scheme: &dyn Scheme) -> Result<Identity, String> {
    if spec.form_event_id_field.is_some() && scheme.name() != "slack" {
        return Err("`form_event_id_field` applies only to scheme slack".into());
    }
    for source in spec.event_id.iter().chain(&spec.event_type) {
        check_source(source)?;
    }
    let profile = scheme.profile();
    if scheme.name() == "slack" && spec.event_id.is_none() {
        return Ok(Identity::Slack {
            form_id_field: spec
                .form_event_id_field
                .clone()
                .unwrap_or_else(|| DEFAULT_SLACK_FORM_ID_FIELD.to_owned()),
        });
    }
    if let (Some(batch), None) = (&profile.batch, &spec.event_id) {
        return Ok(Identity::Batch(batch.clone()));
    }
    let event_id = match &spec.event_id {
        Some(source) => vec![source.clone()],
        None => profile.event_id.iter().map(FieldSource::from).collect(),
    };
    if event_id.is_empty() {
        return Err(format!(
            "scheme {} needs `event_id = {{ json_pointer = \"/id\" }}` or `{{ header = \"...\" }}`",
            scheme.name()
        ));
    }
    let event_type = match &spec.event_type {
        Some(source) => vec![source.clone()],
        None => profile.event_type.iter().map(FieldSource::from).collect(),
    };
    Ok(Identity::Fields {
        event_id,
        event_type,
    })
}

/// Refuses a source no request could ever satisfy, which would otherwise pass the check and
/// then answer every delivery 400: a pointer without its leading `/`, a header name HTTP does
/// not allow (a space, a colon), an empty list of pointers.
fn check_source(source: &FieldSource) -> Result<(), String> {
    match source {
        FieldSource::JsonPointer(pointer) => check_pointer(pointer),
        FieldSource::JsonPointers(pointers) if pointers.is_empty() => {
            Err("`json_pointers` needs at least one pointer".into())
        }
        FieldSource::JsonPointers(pointers) => pointers.iter().try_for_each(|p| check_pointer(p)),
        FieldSource::Header(name) => check_header_name(name),
        FieldSource::FormField(_) | FieldSource::EveryDelivery => Ok(()),
    }
}

fn check_pointer(pointer: &str) -> Result<(), String> {
    if pointer.is_empty() || pointer.starts_with('/') {
        Ok(())
    } else {
        Err(format!(
            "JSON pointer {pointer:?} must be empty or start with '/'"
        ))
    }
}

fn check_header_name(name: &str) -> Result<(), String> {
    actix_web::http::header::HeaderName::from_str(name)
        .map(drop)
        .map_err(|_| format!("{name:?} is not a valid HTTP header name"))
}

fn check_public_url(url: Option<&str>) -> Result<Option<String>, String> {
    match url {
        Some(url) if url.starts_with("https://") || url.starts_with("http://") => {
            Ok(Some(url.to_owned()))
        }
        Some(_) => Err("`public_url` must be an http:// or https:// URL".into()),
        None => Ok(None),
    }
}

/// The keys, from `secrets` (environment or files) then `public_keys` (inline).
fn keys(
    spec: &ProviderSpec,
    scheme: &dyn Scheme,
    path: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(Vec<inbox_signature::SigningKey>, Vec<String>), String> {
    let takes_public_keys =
        scheme.family() == Family::Asymmetric || scheme.name() == "standard-webhooks";
    if !spec.public_keys.is_empty() && !takes_public_keys {
        return Err(format!(
            "`public_keys` applies only to public-key schemes, not {}",
            scheme.name()
        ));
    }
    let mut keys = Vec::new();
    let mut names = Vec::new();
    for (index, source) in spec.secrets.iter().enumerate() {
        let secret = read_secret(source, path, env)?;
        keys.push(
            scheme
                .key_from_secret(&secret)
                .map_err(|err| format!("secret #{} is not usable: {err}", index + 1))?,
        );
        names.push(source.name.clone().unwrap_or_else(|| index.to_string()));
    }
    for (index, public_key) in spec.public_keys.iter().enumerate() {
        keys.push(
            scheme
                .key_from_secret(public_key)
                .map_err(|err| format!("public key #{} is not usable: {err}", index + 1))?,
        );
        names.push(format!("public-{index}"));
    }
    if keys.is_empty() && !spec.unsigned {
        return Err(
            "no secret configured: add `secrets = [{ env = \"VAR\" }]` (or `{ file = \"path\" }`, or \
             `public_keys = [\"...\"]` for public-key schemes), or set `unsigned = true` to accept \
             unverified requests in local development"
                .into(),
        );
    }
    if !keys.is_empty() && spec.unsigned {
        return Err("`unsigned = true` together with secrets is contradictory".into());
    }
    Ok((keys, names))
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
            let file: PathBuf = config_path.parent().unwrap_or(Path::new(".")).join(file);
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
