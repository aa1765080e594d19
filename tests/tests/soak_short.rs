//! `make soak` in one minute, inside `make test`: the real receiver and worker under a steady
//! signed load lose nothing and answer no error. Its latency is `make soak`'s business.

use std::path::Path;
use std::process::Command;

use inbox_tests::chaos::{bin_dir, free_port, repo_root};
use test_db::TestDatabase;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_minute_soak_loses_nothing_answers_no_error_and_writes_its_report() {
    let db = TestDatabase::new().await;
    let out = std::env::temp_dir().join(format!("soak-short-{}", std::process::id()));
    let addresses: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let status = Command::new(repo_root().join("bench/soak"))
        .env("DATABASE_URL", db.url())
        .env("SOAK_MINUTES", "1")
        .env("SOAK_INTERVAL", "10s")
        .env("SOAK_RATE", "200")
        .env("SOAK_BIN", bin_dir())
        .env("SOAK_OUT", &out)
        .env("SOAK_LISTEN", &addresses[0])
        .env("SOAK_RECEIVER_METRICS", &addresses[1])
        .env("SOAK_WORKER_METRICS", &addresses[2])
        .status()
        .expect("bench/soak runs");
    let soak = read_json(&out.join("soak.json"));
    let report = std::fs::read_to_string(out.join("report.md")).expect("the report is written");
    let chart = std::fs::read_to_string(out.join("chart.svg")).expect("the chart is written");
    std::fs::remove_dir_all(&out).ok();

    assert!(status.success(), "bench/soak failed: {soak}");
    assert_eq!(soak["sent"], 12_000);
    assert_eq!(soak["acked"], 12_000, "every webhook acknowledged");
    assert_eq!(soak["failed"], 0, "no error answers");
    assert_eq!(soak["lost"], 0, "every acknowledged event finished");
    assert_eq!(soak["not_done"], 0, "and finished done");
    assert_eq!(soak["run"]["ledger"]["lines"], 12_000, "one effect each");
    assert_eq!(soak["run"]["ledger"]["events"], 12_000);
    let intervals = soak["intervals"].as_array().expect("intervals");
    assert_eq!(intervals.len(), 6, "one sample every 10 s");
    for interval in intervals {
        assert!(
            interval["wal_bytes"].as_f64().unwrap_or(0.0) > 0.0,
            "{interval}"
        );
        assert!(
            interval["receiver_rss_kib"].as_u64().unwrap_or(0) > 0,
            "{interval}"
        );
        assert!(
            interval["worker_rss_kib"].as_u64().unwrap_or(0) > 0,
            "{interval}"
        );
        assert!(interval["processed_per_s"].as_f64().is_some(), "{interval}");
    }
    assert!(report.contains("- met: nothing lost"), "{report}");
    assert!(report.contains("- met: no error answers"), "{report}");
    assert!(chart.starts_with("<svg"), "{chart}");
}

fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|err| panic!("{} not written: {err}", path.display()));
    serde_json::from_str(&text).expect("soak.json is JSON")
}
