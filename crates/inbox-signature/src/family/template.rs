//! The HMAC template: a signed string assembled from parts of the request, an HMAC over it,
//! and the digest in one header, hex or base64, behind an optional prefix.
//!
//! Most providers are one instance of it (GitHub, Shopify, Slack, Zoom, Twitch, Square, ...),
//! and the `template` scheme lets a user describe an unlisted provider in the provider file:
//!
//! ```toml
//! scheme = "template"
//! signature_header = "X-Acme-Signature"
//! signed = "{timestamp}.{body}"     # parts: {method} {url} {timestamp} {id} {body}; {{ and }} are braces
//! algorithm = "sha256"              # sha1 | sha256 | sha512
//! encoding = "hex"                  # hex | base64
//! prefix = "v1="
//! timestamp_header = "X-Acme-Timestamp"
//! id_header = "X-Acme-Id"
//! ```
//!
//! The generic `hmac-sha256` scheme is its simplest case: `signed = "{body}"`.

use std::time::Duration;

use crate::family::first_match;
use crate::parse::parse_generic_signature;
use crate::time::{check_tolerance, TimestampFormat};
use crate::{
    Algorithm, DigestEncoding, KeyError, Outgoing, Profile, Request, SignError, Signed, SigningKey,
    Verified, VerifyError,
};

/// One piece of a signed string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// Fixed text.
    Literal(String),
    /// The exact body bytes.
    Body,
    /// The timestamp exactly as the header carries it.
    Timestamp,
    /// The message id exactly as the header carries it.
    Id,
    /// The HTTP method.
    Method,
    /// The full URL the provider called.
    Url,
}

/// Parses a signed-string description such as `v0:{timestamp}:{body}`.
///
/// # Errors
/// A message naming the unknown placeholder or the unbalanced brace.
pub fn parse_signed(text: &str) -> Result<Vec<Part>, String> {
    let mut parts = Vec::new();
    let mut literal = String::new();
    let mut rest = text;
    while let Some(index) = rest.find(['{', '}']) {
        literal.push_str(&rest[..index]);
        let tail = &rest[index..];
        if let Some(after) = tail.strip_prefix("{{") {
            literal.push('{');
            rest = after;
        } else if let Some(after) = tail.strip_prefix("}}") {
            literal.push('}');
            rest = after;
        } else if let Some(after) = tail.strip_prefix('{') {
            let (name, after) = after
                .split_once('}')
                .ok_or_else(|| "a `{` without its `}` in `signed`".to_owned())?;
            let part = match name {
                "body" => Part::Body,
                "timestamp" => Part::Timestamp,
                "id" => Part::Id,
                "method" => Part::Method,
                "url" => Part::Url,
                other => {
                    return Err(format!(
                        "unknown part {{{other}}} in `signed` (known: {{method}} {{url}} {{timestamp}} {{id}} {{body}})"
                    ))
                }
            };
            if !literal.is_empty() {
                parts.push(Part::Literal(std::mem::take(&mut literal)));
            }
            parts.push(part);
            rest = after;
        } else {
            return Err("a lone `}` in `signed` (write `}}` for a brace)".to_owned());
        }
    }
    literal.push_str(rest);
    if !literal.is_empty() {
        parts.push(Part::Literal(literal));
    }
    if !parts.contains(&Part::Body) {
        return Err("`signed` must include {body}".to_owned());
    }
    Ok(parts)
}

/// Where a template's timestamp is and how far it may be from now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimestampSpec {
    /// The header carrying it (lowercase).
    pub header: String,
    /// How it is written.
    pub format: TimestampFormat,
    /// Accepted distance from now, both ways.
    pub tolerance: Duration,
}

/// How a secret string becomes the HMAC key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyEncoding {
    /// The secret's bytes as they are (almost every provider).
    Text,
    /// The secret is hexadecimal; the key is the decoded bytes (Adyen).
    Hex,
}

/// An HMAC-template scheme.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// The configuration name of the scheme.
    pub name: &'static str,
    /// The header carrying the digest (lowercase).
    pub header: String,
    /// Text in front of the digest, such as `sha256=`. When set, it is required.
    pub prefix: Option<String>,
    /// How the digest is written.
    pub encoding: DigestEncoding,
    /// The hash under the HMAC.
    pub algorithm: Algorithm,
    /// The signed string.
    pub signed: Vec<Part>,
    /// The timestamp, when the signed string has one.
    pub timestamp: Option<TimestampSpec>,
    /// The header carrying the message id, when the signed string has one (lowercase).
    pub id_header: Option<String>,
    /// How the secret becomes a key.
    pub key_encoding: KeyEncoding,
    /// Where ids and types are, handshakes, answers.
    pub profile: Profile,
}

impl Template {
    /// HMAC of the body alone in `header`: the shape of GitHub, Shopify and a dozen others.
    #[must_use]
    pub fn body_only(
        name: &'static str,
        header: &str,
        prefix: Option<&str>,
        encoding: DigestEncoding,
        algorithm: Algorithm,
        profile: Profile,
    ) -> Self {
        Self {
            name,
            header: header.to_ascii_lowercase(),
            prefix: prefix.map(str::to_owned),
            encoding,
            algorithm,
            signed: vec![Part::Body],
            timestamp: None,
            id_header: None,
            key_encoding: KeyEncoding::Text,
            profile,
        }
    }

    /// The same template with a timestamp.
    #[must_use]
    pub fn timestamped(self, header: &str, format: TimestampFormat, tolerance: Duration) -> Self {
        Self {
            timestamp: Some(TimestampSpec {
                header: header.to_ascii_lowercase(),
                format,
                tolerance,
            }),
            ..self
        }
    }

    /// The same template signing `signed` (parsed with [`parse_signed`]).
    ///
    /// # Panics
    /// When `signed` is not a valid description: only for the built-in providers' constants.
    #[must_use]
    #[allow(clippy::expect_used)]
    pub fn signing(self, signed: &str) -> Self {
        Self {
            signed: parse_signed(signed).expect("built-in signed strings are valid"),
            ..self
        }
    }

    /// The same template with a message id header.
    #[must_use]
    pub fn with_id_header(self, header: &str) -> Self {
        Self {
            id_header: Some(header.to_ascii_lowercase()),
            ..self
        }
    }

    /// Checks that every part the signed string uses has its source configured, and that
    /// every source configured is signed: a timestamp outside the signed string protects
    /// nothing (anyone can set it to now), yet its tolerance would look like replay protection.
    ///
    /// # Errors
    /// A message naming the missing or unsigned setting.
    pub fn check(&self) -> Result<(), String> {
        if self.signed.contains(&Part::Timestamp) && self.timestamp.is_none() {
            return Err("`signed` uses {timestamp}: set `timestamp_header`".into());
        }
        if self.signed.contains(&Part::Id) && self.id_header.is_none() {
            return Err("`signed` uses {id}: set `id_header`".into());
        }
        if self.timestamp.is_some() && !self.signed.contains(&Part::Timestamp) {
            return Err(
                "`timestamp_header` is set but `signed` does not use {timestamp}: an unsigned \
                 timestamp can be rewritten by anyone; add {timestamp} to `signed` or remove \
                 `timestamp_header`"
                    .into(),
            );
        }
        if self.id_header.is_some() && !self.signed.contains(&Part::Id) {
            return Err(
                "`id_header` is set but `signed` does not use {id}: add {id} to `signed`, or \
                 remove `id_header` (an event id from an unsigned header is \
                 `event_id = { header = \"...\" }`)"
                    .into(),
            );
        }
        Ok(())
    }

    /// The key of a secret.
    ///
    /// # Errors
    /// [`KeyError`] for an empty or undecodable secret.
    pub fn key(&self, secret: &str) -> Result<SigningKey, KeyError> {
        match self.key_encoding {
            KeyEncoding::Text => SigningKey::from_bytes(secret.as_bytes()),
            KeyEncoding::Hex => {
                SigningKey::from_bytes(&hex::decode(secret.trim()).map_err(|_| KeyError::NotHex)?)
            }
        }
    }

    /// Header names carrying signature material.
    #[must_use]
    pub fn headers(&self) -> Vec<&str> {
        let mut names = vec![self.header.as_str()];
        names.extend(self.timestamp.as_ref().map(|spec| spec.header.as_str()));
        names.extend(self.id_header.as_deref());
        names
    }

    /// The headers the signed string covers: the timestamp's and the id's, when it uses them.
    #[must_use]
    pub fn signed_headers(&self) -> Vec<&str> {
        let mut names = Vec::new();
        if self.signed.contains(&Part::Timestamp) {
            names.extend(self.timestamp.as_ref().map(|spec| spec.header.as_str()));
        }
        if self.signed.contains(&Part::Id) {
            names.extend(self.id_header.as_deref());
        }
        names
    }

    /// Verifies `request`.
    ///
    /// # Errors
    /// As [`crate::Scheme::verify`].
    pub fn verify_request(
        &self,
        request: &Request<'_>,
        keys: &[SigningKey],
        now_unix: i64,
    ) -> Result<Verified, VerifyError> {
        let signature = parse_generic_signature(
            request.required(&self.header)?,
            &self.header,
            self.prefix.as_deref(),
            self.encoding,
        )?;
        let timestamp = match &self.timestamp {
            Some(spec) => {
                let text = request.required(&spec.header)?;
                let seconds = spec
                    .format
                    .parse(text)
                    .ok_or_else(|| VerifyError::MalformedHeader(spec.header.clone()))?;
                Some((text, seconds, spec.tolerance))
            }
            None => None,
        };
        let id = match &self.id_header {
            Some(header) => request.required(header)?,
            None => "",
        };
        if self.signed.contains(&Part::Url) && request.url.is_empty() {
            return Err(VerifyError::MissingUrl);
        }
        let text = timestamp.map_or("", |(text, _, _)| text);
        let parts = self.assemble(request.method, request.url, text, id, request.body);
        let key_index = first_match(keys, self.algorithm, &parts, &[signature])?;
        if let Some((_, seconds, tolerance)) = timestamp {
            check_tolerance(seconds, now_unix, tolerance)?;
        }
        Ok(Verified {
            key_index,
            timestamp: timestamp.map(|(_, seconds, _)| seconds),
        })
    }

    /// Signs `message`.
    ///
    /// # Errors
    /// [`SignError::MissingUrl`] when the URL is signed and not given.
    pub fn sign_message(
        &self,
        key: &SigningKey,
        message: &Outgoing<'_>,
    ) -> Result<Signed, SignError> {
        if self.signed.contains(&Part::Url) && message.url.is_empty() {
            return Err(SignError::MissingUrl);
        }
        let timestamp = self
            .timestamp
            .as_ref()
            .map(|spec| spec.format.format(message.timestamp));
        let parts = self.assemble(
            message.method,
            message.url,
            timestamp.as_deref().unwrap_or_default(),
            message.id,
            message.body,
        );
        let digest = key.hmac(self.algorithm, &parts);
        if digest.is_empty() {
            return Err(SignError::WrongKey);
        }
        let mut headers = Vec::new();
        if let (Some(spec), Some(text)) = (&self.timestamp, timestamp) {
            headers.push((spec.header.clone(), text));
        }
        if let Some(header) = &self.id_header {
            headers.push((header.clone(), message.id.to_owned()));
        }
        headers.push((
            self.header.clone(),
            format!(
                "{}{}",
                self.prefix.as_deref().unwrap_or_default(),
                self.encoding.encode(&digest)
            ),
        ));
        Ok(Signed {
            headers,
            body: message.body.to_vec(),
        })
    }

    fn assemble<'a>(
        &'a self,
        method: &'a str,
        url: &'a str,
        timestamp: &'a str,
        id: &'a str,
        body: &'a [u8],
    ) -> Vec<&'a [u8]> {
        self.signed
            .iter()
            .map(|part| match part {
                Part::Literal(text) => text.as_bytes(),
                Part::Body => body,
                Part::Timestamp => timestamp.as_bytes(),
                Part::Id => id.as_bytes(),
                Part::Method => method.as_bytes(),
                Part::Url => url.as_bytes(),
            })
            .collect()
    }
}

/// A [`Template`] as a scheme in its own right (every template-shaped provider and the
/// user-described `template` and `hmac-sha256` schemes).
impl crate::Scheme for Template {
    fn name(&self) -> &'static str {
        self.name
    }

    fn tolerance(&self) -> Option<Duration> {
        self.timestamp.as_ref().map(|spec| spec.tolerance)
    }

    fn signature_headers(&self) -> Vec<&str> {
        self.headers()
    }

    fn signed_headers(&self) -> Vec<&str> {
        Template::signed_headers(self)
    }

    fn key_from_secret(&self, secret: &str) -> Result<SigningKey, KeyError> {
        self.key(secret)
    }

    fn verify(
        &self,
        request: &Request<'_>,
        keys: &[SigningKey],
        now_unix: i64,
    ) -> Result<Verified, VerifyError> {
        self.verify_request(request, keys, now_unix)
    }

    fn sign(&self, key: &SigningKey, message: &Outgoing<'_>) -> Result<Signed, SignError> {
        self.sign_message(key, message)
    }

    fn profile(&self) -> Profile {
        self.profile.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signed_strings_parse_into_parts() {
        assert_eq!(
            parse_signed("v0:{timestamp}:{body}"),
            Ok(vec![
                Part::Literal("v0:".into()),
                Part::Timestamp,
                Part::Literal(":".into()),
                Part::Body
            ])
        );
        assert_eq!(
            parse_signed("{{{method}}}{url}{body}"),
            Ok(vec![
                Part::Literal("{".into()),
                Part::Method,
                Part::Literal("}".into()),
                Part::Url,
                Part::Body
            ])
        );
    }

    fn template(signed: &str) -> Template {
        Template::body_only(
            "template",
            "x-signature",
            None,
            DigestEncoding::Hex,
            Algorithm::Sha256,
            Profile::fields(Vec::new(), Vec::new()),
        )
        .signing(signed)
    }

    #[test]
    fn a_timestamp_or_id_header_outside_the_signed_string_is_refused() {
        let timestamped = |signed| {
            template(signed).timestamped(
                "x-timestamp",
                TimestampFormat::UnixSeconds,
                Duration::from_secs(300),
            )
        };
        assert!(timestamped("{timestamp}.{body}").check().is_ok());
        assert!(timestamped("{body}")
            .check()
            .is_err_and(|e| e.contains("`timestamp_header` is set but `signed` does not use")));
        assert!(template("{id}.{body}")
            .with_id_header("x-id")
            .check()
            .is_ok());
        assert!(template("{body}")
            .with_id_header("x-id")
            .check()
            .is_err_and(|e| e.contains("`id_header` is set but `signed` does not use {id}")));
    }

    #[test]
    fn bad_signed_strings_are_explained() {
        assert!(parse_signed("{timestamp}.").is_err_and(|e| e.contains("{body}")));
        assert!(parse_signed("{nonce}{body}").is_err_and(|e| e.contains("{nonce}")));
        assert!(parse_signed("{body").is_err_and(|e| e.contains("without")));
        assert!(parse_signed("}{body}").is_err_and(|e| e.contains("lone")));
    }
}
