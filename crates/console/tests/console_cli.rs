//! The `console` command line: what its help teaches, and the users given one way only.

use std::process::Command;

fn console(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_console"))
        .args(args)
        // The users must come from the arguments below, never from the environment.
        .env_remove("CONSOLE_USERS")
        .env_remove("CONSOLE_USERS_FILE")
        .output()
        .expect("the console binary runs")
}

#[test]
fn the_help_names_every_page_and_every_repair() {
    let help = console(&["--help"]);
    assert!(help.status.success());
    let help = String::from_utf8_lossy(&help.stdout).replace('\n', " ");
    for words in [
        "the routes",
        "the refusals",
        "the audit",
        "abort such a replay",
        "pause or resume routes",
        "skip a blocked key's dead head",
        "release a suppressed replay",
    ] {
        assert!(help.contains(words), "help lacks {words:?}: {help}");
    }
}

#[test]
fn users_inline_and_in_a_file_are_refused_together() {
    let both = console(&[
        "serve",
        "--users",
        "olivia:operator:$argon2id$x",
        "--users-file",
        "/nonexistent/users",
    ]);
    assert!(!both.status.success());
    let error = String::from_utf8_lossy(&both.stderr);
    assert!(error.contains("cannot be used with"), "{error}");
}
