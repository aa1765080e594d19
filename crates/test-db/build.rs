//! Fingerprints `migrations/`, so the migrated template database is rebuilt whenever a
//! migration changes.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::Path;

fn hash_dir(dir: &Path, hasher: &mut DefaultHasher) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<_> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
    paths.sort();
    for path in paths {
        path.file_name().hash(hasher);
        if path.is_dir() {
            hash_dir(&path, hasher);
        } else if let Ok(bytes) = std::fs::read(&path) {
            bytes.hash(hasher);
        }
    }
}

fn main() {
    let migrations = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations");
    println!("cargo:rerun-if-changed={}", migrations.display());
    let mut hasher = DefaultHasher::new();
    hash_dir(&migrations, &mut hasher);
    println!(
        "cargo:rustc-env=MIGRATIONS_FINGERPRINT={:016x}",
        hasher.finish()
    );
}
