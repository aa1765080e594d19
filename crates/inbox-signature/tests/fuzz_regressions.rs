//! Every input a fuzzer ever crashed on stays a test, on the stable toolchain: each file under
//! `fuzz/regressions/<target>/` (crashes, plus a seed or two per target) runs through the
//! target's own body, `fuzz/src/targets.rs`, and must not panic.

use std::path::{Path, PathBuf};

#[allow(dead_code)] // the fuzz crate uses all of it; this test needs only the table
#[path = "../fuzz/src/targets.rs"]
mod targets;

fn regressions() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions")
}

fn files_in(folder: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(folder)
        .unwrap_or_else(|err| panic!("{}: {err}", folder.display()))
        .filter_map(|entry| Some(entry.ok()?.path()))
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_kept_fuzz_input_runs_through_its_target_without_panicking() {
    let mut failures = Vec::new();
    for (name, run) in targets::TARGETS {
        let files = files_in(&regressions().join(name));
        assert!(
            !files.is_empty(),
            "fuzz/regressions/{name}/ is empty: keep at least one seed per target"
        );
        for file in files {
            let data =
                std::fs::read(&file).unwrap_or_else(|err| panic!("{}: {err}", file.display()));
            if std::panic::catch_unwind(|| run(&data)).is_err() {
                failures.push(file.display().to_string());
            }
        }
    }
    assert!(
        failures.is_empty(),
        "fuzz regressions that panic: {failures:#?}"
    );
}

#[test]
fn every_regressions_folder_belongs_to_a_target() {
    for entry in std::fs::read_dir(regressions()).unwrap_or_else(|err| panic!("{err}")) {
        let path = entry.unwrap_or_else(|err| panic!("{err}")).path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        assert!(
            targets::target(&name).is_some(),
            "fuzz/regressions/{name} matches no fuzz target"
        );
    }
}
