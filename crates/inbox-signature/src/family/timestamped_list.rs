//! HMAC schemes whose one header lists a timestamp and one or more digests, Stripe's shape:
//! `t=<unix>,v1=<hex>[,v1=...]` over `"{t}.{body}"` (Stripe, Calendly) or
//! `ts=<unix>;h1=<hex>` over `"{ts}:{body}"` (Paddle). Any listed digest may match (rotation).

use std::time::Duration;

use crate::family::first_match;
use crate::parse::parse_timestamped_list;
use crate::time::check_tolerance;
use crate::{
    Algorithm, KeyError, Outgoing, Profile, Request, Scheme, SignError, Signed, SigningKey,
    Verified, VerifyError,
};

/// A scheme of the timestamped-list shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimestampedList {
    /// The configuration name.
    pub name: &'static str,
    /// The header (lowercase).
    pub header: &'static str,
    /// Between the header's items: `,` or `;`.
    pub separator: char,
    /// The timestamp's key: `t` or `ts`.
    pub time_key: &'static str,
    /// The digests' key: `v1` or `h1`.
    pub digest_key: &'static str,
    /// Between the timestamp and the body in the signed string: `.` or `:`.
    pub joiner: &'static str,
    /// Accepted clock distance, both ways.
    pub tolerance: Duration,
    /// Where ids and types are.
    pub profile: Profile,
}

impl Scheme for TimestampedList {
    fn name(&self) -> &'static str {
        self.name
    }

    fn tolerance(&self) -> Option<Duration> {
        Some(self.tolerance)
    }

    fn signature_headers(&self) -> Vec<&str> {
        vec![self.header]
    }

    fn key_from_secret(&self, secret: &str) -> Result<SigningKey, KeyError> {
        SigningKey::from_bytes(secret.as_bytes())
    }

    fn verify(
        &self,
        request: &Request<'_>,
        keys: &[SigningKey],
        now: i64,
    ) -> Result<Verified, VerifyError> {
        let parsed = parse_timestamped_list(
            request.required(self.header)?,
            self.header,
            self.separator,
            self.time_key,
            self.digest_key,
        )?;
        let timestamp = parsed.timestamp.to_string();
        let key_index = first_match(
            keys,
            Algorithm::Sha256,
            &[timestamp.as_bytes(), self.joiner.as_bytes(), request.body],
            &parsed.signatures,
        )?;
        check_tolerance(parsed.timestamp, now, self.tolerance)?;
        Ok(Verified {
            key_index,
            timestamp: Some(parsed.timestamp),
        })
    }

    fn sign(&self, key: &SigningKey, message: &Outgoing<'_>) -> Result<Signed, SignError> {
        let timestamp = message.timestamp.to_string();
        let digest = key.hmac(
            Algorithm::Sha256,
            &[timestamp.as_bytes(), self.joiner.as_bytes(), message.body],
        );
        let value = format!(
            "{}={timestamp}{}{}={}",
            self.time_key,
            self.separator,
            self.digest_key,
            hex::encode(digest)
        );
        Ok(Signed {
            headers: vec![(self.header.to_owned(), value)],
            body: message.body.to_vec(),
        })
    }

    fn profile(&self) -> Profile {
        self.profile.clone()
    }
}
