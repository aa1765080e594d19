//! Reading a PostgreSQL connection string the way libpq does, for the parts the driver does
//! not know: `sslmode=verify-ca|verify-full` and `sslrootcert`. Everything else (several
//! hosts, `target_session_attrs`, timeouts, `application_name`, ...) goes to
//! `tokio_postgres::Config` unchanged.
//!
//! Both forms libpq accepts work: `postgres://user:pass@host1,host2/db?sslmode=verify-full`
//! and `host=host1,host2 dbname=db sslmode=verify-full`.

use std::path::PathBuf;
use std::str::FromStr;

use tokio_postgres::config::SslMode;

/// What `sslmode` asks for, with libpq's meanings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// Never TLS.
    Disable,
    /// TLS when the server offers it, else plaintext (libpq's default; `allow` is read as this).
    Prefer,
    /// TLS or nothing; the certificate is checked against `sslrootcert` only when one is given
    /// (or `~/.postgresql/root.crt` exists), as libpq does.
    Require,
    /// TLS, and the certificate must chain to a CA of `sslrootcert`.
    VerifyCa,
    /// As `VerifyCa`, and the certificate must name the host connected to.
    VerifyFull,
}

impl TlsMode {
    fn parse(value: &str) -> Result<Self, UrlError> {
        match value {
            "disable" => Ok(Self::Disable),
            "allow" | "prefer" => Ok(Self::Prefer),
            "require" => Ok(Self::Require),
            "verify-ca" => Ok(Self::VerifyCa),
            "verify-full" => Ok(Self::VerifyFull),
            other => Err(UrlError::InvalidSslMode(other.to_owned())),
        }
    }

    /// The driver's own mode: it knows only whether to ask for TLS and whether to insist.
    fn driver_mode(self) -> SslMode {
        match self {
            Self::Disable => SslMode::Disable,
            Self::Prefer => SslMode::Prefer,
            Self::Require | Self::VerifyCa | Self::VerifyFull => SslMode::Require,
        }
    }

    /// Whether the certificate chain must be checked even without an explicit `sslrootcert`.
    pub fn verifies(self) -> bool {
        matches!(self, Self::VerifyCa | Self::VerifyFull)
    }
}

/// Where the trusted CA certificates come from (`sslrootcert`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCerts {
    /// Not named: libpq's default file `~/.postgresql/root.crt`, used when it exists.
    Default,
    /// A PEM file of one or more CA certificates.
    File(PathBuf),
    /// `sslrootcert=system`: the operating system's trust store, as libpq reads it.
    System,
}

/// A connection string split into the driver's configuration and the TLS policy.
#[derive(Debug, Clone)]
pub struct ParsedUrl {
    /// Everything the driver understands, with `sslmode` reduced to its own three modes.
    pub config: tokio_postgres::Config,
    /// The `sslmode` asked for.
    pub tls_mode: TlsMode,
    /// The `sslrootcert` asked for.
    pub root_certs: RootCerts,
}

/// Why a connection string was refused. Never carries the string itself (it may hold a
/// password).
#[derive(Debug, thiserror::Error)]
pub enum UrlError {
    /// `sslmode` is not one of libpq's values.
    #[error(
        "invalid sslmode {0:?}: expected disable, allow, prefer, require, verify-ca or verify-full"
    )]
    InvalidSslMode(String),
    /// Client certificates are not supported.
    #[error("{0} (client certificates) is not supported")]
    ClientCertificate(&'static str),
    /// A `key=value` string with an unterminated quote or a key without `=`.
    #[error("malformed connection string: {0}")]
    Malformed(&'static str),
    /// The driver refused the rest of the string.
    #[error("invalid connection string: {0}")]
    Driver(#[source] tokio_postgres::Error),
}

/// The options this module handles itself and takes out before the driver sees the string.
struct TlsOptions {
    mode: Option<String>,
    root_cert: Option<String>,
}

impl TlsOptions {
    /// Takes `key` if it is a TLS option; `Ok(false)` leaves it for the driver.
    fn take(&mut self, key: &str, value: &str) -> Result<bool, UrlError> {
        match key {
            "sslmode" => self.mode = Some(value.to_owned()),
            "sslrootcert" => self.root_cert = Some(value.to_owned()),
            "sslcert" => return Err(UrlError::ClientCertificate("sslcert")),
            "sslkey" => return Err(UrlError::ClientCertificate("sslkey")),
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// Parses a connection string (URL or `key=value` form).
pub fn parse(url: &str) -> Result<ParsedUrl, UrlError> {
    let mut options = TlsOptions {
        mode: None,
        root_cert: None,
    };
    let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        strip_url_options(url, &mut options)?
    } else {
        strip_key_value_options(url, &mut options)?
    };
    let mut config = tokio_postgres::Config::from_str(&rest).map_err(UrlError::Driver)?;
    let tls_mode = match options.mode.as_deref() {
        Some(mode) => TlsMode::parse(mode)?,
        None => TlsMode::Prefer,
    };
    config.ssl_mode(tls_mode.driver_mode());
    let root_certs = match options.root_cert.as_deref() {
        None | Some("") => RootCerts::Default,
        Some("system") => RootCerts::System,
        Some(path) => RootCerts::File(PathBuf::from(path)),
    };
    Ok(ParsedUrl {
        config,
        tls_mode,
        root_certs,
    })
}

/// The URL without the TLS options of its query string. The other options are kept as
/// written: the driver reads them percent-decoded only (a `+` is a plus sign, as for libpq),
/// so re-encoding them as a form would turn a `%20` in `options=-c%20...` into a `+` and
/// change what the server is sent.
fn strip_url_options(url: &str, options: &mut TlsOptions) -> Result<String, UrlError> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok(url.to_owned());
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if !options.take(&percent_decoded(key)?, &percent_decoded(value)?)? {
            kept.push(pair);
        }
    }
    Ok(if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    })
}

fn percent_decoded(text: &str) -> Result<String, UrlError> {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .map(String::from)
        .map_err(|_| UrlError::Malformed("a query option that is not UTF-8 once decoded"))
}

/// The `key=value` string without its TLS options.
fn strip_key_value_options(dsn: &str, options: &mut TlsOptions) -> Result<String, UrlError> {
    let mut kept = Vec::new();
    for (key, value) in key_value_pairs(dsn)? {
        if !options.take(&key, &value)? {
            kept.push(format!(
                "{key}='{}'",
                value.replace('\\', "\\\\").replace('\'', "\\'")
            ));
        }
    }
    Ok(kept.join(" "))
}

/// Splits libpq's `key=value key='quoted \' value'` form into pairs.
fn key_value_pairs(dsn: &str) -> Result<Vec<(String, String)>, UrlError> {
    let mut pairs = Vec::new();
    let mut chars = dsn.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(pairs);
        }
        let key: String =
            std::iter::from_fn(|| chars.next_if(|c| *c != '=' && !c.is_whitespace())).collect();
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return Err(UrlError::Malformed("a key without '='"));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    Some('\'') => break,
                    Some('\\') => value.extend(chars.next()),
                    Some(c) => value.push(c),
                    None => return Err(UrlError::Malformed("an unterminated quote")),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.extend(chars.next());
                } else {
                    value.push(c);
                }
            }
        }
        pairs.push((key, value));
    }
}

/// Where a connection string points, without user or password: for logs and errors.
pub fn describe(config: &tokio_postgres::Config) -> String {
    use tokio_postgres::config::Host;
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(index, host)| {
            let port = ports.get(index).or(ports.first()).copied().unwrap_or(5432);
            match host {
                Host::Tcp(name) => format!("{name}:{port}"),
                #[cfg(unix)]
                Host::Unix(path) => format!("{}:{port}", path.display()),
            }
        })
        .collect();
    format!(
        "{}/{}",
        hosts.join(","),
        config.get_dbname().unwrap_or("(default database)")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_modes_reach_the_driver_as_require_with_the_root_file_kept_aside() {
        let parsed = parse(
            "postgres://u:secret@db1,db2:5433/inbox?sslmode=verify-full&sslrootcert=/ca.pem&target_session_attrs=read-write",
        )
        .unwrap();
        assert_eq!(parsed.tls_mode, TlsMode::VerifyFull);
        assert_eq!(parsed.config.get_ssl_mode(), SslMode::Require);
        assert_eq!(parsed.root_certs, RootCerts::File("/ca.pem".into()));
        assert_eq!(parsed.config.get_hosts().len(), 2);
        assert_eq!(
            parsed.config.get_target_session_attrs(),
            tokio_postgres::config::TargetSessionAttrs::ReadWrite
        );
    }

    #[test]
    fn query_options_reach_the_driver_percent_decoded_only_as_libpq_reads_them() {
        let parsed = parse(
            "postgres://u@h/db?options=-c%20search_path%3Dpublic&application_name=a+b&sslrootcert=/etc/ca%20dir/c+a.pem&sslmode=verify-ca",
        )
        .unwrap();
        assert_eq!(parsed.config.get_options(), Some("-c search_path=public"));
        assert_eq!(parsed.config.get_application_name(), Some("a+b"));
        assert_eq!(
            parsed.root_certs,
            RootCerts::File("/etc/ca dir/c+a.pem".into())
        );
        assert_eq!(parsed.tls_mode, TlsMode::VerifyCa);
    }

    #[test]
    fn key_value_form_is_read_like_the_url_form() {
        let parsed = parse(
            "host=db port=6432 user=inbox password='it''s' dbname=inbox sslmode=verify-ca sslrootcert='/etc/ca dir/ca.pem'",
        );
        assert!(parsed.is_err(), "'' is not an escape in libpq either");
        let parsed = parse(
            "host=db port=6432 user=inbox password='it\\'s' dbname=inbox sslmode=verify-ca sslrootcert='/etc/ca dir/ca.pem'",
        )
        .unwrap();
        assert_eq!(parsed.tls_mode, TlsMode::VerifyCa);
        assert_eq!(
            parsed.root_certs,
            RootCerts::File("/etc/ca dir/ca.pem".into())
        );
        assert_eq!(parsed.config.get_password(), Some(&b"it's"[..]));
        assert_eq!(parsed.config.get_ports(), &[6432]);
    }

    #[test]
    fn default_is_prefer_and_unknown_modes_are_refused_without_echoing_the_url() {
        assert_eq!(
            parse("postgres://u@h/db").unwrap().tls_mode,
            TlsMode::Prefer
        );
        let err = parse("postgres://u:hunter2@h/db?sslmode=verify").unwrap_err();
        assert!(err.to_string().contains("verify-full"), "{err}");
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert!(parse("postgres://u@h/db?sslcert=/c.pem").is_err());
    }

    #[test]
    fn description_names_hosts_and_database_but_no_credentials() {
        let parsed = parse("postgres://u:hunter2@db1:5432,db2:5433/inbox").unwrap();
        assert_eq!(describe(&parsed.config), "db1:5432,db2:5433/inbox");
    }
}
