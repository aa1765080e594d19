//! TLS for forward targets: rustls with the `ring` provider (no OpenSSL at run time), the
//! system's root certificates or a route's own CA file, and an optional client certificate
//! for targets that require mutual TLS.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Where a route's TLS trust and identity come from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// PEM file of the CA certificates trusted for this route, instead of the system roots
    /// (an internal CA). `None`: the system's root certificates.
    pub ca_file: Option<PathBuf>,
    /// Client certificate chain and its private key (PEM), presented when the target asks for
    /// one (mutual TLS).
    pub client_identity: Option<ClientIdentity>,
}

/// A client certificate chain and its key, both PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    /// The certificate chain, leaf first.
    pub cert_file: PathBuf,
    /// The private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
}

/// Why a route's TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file was unreadable or held nothing usable.
    #[error("{what} {path}: {reason}")]
    File {
        /// Which setting named the file.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The machine has no root certificates and the route names no CA file.
    #[error(
        "no system root certificates found (install the ca-certificates package or set ca_file)"
    )]
    NoSystemRoots,
    /// rustls refused the combination (a key that does not match the certificate, ...).
    #[error("{0}")]
    Rustls(#[from] rustls::Error),
}

/// The system's root certificates, read once per process.
fn system_roots() -> &'static RootCertStore {
    static ROOTS: OnceLock<RootCertStore> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let loaded = rustls_native_certs::load_native_certs();
        for error in &loaded.errors {
            tracing::warn!(error = %error, "reading a system root certificate failed");
        }
        let mut roots = RootCertStore::empty();
        let (added, ignored) = roots.add_parsable_certificates(loaded.certs);
        if ignored > 0 {
            tracing::warn!(
                added,
                ignored,
                "some system root certificates were not usable"
            );
        }
        roots
    })
}

fn certificates(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let file_error = |reason: String| TlsError::File {
        what,
        path: path.to_owned(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|err| file_error(err.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| file_error(err.to_string()))?;
    if certs.is_empty() {
        return Err(file_error("no PEM certificate in it".into()));
    }
    Ok(certs)
}

fn roots_of(settings: &TlsSettings) -> Result<RootCertStore, TlsError> {
    let Some(path) = &settings.ca_file else {
        let roots = system_roots();
        if roots.is_empty() {
            return Err(TlsError::NoSystemRoots);
        }
        return Ok(roots.clone());
    };
    let mut roots = RootCertStore::empty();
    for cert in certificates("ca_file", path)? {
        roots.add(cert).map_err(|err| TlsError::File {
            what: "ca_file",
            path: path.clone(),
            reason: err.to_string(),
        })?;
    }
    Ok(roots)
}

/// The client configuration for one route: its trust anchors, its client identity if any,
/// the `ring` provider and rustls' safe protocol versions.
pub fn client_config(settings: &TlsSettings) -> Result<ClientConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots_of(settings)?);
    let config = match &settings.client_identity {
        None => builder.with_no_client_auth(),
        Some(identity) => {
            let chain = certificates("client_cert", &identity.cert_file)?;
            let key = PrivateKeyDer::from_pem_file(&identity.key_file).map_err(|err| {
                // The key's content never appears in the message, only its file.
                TlsError::File {
                    what: "client_key",
                    path: identity.key_file.clone(),
                    reason: err.to_string(),
                }
            })?;
            builder.with_client_auth_cert(chain, key)?
        }
    };
    Ok(config)
}

/// A short, secret-free description of a TLS failure found in `err`'s cause chain, if the
/// failure was TLS: `certificate of HOST rejected: ...` for certificate errors.
pub fn describe_failure(err: &(dyn std::error::Error + 'static), host: &str) -> Option<String> {
    let tls = find_rustls_error(err)?;
    Some(match tls {
        rustls::Error::InvalidCertificate(reason) => {
            format!("TLS certificate of {host} rejected: {reason:?}")
        }
        other => format!("TLS handshake with {host} failed: {other}"),
    })
}

/// rustls errors reach reqwest's error wrapped in `io::Error`s, whose `source()` skips the
/// wrapped error itself: look inside each of them too.
fn find_rustls_error<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(err) = current {
        if let Some(tls) = err.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        if let Some(inner) = err
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            if let Some(tls) = find_rustls_error(inner) {
                return Some(tls);
            }
        }
        current = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rustls_error_inside_io_errors_is_found_and_names_the_host() {
        let tls = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let wrapped = std::io::Error::other(std::io::Error::other(tls));
        let message = describe_failure(&wrapped, "payments.internal").expect("a TLS failure");
        assert!(message.contains("payments.internal"), "{message}");
        assert!(message.contains("UnknownIssuer"), "{message}");
        let plain = std::io::Error::other("connection refused");
        assert_eq!(describe_failure(&plain, "payments.internal"), None);
    }

    #[test]
    fn a_missing_or_empty_ca_file_is_refused_with_its_path() {
        let settings = TlsSettings {
            ca_file: Some("/nonexistent/ca.pem".into()),
            client_identity: None,
        };
        let err = client_config(&settings).expect_err("missing file");
        assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
    }
}
