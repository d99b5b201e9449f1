//! The operator console's pages in a real headless Chromium (Debian's `chromium`, installed
//! by `scripts/browser.sh`), driven over the DevTools protocol (`support/browser.rs`): what an
//! operator sees matches the store, a filtered list, a task's input key, a live update without
//! a reload, a cancel through the console, the not-found page, and no script error or CSP
//! violation on any page. Skipped, saying so, without Chromium, unless
//! `MCP_TASKS_REQUIRE_BROWSER` is set (CI sets it). `MCP_TASKS_SCREENSHOTS=DIR` keeps the
//! screenshots of the overview and of a task's page there (`docs/` for docs/CONSOLE.md).

use std::time::Duration;

use mcp_tasks::Owner;
use mcp_tasks::console::Console;
use serde_json::json;

use crate::backend::{Backend, Place};
use crate::console::{create, serve, start, wait_status};
use crate::support::browser::Browser;
use crate::support::embedded::req;

const READY: &str = "document.body.dataset.ready === '1'";

/// The text of `selector`, trimmed (`None` when absent).
async fn text(page: &crate::support::browser::Page, selector: &str) -> Option<String> {
    page.text(selector).await.map(|t| t.trim().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_a_real_browser() {
    let Some(browser) = Browser::launch().await else {
        return;
    };
    let place = Place::new(Backend::Redb).await.unwrap();
    let rt = start(&place).await;
    let me = Owner::anonymous();
    let mut quick = Vec::new();
    for i in 0..3 {
        quick.push(
            create(
                &rt,
                &me,
                "quick",
                json!({ "message": format!("copied {i} files") }),
            )
            .await,
        );
    }
    let asks = [
        create(&rt, &me, "ask", json!({})).await,
        create(&rt, &me, "ask", json!({})).await,
    ];
    let boom = create(&rt, &me, "boom", json!({})).await;
    let slow = [
        create(
            &rt,
            &me,
            "slow",
            json!({ "message": "Copying the archive" }),
        )
        .await,
        create(&rt, &me, "slow", json!({})).await,
    ];
    for id in &quick {
        wait_status(&rt, &me, id, "completed").await;
    }
    for id in &asks {
        wait_status(&rt, &me, id, "input_required").await;
    }
    wait_status(&rt, &me, &boom, "failed").await;
    let console = serve(Console::new(&rt).actions(true)).await;
    let base = console.base.clone();
    let shots = std::env::var_os("MCP_TASKS_SCREENSHOTS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::env::temp_dir().join(format!("console-shots-{}", std::process::id()))
        });
    std::fs::create_dir_all(&shots).unwrap();
    let page = browser.new_page(1280, 900).await.expect("a page");

    // The overview's counts are the store's.
    page.goto(&format!("{base}/"))
        .await
        .expect("the overview loads");
    page.wait_until(READY, Duration::from_secs(10))
        .await
        .unwrap();
    let (_, o, _) = crate::console::http(
        reqwest::Method::GET,
        &format!("{base}/api/overview"),
        &[],
        None,
    )
    .await;
    for (status, n) in [
        ("working", 2),
        ("input_required", 2),
        ("completed", 3),
        ("failed", 1),
        ("cancelled", 0),
    ] {
        assert_eq!(o["statuses"][status], n, "the store's {status}");
        assert_eq!(
            text(&page, &format!("#count-{status}")).await.as_deref(),
            Some(n.to_string().as_str()),
            "{status}"
        );
    }
    assert!(
        page.eval("document.querySelector('#throughput-chart') instanceof SVGElement")
            .await
            .unwrap()
            == json!(true)
    );
    page.screenshot_png(&shots.join("console-overview.png"))
        .await
        .expect("a screenshot");

    // `/tasks?status=input_required` lists exactly those.
    page.goto(&format!("{base}/tasks?status=input_required"))
        .await
        .unwrap();
    page.wait_until(READY, Duration::from_secs(10))
        .await
        .unwrap();
    let rows = page
        .eval("Array.from(document.querySelectorAll('#tasks-table tr[data-task-id]')).map(r => [r.dataset.taskId, r.querySelector('td.status').textContent.trim()])")
        .await
        .unwrap();
    let mut listed: Vec<(String, String)> = serde_json::from_value(rows).unwrap();
    listed.sort();
    let mut expected: Vec<(String, String)> = asks
        .iter()
        .map(|a| (a.clone(), "input_required".to_owned()))
        .collect();
    expected.sort();
    assert_eq!(listed, expected);

    // A task that completed with a tool error (`isError: true`) is marked as one, in the
    // list and on its page.
    let oops = create(&rt, &me, "oops", json!({})).await;
    wait_status(&rt, &me, &oops, "completed").await;
    page.goto(&format!("{base}/tasks?tool=oops")).await.unwrap();
    page.wait_until(READY, Duration::from_secs(10))
        .await
        .unwrap();
    let badge = page
        .eval("(b => [b.textContent.trim(), b.className])(document.querySelector('#tasks-table tr[data-task-id] td.status .badge'))")
        .await
        .unwrap();
    assert_eq!(
        badge,
        json!(["completed · tool error", "badge st-failed tool-error"])
    );
    page.goto(&format!("{base}/tasks/{oops}")).await.unwrap();
    page.wait_until(READY, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(
        text(&page, "#task-status").await.as_deref(),
        Some("completed · tool error")
    );
    assert_eq!(
        text(&page, "#result h2").await.map(|t| t.to_lowercase()),
        Some("result (tool error)".to_owned()),
        "(the heading is shown in capitals)"
    );
    page.screenshot_png(&shots.join("console-tool-error.png"))
        .await
        .unwrap();

    // A task's page shows its input key; answering it through MCP turns the open page
    // `completed` within 5 s, without a reload.
    page.goto(&format!("{base}/tasks/{}", asks[0]))
        .await
        .unwrap();
    page.wait_until(READY, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(
        text(&page, "#task-status").await.as_deref(),
        Some("input_required")
    );
    assert!(
        page.eval("!!document.querySelector('[data-input-key=\"approve\"]')")
            .await
            .unwrap()
            == json!(true)
    );
    page.screenshot_png(&shots.join("console-task.png"))
        .await
        .unwrap();
    page.eval("window.__notReloaded = true").await.unwrap();
    let answer = rt
        .handle_json(
            req(1, "tasks/update", json!({
                "taskId": asks[0],
                "inputResponses": { "approve": { "action": "accept", "content": { "ok": true } } },
            }), true),
            &me,
        )
        .await
        .unwrap();
    assert!(answer.get("error").is_none(), "{answer}");
    page.wait_until(
        "document.querySelector('#task-status').textContent.trim() === 'completed'",
        Duration::from_secs(5),
    )
    .await
    .expect("the open page turns completed by itself");
    assert_eq!(
        page.eval("window.__notReloaded === true").await.unwrap(),
        json!(true),
        "no reload"
    );

    // A cancel through the console (actions on): the button, the in-page confirmation.
    page.goto(&format!("{base}/tasks/{}", slow[0]))
        .await
        .unwrap();
    page.wait_until(READY, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(
        text(&page, "#task-message").await.as_deref(),
        Some("Copying the archive")
    );
    page.click("#cancel-task").await.unwrap();
    page.wait_until(
        "!!document.querySelector('#confirm-yes')",
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    page.click("#confirm-yes").await.unwrap();
    wait_status(&rt, &me, &slow[0], "cancelled").await;
    page.wait_until(
        "document.querySelector('#task-status').textContent.trim() === 'cancelled'",
        Duration::from_secs(5),
    )
    .await
    .expect("the page shows the cancellation");
    wait_status(&rt, &me, &slow[1], "working").await;

    // An unknown id: the not-found page, with status 404.
    page.goto(&format!(
        "{base}/tasks/tsk_00000000000000000000000000000000"
    ))
    .await
    .unwrap();
    page.wait_until(READY, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(page.status_of_last_navigation(), Some(404));
    assert!(
        page.eval("!!document.querySelector('#not-found')")
            .await
            .unwrap()
            == json!(true)
    );
    assert!(
        page.eval("document.title")
            .await
            .unwrap()
            .as_str()
            .unwrap()
            .contains("Not found")
    );

    let errors = page.console_errors();
    assert!(
        errors.is_empty(),
        "script errors or CSP violations: {errors:?}"
    );
    drop(console);
    rt.shutdown().await;
    place.finish().await;
}

/// A DNS rebinding, as a browser lives it: a page served under a name the attacker controls
/// that resolves to the console's loopback address (`--host-resolver-rules`) gets a 403 for the
/// page and for every request its script makes to the API: it reads no task, no CSRF token,
/// and cancels nothing. The same console under `127.0.0.1` works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_on_a_rebinding_name_reads_nothing() {
    let Some(browser) =
        Browser::launch_with(&["--host-resolver-rules=MAP attacker.example 127.0.0.1"]).await
    else {
        return;
    };
    let place = Place::new(Backend::Redb).await.unwrap();
    let rt = start(&place).await;
    let me = Owner::anonymous();
    let task = create(&rt, &me, "slow", json!({ "message": "payroll-2026.xlsx" })).await;
    wait_status(&rt, &me, &task, "working").await;
    // The quick start's console: no authentication, actions on.
    let console = serve(Console::new(&rt).actions(true)).await;
    let port = console.base.rsplit(':').next().unwrap().to_owned();
    let page = browser.new_page(1024, 768).await.expect("a page");

    page.goto(&format!("http://attacker.example:{port}/"))
        .await
        .unwrap();
    assert_eq!(page.status_of_last_navigation(), Some(403));
    let body = page.eval("document.body.innerText").await.unwrap();
    assert!(
        !body.to_string().contains("payroll") && !body.to_string().contains(&task),
        "{body}"
    );
    // The page's own script, same-origin under the rebinding name, tries the API.
    let seen = page
        .eval(&format!(
            "Promise.all([\
               fetch('/api/overview').then(r => r.text().then(t => r.status + ' ' + t)),\
               fetch('/api/tasks').then(r => r.text().then(t => r.status + ' ' + t)),\
               fetch('/api/tasks/{task}').then(r => r.text().then(t => r.status + ' ' + t)),\
               fetch('/api/cancel', {{method: 'POST', headers: {{'content-type': 'application/json'}}, body: '{{}}'}}).then(r => r.status + ''),\
             ])"
        ))
        .await
        .unwrap();
    let seen: Vec<String> = serde_json::from_value(seen).unwrap();
    for answer in &seen {
        assert!(answer.starts_with("403"), "{seen:?}");
        assert!(
            !answer.contains("csrf") && !answer.contains("payroll") && !answer.contains(&task),
            "{answer}"
        );
    }
    wait_status(&rt, &me, &task, "working").await;

    // The console itself, under its loopback address, is served.
    page.goto(&format!("{}/tasks/{task}", console.base))
        .await
        .unwrap();
    page.wait_until(READY, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(page.status_of_last_navigation(), Some(200));
    drop(console);
    rt.shutdown().await;
    place.finish().await;
}
