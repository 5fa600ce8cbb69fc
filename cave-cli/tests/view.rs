//! `cave view` and `cave run --view`: the page in a real headless Chromium (Debian's, driven
//! through chromedriver with fantoccini), and the server's refusals over plain HTTP.

use crate::support::{TestServer, answer};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::cli::{KEY, block};

/// How long the page may take to show what the tests wait for (a debug build, two cores).
const PATIENCE: Duration = Duration::from_secs(60);

/// `cave` with a clean model environment, pointing at `server` if given.
fn cave(server: Option<&TestServer>) -> Command {
    crate::cli::command(server, &[])
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cave-view-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a temp dir");
    dir
}

/// A running `cave` whose stderr is read line by line; killed when dropped.
struct Running {
    child: Child,
    stderr: BufReader<std::process::ChildStderr>,
    seen: String,
}

impl Running {
    fn start(mut command: Command) -> Self {
        let mut child = command
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cave starts");
        let stderr = BufReader::new(child.stderr.take().expect("piped"));
        Self {
            child,
            stderr,
            seen: String::new(),
        }
    }

    /// The page's address, from the line that says where it is.
    fn url(&mut self) -> String {
        loop {
            let mut line = String::new();
            let read = self.stderr.read_line(&mut line).expect("stderr reads");
            assert!(read > 0, "cave ended without a viewer: {}", self.seen);
            self.seen.push_str(&line);
            if let Some(at) = line.find("http://") {
                let url = &line[at..];
                return url.split_whitespace().next().unwrap().to_owned();
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Chromium and chromedriver: `CAVE_CHROMIUM` and `CAVE_CHROMEDRIVER`, or Debian's. Without
/// them the browser tests skip, and say so; in CI (which installs them) they fail.
fn browser_programs() -> Option<(PathBuf, PathBuf)> {
    let find = |variable: &str, default: &str| {
        let path = std::env::var_os(variable).map_or_else(|| PathBuf::from(default), PathBuf::from);
        path.is_file().then_some(path)
    };
    let found = find("CAVE_CHROMIUM", "/usr/bin/chromium")
        .zip(find("CAVE_CHROMEDRIVER", "/usr/bin/chromedriver"));
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install chromium and chromium-driver (.ci/run does)"
        );
        eprintln!(
            "skipped: no Chromium with chromedriver (apt-get install chromium chromium-driver, or set CAVE_CHROMIUM and CAVE_CHROMEDRIVER)"
        );
    }
    found
}

/// A headless Chromium session through a chromedriver of its own.
struct Browser {
    client: Option<Client>,
    driver: Child,
}

impl Browser {
    async fn start() -> Option<Self> {
        let (chromium, chromedriver) = browser_programs()?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let driver = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let mut browser = Self {
            client: None,
            driver,
        };
        let capabilities = json!({
            "goog:chromeOptions": {
                "binary": chromium,
                // As root (CI) Chromium's own sandbox cannot start; the page is ours.
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1200,1600"],
            }
        });
        let serde_json::Value::Object(capabilities) = capabilities else {
            unreachable!()
        };
        let url = format!("http://127.0.0.1:{port}");
        let mut last = None;
        for _ in 0..200 {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(capabilities.clone())
                .connect(&url)
                .await
            {
                Ok(client) => {
                    browser.client = Some(client);
                    return Some(browser);
                }
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("chromedriver did not start a session: {last:?}");
    }

    fn client(&self) -> &Client {
        self.client.as_ref().expect("connected")
    }

    /// Runs `script` in the current frame and returns its value.
    async fn eval(&self, script: &str) -> serde_json::Value {
        self.client()
            .execute(script, Vec::new())
            .await
            .unwrap_or_else(|e| panic!("{script}: {e}"))
    }

    /// Waits until `script` returns true in the page.
    async fn until(&self, script: &str, what: &str) {
        let started = std::time::Instant::now();
        while started.elapsed() < PATIENCE {
            if self.eval(script).await == json!(true) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let text = self.eval("return document.body.innerText").await;
        panic!("the page did not show {what} within {PATIENCE:?}; it shows:\n{text}");
    }

    async fn texts(&self, css: &str) -> Vec<String> {
        let mut texts = Vec::new();
        for element in self.client().find_all(Locator::Css(css)).await.unwrap() {
            texts.push(element.text().await.unwrap());
        }
        texts
    }

    async fn close(mut self) {
        if let Some(client) = self.client.take() {
            let _ = client.close().await;
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// A cell that prints, waits until `go_on` exists, and prints again.
fn cell_waiting_for(go_on: &Path) -> String {
    format!(
        "import os, time\nprint('first part', flush=True)\nwhile not os.path.exists({:?}):\n    time.sleep(0.05)\nprint('second part')",
        go_on.display().to_string()
    )
}

/// The page's footer holds the session's ledger, of one cell.
async fn assert_footer_has_one_cell(browser: &Browser) {
    let footer = browser.texts("#ledger").await;
    assert!(
        footer.len() == 1 && footer[0].starts_with("session · ") && footer[0].contains("1 cell"),
        "{footer:?}"
    );
}

/// HTML a cell shows that tries to run script: in its own frame, on the page's elements, and
/// through an event handler.
const HOSTILE_HTML: &str = r#"<p id="hostile">inert</p><script>document.body.setAttribute('data-ran', 'yes'); try { parent.document.body.setAttribute('data-ran', 'yes'); parent.document.title = 'owned'; } catch (e) {}</script><img src="nothing.png" onerror="document.body.setAttribute('data-ran', 'yes')">"#;

/// A recorded session (`cave run --json` into a file) with a table, a chart and hostile HTML:
/// the page shows the chart decoded, the table's cells in a frame sized to them, the code
/// highlighted, the model's prose and answer as Markdown, each step's cost and the ledger in
/// the footer; the cell's output does not repeat what the table and chart show; the HTML's
/// script runs nowhere.
#[tokio::test(flavor = "multi_thread")]
async fn a_recorded_session_shows_its_chart_and_table_and_runs_no_cell_script() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let dir = temp_dir("recorded");
    let code = format!(
        "import pandas as pd\nimport matplotlib.pyplot as plt\ndf = pd.DataFrame({{'month': ['May', 'June'], 'sales': [120, 340]}})\ndisplay(df)\nplt.bar(df['month'], df['sales'])\nplt.show()\ndisplay({{'text/html': {HOSTILE_HTML:?}, 'text/plain': 'hostile'}}, raw=True)"
    );
    let server = TestServer::start([
        answer(
            &format!("Let me look at **the sales**.\n\n{}", block(&code)),
            8,
            "stop",
        ),
        answer("June sold **best**: <b>340</b>.", 8, "stop"),
    ])
    .await;
    let events = std::fs::File::create(dir.join("run.jsonl")).unwrap();
    let out = cave(Some(&server))
        .args(["run", "--json", "--display-dir"])
        .arg(dir.join("shown"))
        .arg("Which month sold best? Show a table and a chart.")
        .stdout(events)
        .output()
        .expect("cave runs");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let mut view = cave(None);
    view.arg("view").arg(dir.join("run.jsonl"));
    let mut viewer = Running::start(view);
    let url = viewer.url();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    browser.client().goto(&url).await.unwrap();
    browser
        .until(
            "return document.querySelector('.stopped') !== null",
            "the end of the run",
        )
        .await;

    // The chart: an image the browser decoded.
    browser
        .until(
            "const imgs = [...document.querySelectorAll('figure.display img')]; return imgs.length === 1 && imgs[0].complete && imgs[0].naturalWidth > 100",
            "the chart, decoded",
        )
        .await;
    // The code, highlighted; the cost of each step.
    assert!(
        browser
            .texts(".hl-keyword")
            .await
            .contains(&"import".to_owned()),
        "highlighted code"
    );
    let costs = browser.texts(".cost").await;
    assert_eq!(costs.len(), 2, "{costs:?}");
    assert!(
        costs[0].starts_with("step 1 · ")
            && costs[0].contains(" tokens (")
            && costs[0].contains("cell "),
        "{costs:?}"
    );
    // Markdown, written as HTML by the server; the model's own HTML stays text.
    assert_eq!(
        browser.texts(".answer").await,
        ["June sold best: <b>340</b>."]
    );
    assert_eq!(browser.texts(".answer.markdown strong").await, ["best"]);
    assert_eq!(browser.texts(".text.markdown strong").await, ["the sales"]);
    assert_eq!(
        browser
            .eval("return document.querySelectorAll('.answer b, .answer script').length")
            .await,
        json!(0)
    );
    // The cell printed the table's and the chart's text forms: shown once, as the table and
    // the chart.
    let outputs = browser.texts("pre.output").await;
    assert!(
        outputs
            .iter()
            .all(|o| !o.contains("340") && !o.contains("Figure")),
        "{outputs:?}"
    );
    // The ledger, in the footer.
    assert_footer_has_one_cell(&browser).await;
    assert!(
        browser.texts(".stopped").await[0].starts_with("completed after 2 steps"),
        "{:?}",
        browser.texts(".stopped").await
    );

    // The table, in a frame of its own (no script in it), as tall as the table.
    assert_eq!(
        browser
            .eval("return document.querySelectorAll('figure.display iframe[sandbox=\"allow-same-origin\"]').length")
            .await,
        json!(2)
    );
    browser
        .until(
            "const f = document.querySelector('figure.display iframe'); const d = f.contentDocument; \
             return d !== null && d.querySelectorAll('td').length >= 4 && \
             Math.abs(f.getBoundingClientRect().height - (d.documentElement.scrollHeight + 4)) <= 3",
            "the table's frame sized to the table",
        )
        .await;
    let client = browser.client();
    client.enter_frame(Some(0)).await.unwrap();
    browser
        .until(
            "return document.querySelectorAll('td').length >= 4",
            "the table's cells",
        )
        .await;
    let cells = browser.texts("td").await;
    assert!(
        cells.contains(&"340".to_owned()) && cells.contains(&"June".to_owned()),
        "{cells:?}"
    );
    client.enter_parent_frame().await.unwrap();

    // The hostile HTML: shown, and its script ran neither in its frame nor in the page.
    client.enter_frame(Some(1)).await.unwrap();
    browser
        .until(
            "return document.getElementById('hostile') !== null",
            "the hostile HTML's text",
        )
        .await;
    // Long enough for an `onerror` to have fired had it been allowed.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        browser
            .eval("return document.body.getAttribute('data-ran')")
            .await,
        json!(null),
        "a cell's script ran in its frame"
    );
    client.enter_parent_frame().await.unwrap();
    assert_eq!(
        browser
            .eval("return document.body.getAttribute('data-ran')")
            .await,
        json!(null),
        "a cell's script reached the page"
    );
    assert!(client.title().await.unwrap().starts_with("cave · "));
    browser.close().await;
    drop(viewer);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `cave run --view`: the page shows a cell's output while the cell still runs, then the rest
/// of the session as it happens, then that it ended; `cave` then exits on its own.
#[tokio::test(flavor = "multi_thread")]
async fn a_running_session_updates_its_page_live() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let dir = temp_dir("live");
    let go_on = dir.join("go-on");
    let code = cell_waiting_for(&go_on);
    let server = TestServer::start([
        answer(&block(&code), 8, "stop"),
        answer("Finished.", 8, "stop"),
    ])
    .await;
    let mut run = cave(Some(&server));
    run.args(["run", "--json", "--view", "--display-dir"])
        .arg(&dir)
        .arg("Wait for the file.")
        .stdout(Stdio::piped());
    let mut running = Running::start(run);
    let url = running.url();
    // Stdout (the events) is read as it comes, so that the run never blocks on it.
    let mut stdout = running.child.stdout.take().unwrap();
    let events = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });

    browser.client().goto(&url).await.unwrap();
    browser
        .until(
            "const live = document.querySelector('pre.output.live'); return live !== null && live.textContent.includes('first part')",
            "the running cell's output",
        )
        .await;
    assert_eq!(
        browser
            .eval("return document.querySelector('.stopped') === null && document.getElementById('connection').dataset.state === 'live'")
            .await,
        json!(true),
        "the session is still running"
    );

    std::fs::write(&go_on, "").unwrap();
    browser
        .until(
            "const s = document.querySelector('.stopped'); return s !== null && s.textContent.startsWith('completed')",
            "the end of the run",
        )
        .await;
    let outputs = browser.texts("pre.output").await;
    assert!(
        outputs.iter().any(|o| o.contains("second part")),
        "{outputs:?}"
    );
    assert_eq!(browser.texts(".answer").await, ["Finished."]);
    browser
        .until(
            "return document.getElementById('connection').dataset.state === 'ended'",
            "that the session ended",
        )
        .await;
    let status = running.child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{}", running.seen);
    let events = events.join().unwrap();
    assert!(events.contains("\"type\":\"stopped\""), "{events}");
    assert!(!running.seen.contains(KEY));
    browser.close().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `cave view` serves until it is stopped: by Ctrl-C, or by SIGTERM as a service manager
/// stops it (exit 0 either way).
#[test]
fn the_viewer_stops_at_sigint_or_sigterm() {
    let dir = temp_dir("signals");
    let file = recorded_session(&dir);
    for signal in [libc::SIGINT, libc::SIGTERM] {
        let mut command = cave(None);
        command
            .arg("view")
            .arg(&file)
            .args(["--addr", "127.0.0.1:0"]);
        let mut running = Running::start(command);
        let url = running.url();
        assert!(get(&url, "/", None).0.contains("200"), "{}", running.seen);
        let pid = libc::pid_t::try_from(running.child.id()).unwrap();
        // SAFETY: a signal to the child this test started.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
        let status = running.child.wait().unwrap();
        assert_eq!(status.code(), Some(0), "signal {signal}: {}", running.seen);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Sends one HTTP/1.1 request; the status line and the whole answer.
fn get(url: &str, path: &str, host: Option<&str>) -> (String, String) {
    let authority = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let mut stream = std::net::TcpStream::connect(&authority).expect("connects");
    let host = host.unwrap_or(&authority);
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut bytes = Vec::new();
    stream.read_to_end(&mut bytes).unwrap();
    let answer = String::from_utf8_lossy(&bytes).into_owned();
    let status = answer.lines().next().unwrap_or("").to_owned();
    (status, answer)
}

fn recorded_session(dir: &Path) -> PathBuf {
    let png = dir.join("display-1.png");
    // A 1×1 PNG.
    std::fs::write(
        &png,
        b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x02\0\0\0\x90wS\xde\0\0\0\x0cIDAT\x08\xd7c\xf8\xff\xff?\0\x05\xfe\x02\xfe\xdc\xccY\xe7\0\0\0\0IEND\xaeB`\x82",
    )
    .unwrap();
    let events = [
        json!({"type": "user_prompt", "content": "go", "format_version": 1}),
        json!({"type": "display", "mime_types": ["image/png", "text/plain"], "text": "F",
               "files": {"image/png": "display-1.png"}}),
    ];
    let file = dir.join("run.jsonl");
    let text: String = events.iter().map(|e| format!("{e}\n")).collect();
    std::fs::write(&file, text).unwrap();
    file
}

/// The server answers only to its own name, serves only the files the session names (relative
/// ones beside the file of events), and the page allows only its own script.
#[test]
fn the_viewer_serves_only_this_machine_and_the_sessions_files() {
    let dir = temp_dir("http");
    let file = recorded_session(&dir);
    let mut view = cave(None);
    // From elsewhere: the relative path is read beside the file of events.
    view.arg("view")
        .arg(&file)
        .current_dir(std::env::temp_dir());
    let mut viewer = Running::start(view);
    let url = viewer.url();

    let (status, page) = get(&url, "/", None);
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(
        page.contains("content-security-policy: default-src 'none'; script-src 'self'"),
        "{page}"
    );
    let (status, _) = get(&url, "/", Some("attacker.example:80"));
    assert_eq!(status, "HTTP/1.1 403 Forbidden", "DNS rebinding is refused");
    let (status, image) = get(&url, "/display/1/image/png", None);
    assert_eq!(status, "HTTP/1.1 200 OK", "{image}");
    assert!(image.contains("content-type: image/png"), "{image}");
    assert!(
        image.contains(
            "content-security-policy: sandbox allow-same-origin; default-src 'none'; script-src 'none'"
        ),
        "{image}"
    );
    for missing in [
        "/display/0/image/png",
        "/display/1/text/html",
        "/display/1/..%2f..%2fetc/passwd",
        "/display/99/image/png",
        "/etc/passwd",
    ] {
        let (status, _) = get(&url, missing, None);
        assert_eq!(status, "HTTP/1.1 404 Not Found", "{missing}");
    }
    drop(viewer);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A file that is not there, an address other machines reach: exit 2 with one line that says
/// what to do.
#[test]
fn bad_view_arguments_exit_2() {
    let out = cave(None)
        .args(["view", "/nonexistent/run.jsonl"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("cannot read /nonexistent/run.jsonl"),
        "{stderr}"
    );
    let dir = temp_dir("args");
    let file = recorded_session(&dir);
    let out = cave(None)
        .arg("view")
        .arg(&file)
        .args(["--addr", "0.0.0.0:0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("not a loopback address"), "{stderr}");
    let out = cave(None)
        .args(["run", "--view=192.0.2.1:80", "--replay", "x.jsonl", "go"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--view: 192.0.2.1:80 is not a loopback"),
        "{stderr}"
    );
    // A directory that is not a session's.
    let out = cave(None).arg("view").arg(&dir).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("holds no events.jsonl"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `cave view DIR` on a `--session DIR` that a run is still writing: the page shows the running
/// cell's output, then the end of the run and the session's ledger in the footer.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_directory_is_viewed_while_a_run_writes_it() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let dir = temp_dir("session-dir");
    let session = dir.join("session");
    let go_on = dir.join("go-on");
    let code = cell_waiting_for(&go_on);
    let server = TestServer::start([
        answer(&block(&code), 8, "stop"),
        answer("**Finished.**", 8, "stop"),
    ])
    .await;
    let mut run = cave(Some(&server));
    run.args(["run", "--session"])
        .arg(&session)
        .arg("Wait for the file.")
        .stdout(Stdio::null());
    let mut running = Running::start(run);
    let log = session.join("events.jsonl");
    let started = std::time::Instant::now();
    while !std::fs::read_to_string(&log).is_ok_and(|t| t.contains("first part")) {
        assert!(started.elapsed() < PATIENCE, "the run wrote no events");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut view = cave(None);
    view.arg("view").arg(&session);
    let mut viewer = Running::start(view);
    let url = viewer.url();
    browser.client().goto(&url).await.unwrap();
    browser
        .until(
            "const live = document.querySelector('pre.output.live'); return live !== null && live.textContent.includes('first part') && document.querySelector('.stopped') === null",
            "the running cell's output",
        )
        .await;
    std::fs::write(&go_on, "").unwrap();
    browser
        .until(
            "const s = document.querySelector('.stopped'); return s !== null && s.textContent.startsWith('completed')",
            "the end of the run",
        )
        .await;
    assert_eq!(
        browser.texts(".answer.markdown strong").await,
        ["Finished."]
    );
    assert_footer_has_one_cell(&browser).await;
    let status = running.child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{}", running.seen);
    browser.close().await;
    drop(viewer);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The screenshot in docs/viewer.png: a data-analysis session (a table, a chart, a Markdown
/// answer) in the viewer. Run it to make the picture again:
/// `cargo xtask test -p cave-cli --test tests -- --ignored write_viewer_screenshot`.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "writes docs/viewer.png; run by hand when the viewer changes"]
async fn write_viewer_screenshot() {
    let Some(browser) = Browser::start().await else {
        panic!("the screenshot needs Chromium and chromedriver");
    };
    let dir = temp_dir("screenshot");
    let code = "import pandas as pd\nimport matplotlib.pyplot as plt\nsales = pd.DataFrame({'month': ['March', 'April', 'May', 'June'], 'units': [96, 118, 120, 340], 'returns': [4, 6, 3, 9]})\nsales['net'] = sales['units'] - sales['returns']\ndisplay(sales)\nfig, ax = plt.subplots(figsize=(6, 3))\nax.bar(sales['month'], sales['net'], color='#2f6fdd')\nax.set_title('Net units sold')\nplt.show()";
    let server = TestServer::start([
        answer(
            &format!(
                "I'll load the monthly figures into a **DataFrame**, net out the returns, and chart them.\n\n{}",
                block(code)
            ),
            8,
            "stop",
        ),
        answer(
            "**June** sold best: *331* net units, nearly three times May's.\n\n| month | net |\n|---|---:|\n| May | 117 |\n| June | 331 |\n\nReturns stayed under 3 % every month.",
            8,
            "stop",
        ),
    ])
    .await;
    let events = std::fs::File::create(dir.join("run.jsonl")).unwrap();
    let out = cave(Some(&server))
        .args(["run", "--json", "--price", "2.5,10", "--display-dir"])
        .arg(dir.join("shown"))
        .arg("Which month sold best, net of returns? Show the table and a chart.")
        .stdout(events)
        .output()
        .expect("cave runs");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut view = cave(None);
    view.arg("view").arg(dir.join("run.jsonl"));
    let mut viewer = Running::start(view);
    let url = viewer.url();
    let client = browser.client();
    client.set_window_size(1100, 1500).await.unwrap();
    client.goto(&url).await.unwrap();
    browser
        .until(
            "const img = document.querySelector('figure.display img'); const f = document.querySelector('figure.display iframe'); \
             return document.querySelector('#ledger:not([hidden])') !== null && img !== null && img.complete && img.naturalWidth > 100 && \
             f !== null && f.contentDocument !== null && f.contentDocument.querySelectorAll('td').length >= 16",
            "the whole session",
        )
        .await;
    // The frame's height is set when its document loads.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let png = client.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/viewer.png");
    std::fs::write(&path, png).unwrap();
    eprintln!("wrote {}", path.display());
    browser.close().await;
    drop(viewer);
    std::fs::remove_dir_all(&dir).unwrap();
}
