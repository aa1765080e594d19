//! Static-credential schemes: the credential travels in one header (GitLab's token as it is,
//! Basic auth's `user:password` encoded) and is compared as a hash in constant time.

use crate::{
    Family, KeyError, Outgoing, Profile, Request, Scheme, SignError, Signed, SigningKey, Verified,
    VerifyError,
};

/// A static-credential scheme.
#[derive(Debug, Clone)]
pub struct CredentialHeader {
    /// The configuration name.
    pub name: &'static str,
    /// The header carrying the credential (lowercase).
    pub header: &'static str,
    /// The credential in a header value, or `None` when the value is malformed.
    pub read: fn(&str) -> Option<String>,
    /// The header value carrying a credential.
    pub write: fn(&[u8]) -> String,
    /// Checks a configured secret's form.
    pub check_secret: fn(&str) -> Result<(), KeyError>,
    /// Where ids and types are.
    pub profile: Profile,
}

impl Scheme for CredentialHeader {
    fn name(&self) -> &'static str {
        self.name
    }

    fn family(&self) -> Family {
        Family::Credential
    }

    fn signature_headers(&self) -> Vec<&str> {
        vec![self.header]
    }

    fn key_from_secret(&self, secret: &str) -> Result<SigningKey, KeyError> {
        (self.check_secret)(secret)?;
        SigningKey::credential(secret.as_bytes())
    }

    fn verify(
        &self,
        request: &Request<'_>,
        keys: &[SigningKey],
        _now: i64,
    ) -> Result<Verified, VerifyError> {
        let credential = (self.read)(request.required(self.header)?)
            .ok_or_else(|| VerifyError::MalformedHeader(self.header.to_owned()))?;
        keys.iter()
            .position(|key| key.credential_matches(credential.as_bytes()))
            .map(|key_index| Verified {
                key_index,
                timestamp: None,
            })
            .ok_or(VerifyError::NoMatch)
    }

    fn sign(&self, key: &SigningKey, message: &Outgoing<'_>) -> Result<Signed, SignError> {
        let credential = key.credential_secret().ok_or(SignError::WrongKey)?;
        Ok(Signed {
            headers: vec![(self.header.to_owned(), (self.write)(credential))],
            body: message.body.to_vec(),
        })
    }

    fn profile(&self) -> Profile {
        self.profile.clone()
    }
}
