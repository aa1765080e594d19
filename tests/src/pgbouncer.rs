//! A PgBouncer in front of a test server: the distribution's `pgbouncer`, installed when
//! missing (as root, with apt-get, like `scripts/local-postgres` installs PostgreSQL), run as
//! the `postgres` user (it refuses root) on a loopback port of its own, with a configuration
//! written for the test. Dropping it stops it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::chaos::Postgres;

/// A running PgBouncer.
#[derive(Debug)]
pub struct PgBouncer {
    folder: PathBuf,
    /// Its DATABASE_URL (database `postgres` of the upstream server).
    pub url: String,
}

fn binary() -> PathBuf {
    for candidate in ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"] {
        if Path::new(candidate).is_file() {
            return candidate.into();
        }
    }
    install();
    PathBuf::from("/usr/sbin/pgbouncer")
}

/// Installs the distribution's package; panics saying how when it cannot.
fn install() {
    let script =
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer";
    let installed = Command::new("sh")
        .args(["-c", script])
        .stdin(Stdio::null())
        .output()
        .is_ok_and(|output| output.status.success());
    assert!(
        installed,
        "pgbouncer is not installed and installing it failed: run `apt-get install pgbouncer` (as root)"
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .unwrap_or_else(|err| panic!("no free port: {err}"))
}

impl PgBouncer {
    /// Starts one in `pool_mode` (`session`, `transaction`) in front of `upstream`.
    pub async fn start(upstream: &Postgres, pool_mode: &str) -> Self {
        let binary = binary();
        let folder = upstream.folder().join("pgbouncer");
        std::fs::create_dir_all(&folder).unwrap_or_else(|err| panic!("{err}"));
        let port = free_port();
        let config = format!(
            "[databases]\n* = host=127.0.0.1 port={upstream_port}\n\n[pgbouncer]\n\
             listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {folder}/userlist.txt\n\
             pool_mode = {pool_mode}\nmax_client_conn = 200\ndefault_pool_size = 40\n\
             logfile = {folder}/pgbouncer.log\npidfile = {folder}/pgbouncer.pid\n",
            upstream_port = upstream.port(),
            folder = folder.display(),
        );
        std::fs::write(folder.join("pgbouncer.ini"), config).unwrap_or_else(|err| panic!("{err}"));
        std::fs::write(folder.join("userlist.txt"), "\"postgres\" \"\"\n")
            .unwrap_or_else(|err| panic!("{err}"));
        let as_postgres = |program: &str, args: &[&str]| {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--", program]).args(args);
            command
        };
        let _ = Command::new("chown")
            .args(["-R", "postgres:", &folder.to_string_lossy()])
            .status();
        let started = as_postgres(
            &binary.to_string_lossy(),
            &["-d", &folder.join("pgbouncer.ini").to_string_lossy()],
        )
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|err| panic!("starting pgbouncer: {err}"));
        assert!(
            started.status.success(),
            "pgbouncer did not start: {}",
            String::from_utf8_lossy(&started.stderr)
        );
        let bouncer = Self {
            folder,
            url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while test_db::establish(&bouncer.url).await.is_err() {
            assert!(
                Instant::now() < deadline,
                "pgbouncer does not answer on port {port}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bouncer
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let pid = std::fs::read_to_string(self.folder.join("pgbouncer.pid")).unwrap_or_default();
        if let Ok(pid) = pid.trim().parse::<u32>() {
            let _ = Command::new("kill").arg(pid.to_string()).status();
        }
    }
}
