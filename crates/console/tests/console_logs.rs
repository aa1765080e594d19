//! What the console's request spans record: the path and the query's parameter names, never
//! their values (an operator's search of the bodies may hold a customer's data). A test binary
//! of its own: it installs the process's global log subscriber, which the console's server
//! threads write through.
#![allow(clippy::unwrap_used)]

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};

use support::{HttpSession, TestConsole, OPERATOR};
use tracing_subscriber::fmt::format::FmtSpan;

/// Log output, shared with the subscriber that writes it.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_request_span_keeps_query_names_but_never_their_values() {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_span_events(FmtSpan::CLOSE)
            .finish(),
    )
    .unwrap();
    let console = TestConsole::start(false).await;
    let session = HttpSession::log_in(&console, OPERATOR).await;

    let page = session
        .get(
            &console,
            "/events?provider=stripe&body=%7B%22email%22%3A%22jane.doe%40example.com%22%7D",
        )
        .await;
    assert_eq!(page.status(), 200);

    let logged = String::from_utf8_lossy(&captured.0.lock().unwrap()).into_owned();
    assert!(
        logged.contains("/events?provider=[redacted]&body=[redacted]"),
        "{logged}"
    );
    assert!(
        !logged.contains("jane.doe"),
        "a body search logged: {logged}"
    );
    assert!(
        !logged.contains("stripe"),
        "a filter value logged: {logged}"
    );
}
