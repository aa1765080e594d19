//! `inbox-bench wait-drained` ends a drain's timing only once the queue is empty: its poll
//! starts from the lowest row it last found live, and must still see a row that stays when
//! rows on either side of it are gone.

use std::process::{Command, Output};

use diesel_async::SimpleAsyncConnection;
use inbox_tests::chaos::bin_dir;
use test_db::TestDatabase;

fn inbox_bench(args: &[&str]) -> Output {
    Command::new(bin_dir().join("inbox-bench"))
        .args(args)
        .output()
        .expect("inbox-bench runs")
}

fn wait_drained(db: &TestDatabase) -> Output {
    inbox_bench(&[
        "wait-drained",
        "--database-url",
        db.url(),
        "--events",
        "3",
        "--timeout",
        "1s",
    ])
}

fn not_drained(output: &Output) -> bool {
    !output.status.success() && String::from_utf8_lossy(&output.stderr).contains("not drained")
}

#[tokio::test]
async fn the_drain_ends_when_the_last_row_leaves_the_queue_not_before() {
    let db = TestDatabase::new().await;
    let prefill = inbox_bench(&["prefill", "--database-url", db.url(), "--events", "3"]);
    assert!(prefill.status.success(), "{prefill:?}");
    let mut conn = db.connect().await;

    let full = wait_drained(&db);
    assert!(not_drained(&full), "three rows left: {full:?}");

    // The lowest and the highest rows leave; the middle one stays.
    conn.batch_execute(
        "DELETE FROM inbox_queue WHERE id IN ((SELECT min(id) FROM inbox_queue), \
                                              (SELECT max(id) FROM inbox_queue))",
    )
    .await
    .expect("two rows deleted");
    let one_left = wait_drained(&db);
    assert!(not_drained(&one_left), "one row left: {one_left:?}");

    conn.batch_execute("DELETE FROM inbox_queue")
        .await
        .expect("the last row deleted");
    let drained = wait_drained(&db);
    assert!(drained.status.success(), "{drained:?}");
    let report: serde_json::Value =
        serde_json::from_slice(&drained.stdout).expect("a JSON line on stdout");
    assert_eq!(report["events"], 3);
}
