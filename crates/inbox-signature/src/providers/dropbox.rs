//! Dropbox: `X-Dropbox-Signature: <hex HMAC-SHA256(app secret, body)>`; no timestamp.
//! Notifications carry no id (they only list the accounts that changed), so every delivery is
//! its own event. Handshake: `GET ?challenge=...`, echoed as text/plain (the receiver adds
//! `X-Content-Type-Options: nosniff` so the echo cannot become reflected script).

use crate::family::template::Template;
use crate::providers::{fields, template_scheme, Options};
use crate::{
    Algorithm, DigestEncoding, Field, HandshakeKind, HandshakeReply, Request, Scheme, SigningKey,
    VerifyError,
};

/// The Dropbox scheme.
#[derive(Debug, Clone)]
pub struct Dropbox(pub Template);

/// The Dropbox scheme.
#[must_use]
pub fn scheme() -> Dropbox {
    Dropbox(Template::body_only(
        "dropbox",
        "x-dropbox-signature",
        None,
        DigestEncoding::Hex,
        Algorithm::Sha256,
        fields(&[Field::EveryDelivery], &[]).with_handshake(HandshakeKind::Get),
    ))
}

/// Builds the scheme (no options).
///
/// # Errors
/// Never; the signature is the catalog's.
pub fn build(_: &Options) -> Result<Box<dyn Scheme>, String> {
    Ok(Box::new(scheme()))
}

/// The value of `name` in a query string, percent-decoded.
pub(crate) fn query_value(query: &str, name: &str) -> Option<String> {
    form_urlencoded::parse(query.as_bytes())
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.into_owned())
}

template_scheme!(Dropbox {
    fn handshake(
        &self,
        request: &Request<'_>,
        _key: Option<&SigningKey>,
    ) -> Option<Result<HandshakeReply, VerifyError>> {
        if request.method != "GET" {
            return None;
        }
        Some(
            query_value(request.query(), "challenge")
                .map(|challenge| HandshakeReply::ok(
                    "text/plain",
                    challenge.into_bytes(),
                ))
                .ok_or(VerifyError::MalformedBody("GET without challenge")),
        )
    }
});

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::testing::assert_vector;

    #[test]
    fn dropbox_vector_verifies() {
        // No official SDK verifies these: `openssl dgst -sha256 -hmac dropbox-app-secret`,
        // confirmed with Python's hmac module.
        assert_vector(
            &scheme(),
            "dropbox-app-secret",
            "",
            &[("X-Dropbox-Signature", "450ef9f57aef4016f16da031b9d4597c8f4672296e2d3b8d98fd21af6db3fd6a")],
            br#"{"list_folder":{"accounts":["dbid:AAH4f99T0taONIb-OurWxbNQ6ywGRopQngc"]},"delta":{"users":[12345678]}}"#,
            0,
        );
    }

    #[test]
    fn the_challenge_is_echoed_decoded() {
        let headers: [(&str, &str); 0] = [];
        let request = Request {
            method: "GET",
            url: "https://hooks.example.com/webhooks/dropbox?challenge=a%20b%3Cscript%3E",
            headers: &headers,
            body: b"",
        };
        let reply = scheme()
            .handshake(&request, None)
            .expect("GET")
            .expect("answered");
        assert_eq!(reply.body, b"a b<script>");
        assert_eq!(reply.content_type, "text/plain");
        let post = Request::post(&headers, b"{}");
        assert!(scheme().handshake(&post, None).is_none());
    }
}
