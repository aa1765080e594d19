//! Static credentials: a shared token in a header (GitLab) or HTTP Basic auth (Postmark and
//! others that put `user:password@` in the webhook URL). Both are compared as hashes in
//! constant time.

use base64::Engine as _;

use crate::parse::DIGEST_BASE64;

/// The `user:password` of an `Authorization: Basic ...` header, or `None` when the header is
/// not Basic auth with base64 of UTF-8 text. The scheme name is case-insensitive.
#[must_use]
pub fn parse_basic_auth(value: &str) -> Option<String> {
    let (scheme, encoded) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = DIGEST_BASE64.decode(encoded.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    text.contains(':').then_some(text)
}

/// The `Authorization` value for `user:password`.
#[must_use]
pub fn basic_auth_header(credentials: &[u8]) -> String {
    format!("Basic {}", DIGEST_BASE64.encode(credentials))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc7617_example_decodes() {
        // RFC 7617 section 2: "Aladdin" / "open sesame".
        assert_eq!(
            parse_basic_auth("Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="),
            Some("Aladdin:open sesame".into())
        );
        assert_eq!(
            basic_auth_header(b"Aladdin:open sesame"),
            "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
        );
        assert_eq!(
            parse_basic_auth("basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="),
            Some("Aladdin:open sesame".into())
        );
    }

    #[test]
    fn other_schemes_and_garbage_are_not_basic_auth() {
        assert_eq!(
            parse_basic_auth("Bearer QWxhZGRpbjpvcGVuIHNlc2FtZQ=="),
            None
        );
        assert_eq!(parse_basic_auth("Basic"), None);
        assert_eq!(parse_basic_auth("Basic !!!"), None);
        assert_eq!(parse_basic_auth("Basic bm9jb2xvbg=="), None); // "nocolon"
    }
}
