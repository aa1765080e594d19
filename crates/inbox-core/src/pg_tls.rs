//! TLS to PostgreSQL through rustls (ring provider), checking the server's certificate as
//! libpq's `sslmode` says: not at all (`prefer`, `require` without a root file), its chain
//! (`verify-ca`, or `require` with one), or its chain and host name (`verify-full`).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{self, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};

use crate::pg_url::{RootCerts, TlsMode};

/// Why the TLS settings could not be built. Names files, never secrets.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    /// `sslmode=verify-*` without a root file, and none at libpq's default place.
    #[error("sslmode={0} needs sslrootcert (a PEM file of the CA that signed the server's certificate, or sslrootcert=system)")]
    NoRootCertificate(&'static str),
    /// The root file could not be read or holds no certificate.
    #[error("cannot read the CA certificates of sslrootcert={path}: {reason}")]
    RootFile {
        /// The file named.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// rustls refused the configuration.
    #[error("cannot build the TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The TLS connector given to the driver; one per connection string, cheap to clone.
#[derive(Clone)]
pub struct PgTls {
    config: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for PgTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTls").finish_non_exhaustive()
    }
}

impl PgTls {
    /// The connector for `mode` and `roots`; reads the root file now, so a wrong path fails
    /// at start-up rather than at the first connection.
    pub fn new(mode: TlsMode, roots: &RootCerts) -> Result<Self, TlsSetupError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let roots = load_roots(mode, roots)?;
        let chain = match roots {
            None => None,
            Some((store, source)) => Some(ChainCheck {
                webpki: WebPkiServerVerifier::builder_with_provider(
                    Arc::new(store),
                    provider.clone(),
                )
                .build()
                .map_err(|err| TlsSetupError::Rustls(rustls::Error::General(err.to_string())))?,
                check_host_name: mode == TlsMode::VerifyFull,
                source,
            }),
        };
        let verifier = Arc::new(PgCertVerifier {
            provider: provider.clone(),
            chain,
        });
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        // PostgreSQL 17 expects this ALPN for direct TLS; older servers ignore it.
        config.alpn_protocols = vec![b"postgresql".to_vec()];
        Ok(Self {
            config: Arc::new(config),
        })
    }
}

/// The trusted roots and a description of where they came from, or `None` when the
/// certificate is not to be checked.
fn load_roots(
    mode: TlsMode,
    roots: &RootCerts,
) -> Result<Option<(RootCertStore, String)>, TlsSetupError> {
    let path = match roots {
        RootCerts::System => {
            let loaded = rustls_native_certs::load_native_certs();
            let mut store = RootCertStore::empty();
            store.add_parsable_certificates(loaded.certs);
            if store.is_empty() {
                return Err(TlsSetupError::RootFile {
                    path: "system".to_owned(),
                    reason: "no usable certificate in the system's trust store \
                             (install ca-certificates)"
                        .to_owned(),
                });
            }
            return Ok(Some((store, "sslrootcert=system".to_owned())));
        }
        RootCerts::File(path) => path.clone(),
        RootCerts::Default => match default_root_file() {
            Some(path) if path.exists() => path,
            _ if mode.verifies() => {
                let name = if mode == TlsMode::VerifyFull {
                    "verify-full"
                } else {
                    "verify-ca"
                };
                return Err(TlsSetupError::NoRootCertificate(name));
            }
            _ => return Ok(None),
        },
    };
    let shown = path.display().to_string();
    let failed = |reason: String| TlsSetupError::RootFile {
        path: shown.clone(),
        reason,
    };
    let mut store = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(&path).map_err(|err| failed(err.to_string()))? {
        let cert = cert.map_err(|err| failed(err.to_string()))?;
        store.add(cert).map_err(|err| failed(err.to_string()))?;
    }
    if store.is_empty() {
        return Err(failed("no certificate in the file".to_owned()));
    }
    Ok(Some((store, format!("sslrootcert={shown}"))))
}

/// libpq's default root file, `~/.postgresql/root.crt`.
fn default_root_file() -> Option<std::path::PathBuf> {
    let home = std::env::var_os("HOME")?;
    Some(std::path::Path::new(&home).join(".postgresql/root.crt"))
}

/// What the certificate is checked against: nothing (`prefer`, `require` without a root file,
/// libpq's meaning: it protects against passive listeners only), or the chain and, for
/// `verify-full`, the host name. In every case the handshake signature is checked, so the
/// server holds the key of the certificate it shows.
#[derive(Debug)]
struct PgCertVerifier {
    provider: Arc<CryptoProvider>,
    chain: Option<ChainCheck>,
}

#[derive(Debug)]
struct ChainCheck {
    webpki: Arc<WebPkiServerVerifier>,
    check_host_name: bool,
    /// Where the roots came from, for the refusal message.
    source: String,
}

/// A certificate refusal worded for the person reading the log.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Refusal(String);

fn refuse(message: String) -> rustls::Error {
    rustls::Error::InvalidCertificate(CertificateError::Other(rustls::OtherError(Arc::new(
        Refusal(message),
    ))))
}

impl ChainCheck {
    /// The chain verified, and the host name unless `verify-ca`; says in plain words which
    /// of the two failed.
    fn verify(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let result = self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        );
        match result {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.check_host_name => Ok(ServerCertVerified::assertion()),
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Err(refuse(format!(
                "the server's certificate is not valid for host name {}: sslmode=verify-full \
                 needs the host of the connection string among the certificate's names",
                server_name.to_str()
            ))),
            Err(rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer)) => {
                Err(refuse(format!(
                    "the server's certificate is not signed by a CA of {}",
                    self.source
                )))
            }
            other => other,
        }
    }
}

impl ServerCertVerifier for PgCertVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match &self.chain {
            Some(chain) => chain.verify(end_entity, intermediates, server_name, ocsp_response, now),
            None => Ok(ServerCertVerified::assertion()),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

impl<S> MakeTlsConnect<S> for PgTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type TlsConnect = PgTlsConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, host: &str) -> io::Result<PgTlsConnect> {
        let server_name = ServerName::try_from(host.to_owned()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{host:?} is not a host name TLS can check"),
            )
        })?;
        Ok(PgTlsConnect {
            config: self.config.clone(),
            server_name,
        })
    }
}

/// One handshake, for one host of the connection string.
#[derive(Debug)]
pub struct PgTlsConnect {
    config: Arc<rustls::ClientConfig>,
    server_name: ServerName<'static>,
}

impl<S> TlsConnect<S> for PgTlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<PgTlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let connector = tokio_rustls::TlsConnector::from(self.config);
            let stream = connector
                .connect(self.server_name, stream)
                .await
                .map_err(plain_refusal)?;
            Ok(PgTlsStream(stream))
        })
    }
}

/// The handshake's error, with a [`Refusal`] brought out of rustls's wrapping (whose message
/// would show it in debug form).
fn plain_refusal(error: io::Error) -> io::Error {
    let refusal = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .and_then(|tls| match tls {
            rustls::Error::InvalidCertificate(CertificateError::Other(other)) => {
                other.0.downcast_ref::<Refusal>().map(ToString::to_string)
            }
            _ => None,
        });
    match refusal {
        Some(message) => io::Error::new(io::ErrorKind::InvalidData, message),
        None => error,
    }
}

/// An encrypted connection to the server.
#[derive(Debug)]
pub struct PgTlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S> tokio_postgres::tls::TlsStream for PgTlsStream<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    fn channel_binding(&self) -> ChannelBinding {
        // tls-server-end-point needs the hash of the certificate's own signature algorithm;
        // offering none makes SCRAM run without channel binding rather than risk a wrong one.
        ChannelBinding::none()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for PgTlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for PgTlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
