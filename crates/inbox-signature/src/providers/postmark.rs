//! Postmark: no signature; the webhook URL carries HTTP Basic auth (`https://user:pass@...`),
//! which arrives as `Authorization: Basic ...` and is compared in constant time with the
//! configured `user:password`. Type: body `RecordType`.
//!
//! Postmark's records carry no event id, and one message has many records: a delivery per
//! recipient, an open each time it is opened, a click per link. The id joins what tells one
//! record of a message from another, as Postmark's webhook models (postmark.js
//! `models/webhooks/payload`) name the fields, first match wins: a bounce or a spam
//! complaint by its own `ID`; a delivery by `MessageID`, `Recipient` and `DeliveredAt`; an
//! open or a click by `MessageID`, `Recipient` and `ReceivedAt`; a subscription change (its
//! `MessageID` may be null) by `MessageStream`, `Recipient` and `ChangedAt`; another record
//! type by `MessageID`; an inbound message, which has no `RecordType`, by its `MessageID`.

use crate::family::credential::{basic_auth_header, parse_basic_auth};
use crate::family::credential_header::CredentialHeader;
use crate::providers::{fields, Options};
use crate::{Field, KeyError, Scheme};

/// The header carrying the credentials.
pub const HEADER: &str = "authorization";

/// The Basic-auth scheme of Postmark; the secret is `user:password`.
#[must_use]
pub fn scheme() -> CredentialHeader {
    CredentialHeader {
        name: "postmark",
        header: HEADER,
        read: parse_basic_auth,
        write: basic_auth_header,
        check_secret: |secret| {
            if secret.contains(':') {
                Ok(())
            } else {
                Err(KeyError::Invalid(
                    "Basic auth credentials written user:password",
                ))
            }
        },
        profile: fields(
            &[
                Field::joined(&["/RecordType", "/ID"]),
                Field::joined(&["/RecordType", "/MessageID", "/Recipient", "/DeliveredAt"]),
                Field::joined(&["/RecordType", "/MessageID", "/Recipient", "/ReceivedAt"]),
                Field::joined(&["/RecordType", "/MessageStream", "/Recipient", "/ChangedAt"]),
                Field::joined(&["/RecordType", "/MessageID"]),
                Field::pointer("/MessageID"),
            ],
            &[Field::pointer("/RecordType")],
        ),
    }
}

/// Builds the scheme (no options).
///
/// # Errors
/// Never; the signature is the catalog's.
pub fn build(_: &Options) -> Result<Box<dyn Scheme>, String> {
    Ok(Box::new(scheme()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::testing::verify;
    use crate::VerifyError;

    #[test]
    fn basic_auth_must_match_user_and_password() {
        // RFC 7617's example credentials.
        let header = [("Authorization", "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==")];
        assert!(verify(&scheme(), "Aladdin:open sesame", "", &header, b"{}", 0).is_ok());
        assert_eq!(
            verify(&scheme(), "Aladdin:open sesam", "", &header, b"{}", 0),
            Err(VerifyError::NoMatch)
        );
        assert_eq!(
            verify(
                &scheme(),
                "Aladdin:open sesame",
                "",
                &[("Authorization", "Bearer x")],
                b"{}",
                0
            ),
            Err(VerifyError::MalformedHeader(HEADER.into()))
        );
        assert!(scheme().key_from_secret("no-colon").is_err());
    }
}
