//! `cave run --runtime kernel`, through the binary.

use crate::support::{TestServer, answer};
use serde_json::{Value as Json, json};
use std::process::{Command, Output};

const KEY: &str = "sk-kernel-test-secret-7777";

fn block(code: &str) -> String {
    format!("```python\n{code}\n```")
}

/// `cave run --json --runtime RUNTIME ARGS` against the test server.
fn command(server: &TestServer, runtime: &str, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cave"));
    command
        .args(["run", "--json", "--runtime", runtime])
        .args(args)
        .env("LLM_MODEL_ID", "test-model")
        .env("LLM_BASE_URL", server.base_url())
        .env("LLM_API_KEY", KEY);
    command
}

fn cave(server: &TestServer, args: &[&str]) -> Output {
    command(server, "kernel", args)
        .output()
        .expect("the binary runs")
}

fn events(output: &Output) -> Vec<Json> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

fn results(events: &[Json]) -> Vec<&Json> {
    events
        .iter()
        .filter(|e| e["type"] == "execution_result" || e["type"] == "execution_timeout")
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn variables_files_and_retrieval_work_on_the_kernel() {
    let dir = std::env::temp_dir().join(format!("cave-cli-kernel-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let module = dir.join("tools.py");
    std::fs::write(
        &module,
        "def double(x: int) -> int:\n    \"\"\"Twice x.\"\"\"\n    return 2 * x\n",
    )
    .expect("writes");
    let server = TestServer::start([
        answer(
            &block("import os\ndata.append(double(4))\nprint(sum(data), os.getpid() != parent)"),
            8,
            "stop",
        ),
        answer("Done.", 8, "stop"),
    ])
    .await;
    let parent = std::process::id().to_string();
    let out = cave(
        &server,
        &[
            "--var",
            "data=[1, 2]",
            "--var",
            &format!("parent={parent}"),
            "--py",
            module.to_str().expect("utf-8 path"),
            "--retrieve",
            "data",
            "Add.",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = events(&out);
    assert_eq!(results(&events)[0]["output"], "11 True\n");
    let retrieved = events
        .iter()
        .find(|e| e["type"] == "retrieved")
        .expect("retrieved");
    assert_eq!(
        retrieved,
        &json!({"type": "retrieved", "name": "data", "value": [1, 2, 8]})
    );
    let system = server.received()[0].body["messages"][0]["content"].clone();
    assert!(
        system
            .as_str()
            .expect("text")
            .contains("double(x: int) -> int")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_is_reported_and_the_model_carries_on() {
    let server = TestServer::start([
        answer(&block("import ctypes\nctypes.string_at(0)"), 8, "stop"),
        answer(&block("print(data, 'lost' in globals())"), 8, "stop"),
        answer("Recovered.", 8, "stop"),
    ])
    .await;
    let out = cave(&server, &["--var", "data=[1]", "Crash, then look."]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = events(&out);
    let results = results(&events);
    assert_eq!(results[0]["success"], false);
    assert_eq!(results[0]["state_lost"], true);
    assert!(
        results[0]["output"]
            .as_str()
            .expect("text")
            .contains("SIGSEGV"),
        "{}",
        results[0]
    );
    assert_eq!(results[1]["output"], "[1] False\n");
    // The model was told its state was lost.
    let second = &server.received()[1].body["messages"];
    let told = second
        .as_array()
        .expect("messages")
        .iter()
        .any(|m| m["content"].as_str().is_some_and(|c| c.contains("SIGSEGV")));
    assert!(told, "{second}");
}

/// A host killed while its cell runs (SIGKILL: nothing of it can clean up) leaves its work
/// directories, with what the cell wrote there; the next `cave` on the kernel runtime removes
/// them once they are old enough to be sure nobody is about to take them.
#[tokio::test(flavor = "multi_thread")]
async fn the_work_directories_of_a_killed_host_are_swept_by_the_next_one() {
    use std::io::{BufRead, BufReader};
    let server = TestServer::start([
        answer(
            &block("open('mine.txt', 'w').write('kept')\nwhile True:\n    pass"),
            16,
            "stop",
        ),
        answer(&block("print(1)"), 8, "stop"),
        answer("Done.", 8, "stop"),
    ])
    .await;
    let mut killed = command(&server, "kernel", &["Spin."])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = killed.id();
    let mut lines = BufReader::new(killed.stdout.take().unwrap()).lines();
    loop {
        let event: Json = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
        if event["type"] == "code" {
            break;
        }
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    killed.kill().unwrap();
    killed.wait().unwrap();
    let prefix = format!("cave-kernel-{pid}-");
    let left = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .map(|e| e.path())
            .collect()
    };
    let dirs = left();
    assert!(
        dirs.iter().any(|d| d.join("mine.txt").exists()),
        "the killed host's directories: {dirs:?}"
    );
    // As if the host had been killed an hour ago.
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    for dir in &dirs {
        std::fs::File::open(dir)
            .unwrap()
            .set_modified(hour_ago)
            .unwrap();
    }
    let next = cave(&server, &["Print."]);
    assert_eq!(
        next.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&next.stderr)
    );
    assert_eq!(left(), Vec::<std::path::PathBuf>::new());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hung_cell_times_out_and_the_key_is_not_in_the_child() {
    let server = TestServer::start([
        answer(&block("while True:\n    try:\n        import time; time.sleep(10)\n    except BaseException:\n        pass"), 8, "stop"),
        answer(&block("import os\nprint(sorted(k for k in os.environ if 'KEY' in k or 'LLM' in k))"), 8, "stop"),
        answer("Done.", 8, "stop"),
    ])
    .await;
    let out = cave(
        &server,
        &["--max-exec-timeout", "500ms", "--memory-limit", "2G", "go"],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = events(&out);
    let results = results(&events);
    assert_eq!(results[0]["type"], "execution_timeout");
    assert_eq!(results[0]["state_lost"], true);
    assert_eq!(results[1]["output"], "[]\n");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!all.contains(KEY));
}

#[test]
fn kernel_options_need_the_kernel_runtime() {
    let out = Command::new(env!("CARGO_BIN_EXE_cave"))
        .args(["run", "--model", "m", "--memory-limit", "1G", "hi"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--memory-limit applies to the kernel runtime"),
        "{stderr}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_cave"))
        .args([
            "run",
            "--model",
            "m",
            "--runtime",
            "kernel",
            "--memory-limit",
            "12X",
            "hi",
        ])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("K, M, G or T"));
}

/// The kernel runtime is sandboxed by default: the model's code cannot read a file the test
/// puts outside its work directory; `--sandbox off` lets it. The layers are reported on
/// stderr, and `cave doctor` lists what the machine supports.
#[tokio::test(flavor = "multi_thread")]
async fn the_kernel_is_sandboxed_by_default() {
    let dir = std::env::temp_dir().join(format!("cave-cli-sandbox-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let secret = dir.join("secret.txt");
    std::fs::write(&secret, "hunter2").expect("writes");
    let code = format!(
        "try:\n    print(open({:?}).read())\nexcept OSError as e:\n    print(type(e).__name__)",
        secret.display().to_string()
    );
    let mut outputs = Vec::new();
    for sandbox in [None, Some("off")] {
        let server =
            TestServer::start([answer(&block(&code), 8, "stop"), answer("Done.", 8, "stop")]).await;
        let mut args = vec!["Read it."];
        if let Some(mode) = sandbox {
            args.splice(0..0, ["--sandbox", mode]);
        }
        let out = cave(&server, &args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(0), "{stderr}");
        let events = events(&out);
        // The layers are said once in the stream too, after the prompt.
        let isolation = events
            .iter()
            .find(|e| e["type"] == "status" && e["status"] == "isolation");
        assert_eq!(isolation.is_some(), sandbox.is_none(), "{events:?}");
        if let Some(isolation) = isolation {
            assert!(
                isolation["layers"][0]
                    .as_str()
                    .unwrap_or_default()
                    .starts_with("network: ")
            );
        }
        outputs.push((
            results(&events)[0]["output"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            stderr,
        ));
    }
    let doctor = Command::new(env!("CARGO_BIN_EXE_cave"))
        .arg("doctor")
        .output()
        .expect("runs");
    let listed = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        listed.contains("Egress allowlist (--allow-net): supported")
            || listed.contains("Egress allowlist (--allow-net): partly: no network namespaces")
            || listed
                .contains("Egress allowlist (--allow-net): unavailable: no network namespaces"),
        "{listed}"
    );
    // What is missing, as the library's checks say (`cargo xtask test` reads this section).
    let missing: Vec<String> = cave_agent::kernel::Need::ALL
        .into_iter()
        .filter_map(cave_agent::kernel::Need::lacking)
        .collect();
    if missing.is_empty() {
        assert!(listed.contains("\nMissing here: nothing\n"), "{listed}");
    } else {
        for line in &missing {
            assert!(listed.contains(&format!("\n  {line}\n")), "{listed}");
        }
    }
    let filesystem_supported = listed.contains("filesystem: supported");
    if filesystem_supported {
        assert_eq!(outputs[0].0, "PermissionError\n");
        assert!(
            outputs[0].1.contains("cave: sandbox: network"),
            "{}",
            outputs[0].1
        );
    } else {
        eprintln!("skipped the sandboxed read: {listed}");
    }
    // The limits come with the sandbox, printed beside its layers; `cave doctor` lists them.
    assert!(
        outputs[0].1.contains("cave: limits: processes ")
            && outputs[0].1.contains("open files 1024, file size 4 GiB"),
        "{}",
        outputs[0].1
    );
    assert_eq!(outputs[1].0, "hunter2\n");
    assert!(!outputs[1].1.contains("cave: sandbox"), "{}", outputs[1].1);
    for layer in ["network", "filesystem", "syscalls", "no_new_privs"] {
        assert!(listed.contains(&format!("  {layer}: ")), "{listed}");
    }
    assert!(
        listed.contains("Processes: processes end with the session"),
        "{listed}"
    );
    assert!(
        listed.contains("Default limits (--sandbox strict): processes ")
            && listed.contains("open files 1024"),
        "{listed}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sandbox_is_a_kernel_option() {
    let out = Command::new(env!("CARGO_BIN_EXE_cave"))
        .args(["run", "--sandbox", "off", "--replay", "/nonexistent", "x"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--sandbox applies to the kernel runtime"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `--secret NAME=ENVVAR`: the code uses the value; stdout never shows it; a missing
/// variable is a usage error naming it. On both runtimes.
#[tokio::test(flavor = "multi_thread")]
async fn secrets_from_the_environment_are_redacted() {
    const VALUE: &str = "ghp-0123456789abcdef";
    for runtime in ["kernel", "inproc"] {
        let server = TestServer::start([
            answer(
                &block("import os\nprint(TOKEN, len(TOKEN), os.environ.get('CAVE_TEST_TOKEN'))"),
                8,
                "stop",
            ),
            answer("Done.", 8, "stop"),
        ])
        .await;
        let out = command(
            &server,
            runtime,
            &["--secret", "TOKEN=CAVE_TEST_TOKEN", "Use it."],
        )
        .env("CAVE_TEST_TOKEN", VALUE)
        .output()
        .expect("runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!stdout.contains(VALUE), "{stdout}");
        let events = events(&out);
        // The value, its length known to the code; the variable gone from the environment.
        assert_eq!(
            results(&events)[0]["output"],
            "[redacted: TOKEN] 20 None\n",
            "{runtime}"
        );
    }
    let out = Command::new(env!("CARGO_BIN_EXE_cave"))
        .args([
            "run",
            "--replay",
            "/nonexistent",
            "--secret",
            "TOKEN=CAVE_TEST_UNSET",
            "x",
        ])
        .env_remove("CAVE_TEST_UNSET")
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("CAVE_TEST_UNSET is not set"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `--approve cells` with `--json`: each `approval_requested` event is answered by a JSON line
/// on stdin; a refusal (with its reason) reaches the model; closed stdin refuses.
#[tokio::test(flavor = "multi_thread")]
async fn cells_wait_for_approval_on_stdin() {
    let server = TestServer::start([
        answer(&block("print('first')"), 8, "stop"),
        answer(&block("print('second')"), 8, "stop"),
        answer("Done.", 8, "stop"),
    ])
    .await;
    let out = crate::cli::with_stdin(
        command(&server, "inproc", &["--approve", "cells", "Go."]),
        b"{\"approve\": false, \"reason\": \"print less\"}\n{\"approve\": true}\n",
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first = events(&out);
    let kinds: Vec<&str> = first
        .iter()
        .filter_map(|e| e["type"].as_str())
        .filter(|t| {
            [
                "approval_requested",
                "execution_refused",
                "execution_result",
            ]
            .contains(t)
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "approval_requested",
            "execution_refused",
            "approval_requested",
            "execution_result"
        ]
    );
    let refused = first
        .iter()
        .find(|e| e["type"] == "execution_refused")
        .unwrap();
    assert_eq!(refused["reason"], "print less");
    let asked = first
        .iter()
        .find(|e| e["type"] == "approval_requested")
        .unwrap();
    assert_eq!(
        asked["request"],
        json!({"kind": "cell", "code": "print('first')"})
    );
    assert_eq!(results(&first)[0]["output"], "second\n");

    // Nobody answers: refused, and the run goes on without running anything.
    let server = TestServer::start([
        answer(&block("print('x')"), 8, "stop"),
        answer("Fine.", 8, "stop"),
    ])
    .await;
    let out = command(&server, "inproc", &["--approve", "cells", "Go."])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("runs");
    let second = events(&out);
    let refused = second
        .iter()
        .find(|e| e["type"] == "execution_refused")
        .expect("refused");
    assert_eq!(refused["reason"], "no answer: stdin is closed");
    assert!(!second.iter().any(|e| e["type"] == "execution_result"));
}

/// `--audit FILE` through the binary: the sandbox layers, the run, its cell and result, the stop.
#[tokio::test(flavor = "multi_thread")]
async fn the_audit_trail_is_appended_to_a_file() {
    let path = std::env::temp_dir().join(format!("cave-cli-audit-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let server = TestServer::start([
        answer(&block("print(6 * 7)"), 8, "stop"),
        answer("42.", 8, "stop"),
    ])
    .await;
    let out = cave(
        &server,
        &["--audit", path.to_str().expect("utf-8"), "Compute."],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let records: Vec<Json> = std::fs::read_to_string(&path)
        .expect("written")
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    let kinds: Vec<&str> = records
        .iter()
        .map(|r| r["kind"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(kinds, ["sandbox", "run", "cell", "cell_result", "stop"]);
    assert!(
        records[0]["layers"][0]
            .as_str()
            .unwrap_or_default()
            .starts_with("network: ")
    );
    assert_eq!(records[3]["output"], "42\n");
    let _ = std::fs::remove_file(&path);
}

/// `--allow-net`: the model's code reaches the listed host through the host's proxy, and a
/// host not listed is refused with the option that would allow it; both are in the audit
/// trail and in the cell's `egress` event; bad entries and options that cannot apply are usage
/// errors.
#[tokio::test(flavor = "multi_thread")]
async fn allow_net_lets_cells_reach_the_listed_hosts_only() {
    use cave_agent::kernel::Need;
    // A route to the proxy: a namespace of the worker's own, or Landlock's TCP rules.
    let lacking = Need::Namespaces.lacking().and_then(|namespaces| {
        let tcp = Need::LandlockTcp
            .lacking()
            .or_else(|| Need::Seccomp.lacking())?;
        Some(format!("{namespaces}; {tcp}"))
    });
    if cave_agent::testing::machine::skips(
        "allow_net_lets_cells_reach_the_listed_hosts_only",
        lacking,
    ) {
        return;
    }
    let listener = std::net::TcpListener::bind("127.0.0.2:0").expect("binds");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        use std::io::{BufRead, BufReader, Write};
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream);
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let _ = reader.get_mut().write_all(
                b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\nconnection: close\r\n\r\nreached",
            );
        }
    });
    let code = format!(
        "import urllib.request\nprint(urllib.request.urlopen('http://127.0.0.2:{port}/').read().decode())\ntry:\n    urllib.request.urlopen('http://127.0.0.9:{port}/')\nexcept Exception as e:\n    print(e)"
    );
    let server =
        TestServer::start([answer(&block(&code), 8, "stop"), answer("Done.", 8, "stop")]).await;
    let allowed = format!("127.0.0.2:{port}");
    let audit =
        std::env::temp_dir().join(format!("cave-egress-audit-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&audit);
    let out = cave(
        &server,
        &[
            "--allow-net",
            &allowed,
            "--audit",
            audit.to_str().unwrap(),
            "Fetch.",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let events = events(&out);
    let output = results(&events)[0]["output"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(output.starts_with("reached\n"), "{output}\n{stderr}");
    assert!(
        output.contains(&format!("--allow-net 127.0.0.9:{port}")),
        "{output}"
    );
    // The cell's connections, in the events before its result.
    let at = |kind: &str| events.iter().position(|e| e["type"] == kind);
    assert!(
        at("egress").is_some() && at("egress") < at("execution_result"),
        "{events:?}"
    );
    let told = &events[at("egress").unwrap_or_default()]["connections"];
    let told = told.as_array().cloned().unwrap_or_default();
    assert!(
        told.iter().any(|c| c["allowed"] == true
            && c["host"] == "127.0.0.2"
            && c["received"].as_u64() > Some(0))
            && told
                .iter()
                .any(|c| c["allowed"] == false && c["host"] == "127.0.0.9"),
        "{told:?}"
    );
    // The ledger adds them up: what was let through and refused, and the bytes both ways.
    let stopped = &events[at("stopped").expect("a stopped event")];
    let ledger = &stopped["ledger"]["egress"];
    let sum = |field: &str| -> u64 { told.iter().filter_map(|c| c[field].as_u64()).sum() };
    assert_eq!(
        ledger["received"].as_u64(),
        Some(sum("received")),
        "{ledger}"
    );
    assert_eq!(ledger["sent"].as_u64(), Some(sum("sent")), "{ledger}");
    assert!(
        ledger["connections"].as_u64() >= Some(1) && ledger["refused"].as_u64() >= Some(1),
        "{ledger}"
    );
    let trail = std::fs::read_to_string(&audit).unwrap_or_default();
    let egress: Vec<Json> = trail
        .lines()
        .filter_map(|l| serde_json::from_str::<Json>(l).ok())
        .filter(|r| r["kind"] == "egress")
        .collect();
    assert!(
        egress.iter().any(|r| r["allowed"] == true
            && r["host"] == "127.0.0.2"
            && r["received"].as_u64() > Some(0)),
        "{trail}"
    );
    assert!(
        egress
            .iter()
            .any(|r| r["allowed"] == false && r["host"] == "127.0.0.9"),
        "{trail}"
    );
    let _ = std::fs::remove_file(&audit);
    for (args, said) in [
        (vec!["--allow-net", "bad host"], "--allow-net \"bad host\""),
        (
            vec!["--allow-net", "pypi.org", "--sandbox", "off"],
            "applies to the strict sandbox",
        ),
        (vec!["--max-egress", "1M"], "add --allow-net"),
    ] {
        let mut all = args.clone();
        all.push("hi");
        let out = cave(&server, &all);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(said), "{args:?}: {stderr}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_cave"))
        .args(["run", "--model", "m", "--allow-net", "pypi.org", "hi"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--allow-net applies to the kernel runtime")
    );
}
