//! Logging set-up shared by both binaries: the same flags, the same format.

use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines, for a terminal.
    Text,
    /// One JSON object per line, for a log pipeline.
    Json,
}

/// Logging flags.
#[derive(Debug, Clone, clap::Args)]
pub struct LogArgs {
    /// Log line format.
    #[arg(long, env = "INBOX_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log filter in tracing's EnvFilter syntax, e.g. `info` or `info,receiver=debug`.
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    pub log: String,
}

impl LogArgs {
    /// Installs the global subscriber; logs go to standard error. A second call is a no-op.
    pub fn init(&self) {
        let filter = EnvFilter::try_new(&self.log).unwrap_or_else(|_| EnvFilter::new("info"));
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr);
        let _already_set = match self.log_format {
            LogFormat::Text => builder.try_init(),
            LogFormat::Json => builder.json().flatten_event(true).try_init(),
        };
    }
}
