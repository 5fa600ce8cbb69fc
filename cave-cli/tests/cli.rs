//! Running the built binary.

use crate::support::{Reply, TestServer, answer, status_with};
use serde_json::{Value as Json, json};
use std::process::{Command, Output};

pub(crate) const KEY: &str = "sk-cli-test-secret-4242";

pub(crate) fn block(code: &str) -> String {
    format!("```python\n{code}\n```")
}

/// `cave` with a clean model environment, pointing at `server` (with the test key) if given.
pub(crate) fn command(server: Option<&TestServer>, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cave"));
    command
        .args(args)
        .env_remove("LLM_MODEL_ID")
        .env_remove("LLM_BASE_URL")
        .env_remove("LLM_API_KEY")
        // Traces only where a test asks for them.
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    if let Some(server) = server {
        command
            .env("LLM_MODEL_ID", "test-model")
            .env("LLM_BASE_URL", server.base_url())
            .env("LLM_API_KEY", KEY);
    }
    command
}

/// Runs `cave` to completion.
fn cave(server: Option<&TestServer>, args: &[&str]) -> Output {
    command(server, args).output().expect("the binary runs")
}

pub(crate) fn events(output: &Output) -> Vec<Json> {
    String::from_utf8(output.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {l}"))
        })
        .collect()
}

fn kinds(events: &[Json]) -> Vec<String> {
    let mut kinds: Vec<String> = events
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect();
    kinds.dedup();
    kinds
}

async fn server(replies: impl IntoIterator<Item = Reply>) -> TestServer {
    TestServer::start(replies).await
}

#[tokio::test(flavor = "multi_thread")]
async fn json_lines_for_a_two_step_run_with_injection_and_retrieval() {
    let server = server([
        answer(
            &format!("Adding.\n{}", block("data.append(4)\nprint(sum(data))")),
            8,
            "stop",
        ),
        answer("The sum is 10.", 8, "stop"),
    ])
    .await;
    let out = cave(
        Some(&server),
        &[
            "run",
            "--json",
            "--var",
            "data=[1, 2, 3]",
            "--var-desc",
            "data=numbers to sum",
            "--retrieve",
            "data",
            "--retrieve",
            "missing",
            "Sum the numbers.",
        ],
    );
    // `missing` is not bound: exit 1, and one line on stderr that says what is.
    assert_eq!(
        out.status.code(),
        Some(1),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "cave: --retrieve missing: no such variable in the runtime; registered variables: data"
        ),
        "{stderr}"
    );
    let events = events(&out);
    assert_eq!(
        kinds(&events),
        [
            "user_prompt",
            "text",
            "code",
            "execution_output",
            "execution_result",
            "step",
            "text",
            "final_response",
            "step",
            "stopped",
            "retrieved"
        ]
    );
    let result = events
        .iter()
        .find(|e| e["type"] == "execution_result")
        .unwrap();
    assert_eq!(result["output"], "10\n");
    let stopped = events.iter().find(|e| e["type"] == "stopped").unwrap();
    assert_eq!(
        (stopped["stop_reason"].as_str(), stopped["steps"].as_u64()),
        (Some("completed"), Some(2))
    );
    let retrieved: Vec<&Json> = events.iter().filter(|e| e["type"] == "retrieved").collect();
    assert_eq!(
        retrieved,
        [&json!({"type": "retrieved", "name": "data", "value": [1, 2, 3, 4]})],
        "only names that exist are events"
    );
    let system = &server.received()[0].body["messages"][0]["content"];
    assert!(
        system
            .as_str()
            .unwrap()
            .contains("- name: data\n  type: list\n  description: numbers to sum")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_value_json_cannot_hold_comes_back_as_its_repr() {
    let server = server([
        answer(&block("s = {1, 2}\nt = {(1, 2): 'pair'}"), 8, "stop"),
        answer("Done.", 8, "stop"),
    ])
    .await;
    let out = cave(
        Some(&server),
        &["run", "--json", "--retrieve", "t", "--retrieve", "s", "go"],
    );
    let events = events(&out);
    let retrieved: Vec<&Json> = events.iter().filter(|e| e["type"] == "retrieved").collect();
    assert_eq!(
        retrieved[0],
        &json!({"type": "retrieved", "name": "t", "repr": "{(1, 2): 'pair'}", "python_type": "dict"})
    );
    assert_eq!(retrieved[1]["value"], json!([1, 2]));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_that_does_not_complete_exits_1_without_the_key() {
    let echo = json!({"error": {"message": format!("Incorrect API key provided: {KEY}"), "code": "invalid_api_key"}});
    let server = server([status_with(401, &[], echo)]).await;
    let out = cave(Some(&server), &["run", "--json", "hello"]);
    assert_eq!(out.status.code(), Some(1));
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!all.contains(KEY) && !all.contains("4242"), "{all}");
    let stopped = events(&out).pop().unwrap();
    assert_eq!(stopped["stop_reason"], "model_error");
    assert_eq!(stopped["error"]["kind"], "auth");
    assert!(
        stopped["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Incorrect API key provided")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn model_code_cannot_read_the_key() {
    let server = server([
        answer(&block("import os\nprint(os.environ.get('LLM_API_KEY'))\nprint(sorted(k for k in os.environ if 'KEY' in k))"), 8, "stop"),
        answer("Nothing there.", 8, "stop"),
    ])
    .await;
    let out = cave(Some(&server), &["run", "--json", "look"]);
    let result = events(&out)
        .into_iter()
        .find(|e| e["type"] == "execution_result")
        .unwrap();
    assert_eq!(result["output"], "None\n[]\n");
}

#[test]
fn bad_arguments_and_configuration_exit_2_with_one_line() {
    let cases: &[(&[&str], &str)] = &[
        (&["run", "hello"], "LLM_MODEL_ID"),
        (
            &["run", "--model", "m", "--var", "x=not json", "hello"],
            "--var x: its value is not valid JSON",
        ),
        (
            &[
                "run",
                "--model",
                "m",
                "--var",
                "x=@/nonexistent/file.json",
                "hello",
            ],
            "cannot read /nonexistent/file.json",
        ),
        (
            &["run", "--model", "m", "--var", "noequals", "hello"],
            "--var expects NAME=JSON",
        ),
        (
            &["run", "--model", "m", "--var-desc", "y=text", "hello"],
            "which no --var defines",
        ),
        (
            &["run", "--model", "m", "--var", "for=1", "hello"],
            "Python keyword",
        ),
        (&["run", "--no-such-option", "hello"], "--no-such-option"),
        (&["run"], "PROMPT"),
    ];
    for (args, expected) in cases {
        let out = cave(None, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}: nothing on stdout");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_recorded_run_replays_offline() {
    let dir = std::env::temp_dir().join(format!("cave-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cassette = dir.join("session.jsonl");
    let cassette = cassette.to_str().unwrap();
    let server = server([
        answer(&block("x = 6 * 7\nx"), 8, "stop"),
        answer("It is 42.", 8, "stop"),
    ])
    .await;
    let recorded = cave(
        Some(&server),
        &[
            "run",
            "--json",
            "--record",
            cassette,
            "--retrieve",
            "x",
            "Compute.",
        ],
    );
    assert_eq!(recorded.status.code(), Some(0));
    assert!(!std::fs::read_to_string(cassette).unwrap().contains(KEY));
    let replayed = cave(
        None,
        &[
            "run",
            "--json",
            "--replay",
            cassette,
            "--retrieve",
            "x",
            "Compute.",
        ],
    );
    assert_eq!(
        replayed.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&replayed.stderr)
    );
    let strip = |events: Vec<Json>| -> Vec<Json> {
        events
            .into_iter()
            .map(|mut e| {
                if let Some(o) = e.as_object_mut() {
                    for timing in [
                        "elapsed",
                        "duration_ms",
                        "model_seconds",
                        "execution_seconds",
                        // Timings, processor time and memory, which differ between runs.
                        "ledger",
                    ] {
                        o.remove(timing);
                    }
                }
                e
            })
            .collect()
    };
    assert_eq!(strip(events(&replayed)), strip(events(&recorded)));
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test(flavor = "multi_thread")]
async fn python_modules_are_injected_either_way() {
    let dir = std::env::temp_dir().join(format!("cave-cli-py-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exports = dir.join("injection.py");
    std::fs::write(
        &exports,
        "from cave_agent.runtime import Function, Variable\n\ndef double(x: int) -> int:\n    \"\"\"Twice x.\"\"\"\n    return 2 * x\n\n__exports__ = [Function(double), Variable('base', 21, 'the base')]\n",
    )
    .unwrap();
    let plain = dir.join("plain.py");
    std::fs::write(
        &plain,
        "def shout(text: str) -> str:\n    return text.upper()\n",
    )
    .unwrap();
    let server = server([
        answer(&block("print(double(base), shout('ok'))"), 8, "stop"),
        answer("42 OK", 8, "stop"),
    ])
    .await;
    let out = cave(
        Some(&server),
        &[
            "run",
            "--json",
            "--py",
            exports.to_str().unwrap(),
            "--py",
            plain.to_str().unwrap(),
            "go",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result = events(&out)
        .into_iter()
        .find(|e| e["type"] == "execution_result")
        .unwrap();
    assert_eq!(result["output"], "42 OK\n");
    let system = server.received()[0].body["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        system.contains("- function: double(x: int) -> int\n  doc:\n    Twice x."),
        "{system}"
    );
    assert!(
        system.contains("- function: shout(text: str) -> str")
            && system.contains("- name: base\n  type: int\n  description: the base")
    );
    let bad = cave(
        None,
        &["run", "--model", "m", "--py", "/nonexistent/x.py", "go"],
    );
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--py /nonexistent/x.py"));
    std::fs::remove_dir_all(&dir).ok();
}

/// The README's offline quick start: arguments shared by the recording and the replay.
const DEMO_ARGS: &[&str] = &[
    "--var",
    r#"text="the cat sat on the mat and the dog sat on the log""#,
    "--var-desc",
    "text=a sentence to analyse",
    "--retrieve",
    "counts",
    "Which word appears most often in `text`, and how often?",
];

fn demo_cassette() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/examples/demo.jsonl").to_owned()
}

/// Rewrites `examples/demo.jsonl` from a scripted model (run after changing prompt texts):
/// `cargo test -p cave-cli -- --ignored write_demo_cassette`.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "writes examples/demo.jsonl"]
async fn write_demo_cassette() {
    let server = server([
        answer("I'll count the words in `text`.\n```python\nfrom collections import Counter\ncounts = Counter(text.split())\ncounts.most_common(3)\n```", 8, "stop"),
        answer("The most common word is \"the\": it appears 4 times (then \"sat\" and \"on\", twice each).", 8, "stop"),
    ])
    .await;
    let cassette = demo_cassette();
    let mut args = vec!["run", "--record", cassette.as_str()];
    args.extend_from_slice(DEMO_ARGS);
    let out = cave(Some(&server), &args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_shipped_demo_cassette_replays() {
    let cassette = demo_cassette();
    let mut args = vec!["run", "--json", "--replay", cassette.as_str()];
    args.extend_from_slice(DEMO_ARGS);
    let out = cave(None, &args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "if prompts changed, regenerate it: cargo test -p cave-cli -- --ignored write_demo_cassette\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let events = events(&out);
    let result = events
        .iter()
        .find(|e| e["type"] == "execution_result")
        .unwrap();
    assert_eq!(result["output"], "[('the', 4), ('sat', 2), ('on', 2)]\n");
    let retrieved = events.iter().find(|e| e["type"] == "retrieved").unwrap();
    // A Counter is a dict: it comes back as a value.
    assert_eq!(
        retrieved["value"],
        json!({"the": 4, "sat": 2, "on": 2, "cat": 1, "mat": 1, "and": 1, "dog": 1, "log": 1})
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn policy_flags_refuse_code_before_it_runs() {
    let server = server([
        answer(&block("import os\nmarker = 'ran'"), 8, "stop"),
        answer(&block("print(eval('1 + 1'))"), 8, "stop"),
        answer("Both were refused.", 8, "stop"),
    ])
    .await;
    let out = cave(
        Some(&server),
        &[
            "run",
            "--json",
            "--deny-import",
            "os,subprocess",
            "--deny-call",
            "eval",
            "--retrieve",
            "marker",
            "try",
        ],
    );
    // The refused cell's assignment never happened: `marker` is missing, hence status 1.
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("--retrieve marker: no such variable"));
    let events = events(&out);
    let refused: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "security_error")
        .map(|e| e["message"].as_str().unwrap())
        .collect();
    assert_eq!(refused.len(), 2);
    assert!(
        refused[0].contains("Forbidden import 'os' at line 1")
            && refused[1].contains("Forbidden call to 'eval' at line 1")
    );
    assert!(
        !events.iter().any(|e| e["type"] == "execution_result"),
        "nothing ran"
    );
    assert!(!events.iter().any(|e| e["type"] == "retrieved"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_small_window_compacts_with_the_summary_model() {
    let step = || answer(&block("print('x' * 3000)"), 64, "stop");
    let server = server((0..30).map(|_| step())).await;
    let out = cave(
        Some(&server),
        &[
            "run",
            "--json",
            "--context-window",
            "2000",
            "--compact-model",
            "cheap-model",
            "--max-steps",
            "8",
            "go",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "max steps: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = events(&out);
    assert!(
        events
            .iter()
            .any(|e| e["type"] == "status" && e["status"] == "compacted"),
        "{events:?}"
    );
    let models: Vec<String> = server
        .received()
        .iter()
        .map(|r| r.body["model"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        models.contains(&"cheap-model".to_owned()) && models.contains(&"test-model".to_owned()),
        "{models:?}"
    );
    let bad = cave(
        None,
        &["run", "--model", "m", "--context-window", "10", "go"],
    );
    assert_eq!(bad.status.code(), Some(2));
}

#[tokio::test(flavor = "multi_thread")]
async fn stray_output_from_threads_stays_off_the_json_stream() {
    let code = "import threading\nt = threading.Thread(target=lambda: print('from a thread'))\nt.start(); t.join()\nprint('from the cell')";
    // Written while the cell ran, by a thread it started: the cell's output (through the
    // descriptor, so its order against the cell's own prints is not fixed, and it may even
    // land between `print`'s text and its newline, which are two writes).
    let output = json_run_output(code).await;
    assert!(
        output.contains("from a thread")
            && output.contains("from the cell")
            && output.matches('\n').count() == 2,
        "{output:?}"
    );
}

/// Runs one cell through `cave run --json` and returns its `execution_result` output; every
/// stdout line must be an event (`events` panics on anything else).
async fn json_run_output(code: &str) -> String {
    let server = server([answer(&block(code), 16, "stop"), answer("Done.", 8, "stop")]).await;
    let out = cave(Some(&server), &["run", "--json", "go"]);
    assert_eq!(out.status.code(), Some(0));
    let result = events(&out)
        .into_iter()
        .find(|e| e["type"] == "execution_result")
        .unwrap();
    result["output"].as_str().unwrap().to_owned()
}

/// Descriptor-level writes (os.write, a subprocess, C stdio) are the cell's output and never
/// reach the JSON Lines stream.
#[tokio::test(flavor = "multi_thread")]
async fn descriptor_output_is_the_cells_and_never_between_events() {
    let code = "import os, ctypes\nos.write(1, b'raw one\\n')\nos.system('echo child; echo child-err >&2')\nctypes.CDLL(None).printf(b'c stdio\\n')\nos.write(2, b'raw two\\n')";
    let output = json_run_output(code).await;
    for expected in [
        "raw one\n",
        "child\n",
        "child-err\n",
        "c stdio\n",
        "raw two\n",
    ] {
        assert!(
            output.contains(expected),
            "{expected:?} missing: {output:?}"
        );
    }
}

/// `cave chat --json ARGS` against `server`, `input` on stdin until its end.
fn chat(server: &TestServer, args: &[&str], input: &[u8]) -> std::process::Output {
    let mut command = command(Some(server), &["chat", "--json"]);
    command.args(args);
    with_stdin(command, input)
}

/// Runs `command` with `input` on its stdin until its end; its output.
pub(crate) fn with_stdin(mut command: Command, input: &[u8]) -> std::process::Output {
    use std::io::Write as _;
    let mut child = command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("cave runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input)
        .expect("writes");
    child.wait_with_output().expect("ends")
}

/// The output of each cell in a run's events.
fn outputs(events: &[Json]) -> Vec<&str> {
    events
        .iter()
        .filter(|e| e["type"] == "execution_result")
        .map(|e| e["output"].as_str().unwrap_or_default())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_reads_turns_until_end_of_input() {
    let server = server([
        answer(&block("n = 20"), 8, "stop"),
        answer("Set.", 8, "stop"),
        answer(&block("print(n + 1)"), 8, "stop"),
        answer("21.", 8, "stop"),
    ])
    .await;
    let out = chat(&server, &["--retrieve", "n"], b"Set n to 20.\n\nAdd one.\n");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = events(&out);
    let prompts: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "user_prompt")
        .map(|e| e["content"].as_str().unwrap())
        .collect();
    assert_eq!(
        prompts,
        ["Set n to 20.", "Add one."],
        "the blank line is skipped"
    );
    let outputs = outputs(&events);
    assert_eq!(outputs, ["No output", "21\n"], "state carries across turns");
    assert_eq!(
        events.last().unwrap(),
        &json!({"type": "retrieved", "name": "n", "value": 20})
    );
}

/// `/undo` in `cave chat --runtime kernel`: the last turn is taken back, in the conversation
/// the model reads and in the namespace; with nothing left, it says so.
#[tokio::test(flavor = "multi_thread")]
async fn undo_takes_the_last_turn_back() {
    let server = server([
        answer(&block("n = 1"), 8, "stop"),
        answer("Set.", 8, "stop"),
        answer(&block("n = 2\nextra = True"), 8, "stop"),
        answer("Changed.", 8, "stop"),
        answer(&block("print(n, 'extra' in globals())"), 8, "stop"),
        answer("1.", 8, "stop"),
    ])
    .await;
    let out = chat(
        &server,
        &["--runtime", "kernel", "--retrieve", "n"],
        b"Set n.\nChange n.\n/undo\nShow n.\n/undo\n/undo\n/undo\n",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Exit status 1: `n` is not bound at the end (see below).
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let events = events(&out);
    let outputs = outputs(&events);
    assert_eq!(outputs, ["No output", "No output", "1 False\n"], "{stderr}");
    // The model's third request does not hold the undone turn.
    let third = server.received()[4].body["messages"].to_string();
    assert!(
        third.contains("Set n.") && !third.contains("Change n."),
        "{third}"
    );
    assert_eq!(stderr.matches("cave: undone").count(), 3, "{stderr}");
    assert!(stderr.contains("cave: nothing to undo"), "{stderr}");
    // Undone back to before the first turn: nothing was set.
    assert!(
        stderr.contains("--retrieve n: no such variable in the runtime; nothing is bound"),
        "{stderr}"
    );
}

/// `/fork`, `/branches` and `/switch` in `cave chat --runtime kernel`: a branch starts from
/// the chat's state (conversation and namespace) and goes on on its own; switching back finds
/// the other branch as it was; a mistyped command is said as such and sent to no model; on the
/// in-process runtime `/fork` says what it needs.
#[tokio::test(flavor = "multi_thread")]
async fn branches_fork_list_and_switch() {
    let server = server([
        answer(&block("path = ['main']"), 8, "stop"),
        answer("Started.", 8, "stop"),
        answer(&block("path.append('b')\nprint(path)"), 8, "stop"),
        answer("In b.", 8, "stop"),
        answer(&block("print(path)"), 8, "stop"),
        answer("Back.", 8, "stop"),
    ])
    .await;
    let out = chat(
        &server,
        &["--runtime", "kernel"],
        b"Start.\n/fork b\n/fork b\n/switch b\nGo on in b.\n/branches\n/switch main\nShow.\n/swich main\n/fork a b\n",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let events = events(&out);
    let outputs = outputs(&events);
    assert_eq!(
        outputs,
        ["No output", "['main', 'b']\n", "['main']\n"],
        "{stderr}"
    );
    assert!(stderr.contains("cave: forked b from main"), "{stderr}");
    assert!(
        stderr.contains("cave: there is a branch b already"),
        "{stderr}"
    );
    assert!(
        stderr.contains("* b (2 prompts)\n  main (1 prompts)"),
        "{stderr}"
    );
    assert!(stderr.contains("cave: no command /swich"), "{stderr}");
    assert!(stderr.contains("/fork takes at most a name"), "{stderr}");
    // The branch's request held the chat's first turn; main's next one not the branch's.
    let in_branch = server.received()[2].body["messages"].to_string();
    assert!(
        in_branch.contains("Start.") && in_branch.contains("Go on in b."),
        "{in_branch}"
    );
    let back = server.received()[4].body["messages"].to_string();
    assert!(
        back.contains("Start.") && !back.contains("Go on in b."),
        "{back}"
    );
    assert_eq!(server.received().len(), 6, "no command reached the model");

    let quiet = self::server([]).await;
    let out = chat(&quiet, &[], b"/fork\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/fork needs --runtime kernel"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_cancels_the_running_turn_and_keeps_the_session() {
    let server = server([
        answer(&block("kept = 'yes'\nwhile True:\n    pass"), 16, "stop"),
        answer(&block("print(kept)"), 8, "stop"),
        answer("Still here.", 8, "stop"),
    ])
    .await;
    let mut cave = Running::spawn(command(Some(&server), &["chat", "--json"]), true);
    cave.write(b"Spin.\n");
    cave.until("code");
    std::thread::sleep(std::time::Duration::from_millis(300));
    // A real SIGINT, as Ctrl-C sends (no `kill` program needed).
    cave.signal(libc::SIGINT);
    assert_eq!(cave.until("stopped")["stop_reason"], "cancelled");
    cave.write(b"Again.\n");
    cave.close_stdin();
    assert_eq!(
        cave.until("execution_result")["output"],
        "yes\n",
        "the session and its state survived the interrupt"
    );
    let (status, stderr) = cave.finish();
    assert_eq!(status.code(), Some(0), "{stderr}");
}

/// SIGTERM (what `docker stop`, systemd and `timeout` send) ends `cave run` the way Ctrl-C
/// ends a turn: the cell interrupted, the last events written, the session saved, exit 1.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_ends_a_run_after_stopping_its_cell() {
    a_signal_ends_a_run_after_stopping_its_cell(libc::SIGTERM, "SIGTERM").await;
}

/// SIGHUP (the terminal or the SSH connection went) does the same.
#[tokio::test(flavor = "multi_thread")]
async fn sighup_ends_a_run_after_stopping_its_cell() {
    a_signal_ends_a_run_after_stopping_its_cell(libc::SIGHUP, "SIGHUP").await;
}

async fn a_signal_ends_a_run_after_stopping_its_cell(signal: libc::c_int, name: &str) {
    let server = server([
        answer(&block("kept = 'yes'\nwhile True:\n    pass"), 16, "stop"),
        answer("Done.", 8, "stop"),
    ])
    .await;
    let dir = std::env::temp_dir().join(format!("cave-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let session = dir.to_str().unwrap();
    let run = ["run", "--json", "--session", session, "Spin.", "Then this."];
    let mut cave_run = Running::spawn(command(Some(&server), &run), false);
    cave_run.until("code");
    std::thread::sleep(std::time::Duration::from_millis(300));
    cave_run.signal(signal);
    let rest: Vec<Json> = std::iter::from_fn(|| cave_run.next_event()).collect();
    let stopped: Vec<&Json> = rest.iter().filter(|e| e["type"] == "stopped").collect();
    assert_eq!(stopped.len(), 1, "one turn, then no other: {rest:?}");
    assert_eq!(stopped[0]["stop_reason"], "cancelled");
    let (status, stderr) = cave_run.finish();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("cave: stopped by {name}")),
        "{stderr}"
    );
    // The session was saved with what the cell set before it was stopped.
    let resume = [
        "run",
        "--json",
        "--session",
        session,
        "--retrieve",
        "kept",
        "Resume.",
    ];
    let resumed = cave(Some(&server), &resume);
    let retrieved = events(&resumed)
        .into_iter()
        .find(|e| e["type"] == "retrieved")
        .unwrap_or_else(|| panic!("{}", String::from_utf8_lossy(&resumed.stderr)));
    assert_eq!(retrieved["value"], "yes");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Started with SIGHUP ignored (as `nohup` starts it), `cave` keeps ignoring it: the run goes
/// on through a hangup, and SIGTERM still ends it.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_started_with_sighup_ignored_goes_on_through_one() {
    use std::os::unix::process::CommandExt as _;
    let server = server([answer(&block("while True:\n    pass"), 16, "stop")]).await;
    let mut command = command(Some(&server), &["run", "--json", "Spin."]);
    // SAFETY: one async-signal-safe call between fork and exec.
    unsafe {
        command.pre_exec(|| {
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut cave = Running::spawn(command, false);
    cave.until("code");
    cave.signal(libc::SIGHUP);
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(
        cave.child.0.try_wait().unwrap().is_none(),
        "SIGHUP stopped it"
    );
    cave.signal(libc::SIGTERM);
    let (status, stderr) = cave.finish();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cave: stopped by SIGTERM"), "{stderr}");
}

/// SIGTERM while `cave chat` waits for the next line: it ends at once (the line editor's
/// thread is not waited for), exit 1.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_ends_a_chat_waiting_for_its_next_line() {
    let server = server([answer("Hello.", 8, "stop")]).await;
    let mut cave = Running::spawn(command(Some(&server), &["chat", "--json"]), true);
    cave.write(b"Hi.\n");
    cave.until("stopped");
    std::thread::sleep(std::time::Duration::from_millis(300));
    // stdin stays open: only the signal can end it.
    cave.signal(libc::SIGTERM);
    let (status, stderr) = cave.finish();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cave: stopped by SIGTERM"), "{stderr}");
}

/// A `cave` process read event by event (`--json`), with its standard error kept for the end.
struct Running {
    child: KillOnDrop,
    events: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
    stdin: Option<std::process::ChildStdin>,
}

impl Running {
    /// Starts `command` with its output piped, and its input too when `input`.
    fn spawn(mut command: Command, input: bool) -> Self {
        use std::io::BufRead as _;
        use std::process::Stdio;
        let stdin = if input { Stdio::piped() } else { Stdio::null() };
        let mut child = command
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let events = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let stdin = child.stdin.take();
        Self {
            child: KillOnDrop(child),
            events,
            stdin,
        }
    }

    /// Writes to its input (left open until [`close_stdin`](Self::close_stdin)).
    fn write(&mut self, bytes: &[u8]) {
        std::io::Write::write_all(self.stdin.as_mut().expect("spawned with input"), bytes).unwrap();
    }

    fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// The next event, or `None` at the end of its output.
    fn next_event(&mut self) -> Option<Json> {
        Some(serde_json::from_str(&self.events.next()?.unwrap()).unwrap())
    }

    /// Reads events up to the first of type `kind`, and returns it.
    fn until(&mut self, kind: &str) -> Json {
        loop {
            let event = self
                .next_event()
                .unwrap_or_else(|| panic!("the output ended before a {kind:?} event"));
            if event["type"] == kind {
                return event;
            }
        }
    }

    /// Sends it `signal`.
    fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.0.id()).unwrap();
        // SAFETY: sending a signal to our own child process.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    }

    /// Waits for it to end (its input left as it is): its exit status and what it wrote to
    /// standard error.
    fn finish(mut self) -> (std::process::ExitStatus, String) {
        let mut stderr = String::new();
        let mut pipe = self.child.0.stderr.take().unwrap();
        std::io::Read::read_to_string(&mut pipe, &mut stderr).unwrap();
        (self.child.0.wait().unwrap(), stderr)
    }
}

/// Kills the child if a test fails before it exits.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_active_virtualenv_provides_the_packages() {
    let venv = std::env::temp_dir().join(format!("cave-venv-{}", std::process::id()));
    let created = Command::new("python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .status()
        .unwrap();
    assert!(created.success(), "python3 -m venv works here");
    let site = Command::new(venv.join("bin/python"))
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ])
        .output()
        .unwrap();
    let site = String::from_utf8(site.stdout).unwrap().trim().to_owned();
    std::fs::write(
        std::path::Path::new(&site).join("venv_only_module.py"),
        "VALUE = 'from the venv'\n",
    )
    .unwrap();
    let server = server([
        answer(
            &block("import sys, venv_only_module\nprint(venv_only_module.VALUE, sys.prefix)"),
            16,
            "stop",
        ),
        answer("ok", 8, "stop"),
    ])
    .await;
    let out = command(Some(&server), &["run", "--json", "go"])
        .env("VIRTUAL_ENV", &venv)
        .env_remove("CAVE_PYTHON")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result = events(&out)
        .into_iter()
        .find(|e| e["type"] == "execution_result")
        .unwrap();
    assert_eq!(
        result["output"],
        format!("from the venv {}\n", venv.display())
    );
    std::fs::remove_dir_all(&venv).ok();
}

/// For people, the conversation goes to stdout and errors to stderr: `> answer.txt` keeps the
/// answer, `2>/dev/null` hides the errors.
#[tokio::test(flavor = "multi_thread")]
async fn human_mode_errors_go_to_stderr() {
    let echo =
        json!({"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}});
    let server = server([status_with(401, &[], echo)]).await;
    let out = cave(Some(&server), &["run", "--retrieve", "nothing", "hello"]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stdout.contains("Incorrect API key"), "{stdout}");
    assert!(stderr.contains("Incorrect API key"), "{stderr}");
    assert!(
        stderr.contains("--retrieve nothing: no such variable"),
        "{stderr}"
    );
    assert!(!stdout.contains("--retrieve"), "{stdout}");
}

#[test]
fn zero_steps_and_odd_retrieve_names_are_usage_errors() {
    for args in [
        &["run", "--model", "m", "--max-steps", "0", "hi"][..],
        &["run", "--model", "m", "--retrieve", "x); import os", "hi"][..],
    ] {
        let out = cave(None, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
    }
}

/// Recorded (`--record`) through a real LiteLLM proxy whose mock model answers as a small local
/// model did: a ```` ```python3 ```` block never closed. Replayed offline, the block runs.
#[test]
fn a_recorded_small_model_answer_runs_its_unclosed_python3_block() {
    let cassette = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/small-model-unclosed-python3.jsonl"
    );
    let out = cave(
        None,
        &[
            "run",
            "--json",
            "--replay",
            cassette,
            "--max-steps",
            "2",
            "What is 6 times 7?",
        ],
    );
    let events = events(&out);
    let codes: Vec<&Json> = events.iter().filter(|e| e["type"] == "code").collect();
    assert_eq!(codes.len(), 2, "{events:?}");
    assert!(
        codes
            .iter()
            .all(|c| c["code"] == "print(6 * 7)" && c["unclosed"] == true)
    );
    let outputs: Vec<&Json> = events
        .iter()
        .filter(|e| e["type"] == "execution_result")
        .map(|e| &e["output"])
        .collect();
    assert_eq!(outputs, [&json!("42\n"), &json!("42\n")]);
    let stopped = events.last().unwrap();
    assert_eq!(stopped["stop_reason"], "max_steps");
    assert_eq!(
        stopped["usage"]["estimated"], false,
        "the proxy reported usage"
    );
    assert_eq!(out.status.code(), Some(1));
}

/// Recorded (`cave --record`) against a real llama.cpp server (llama-cpp-python 0.3) running
/// SmolLM2-135M-Instruct: the model ends its first answer inside a ```python block. Replayed
/// offline: the block runs, marked unclosed, and usage is marked estimated (llama.cpp reports
/// none in streams).
#[test]
fn a_recorded_llama_cpp_answer_runs_its_unclosed_block() {
    let cassette = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/smollm2-llama-cpp-unclosed.jsonl"
    );
    let out = cave(
        None,
        &[
            "run",
            "--json",
            "--replay",
            cassette,
            "--max-steps",
            "2",
            "Write Python code that prints the sum of 2 and 3.",
        ],
    );
    let events = events(&out);
    let first = events
        .iter()
        .find(|e| e["type"] == "code")
        .expect("a code event");
    assert_eq!(first["unclosed"], true, "{first}");
    assert!(
        first["code"]
            .as_str()
            .unwrap()
            .starts_with("def sum_two(num1, num2):")
    );
    let results = events
        .iter()
        .filter(|e| e["type"] == "execution_result")
        .count();
    assert_eq!(results, 2, "both steps ran their block");
    let stopped = events.last().unwrap();
    assert_eq!(stopped["stop_reason"], "max_steps");
    assert_eq!(
        stopped["usage"]["estimated"], true,
        "llama.cpp reports no usage"
    );
}

/// A table and a chart from a cell, through the binary: a `display` event for each with the
/// files under `--display-dir`, the model's next request carrying their text forms and a line
/// per item, and the end of the run naming the directory.
#[tokio::test(flavor = "multi_thread")]
async fn figures_and_tables_are_display_events_and_files() {
    let dir = std::env::temp_dir().join(format!("cave-cli-display-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let code = "import pandas as pd\nimport matplotlib.pyplot as plt\ndf = pd.DataFrame({'x': [1, 2, 3], 'y': [2, 4, 9]})\ndisplay(df)\ndf.plot(x='x', y='y')";
    let server = server([
        answer(&block(code), 8, "stop"),
        answer("A table and a chart.", 8, "stop"),
    ])
    .await;
    let out = cave(
        Some(&server),
        &[
            "run",
            "--json",
            "--display-dir",
            dir.to_str().unwrap(),
            "Tabulate and chart it.",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "cave: what the cells showed is in {}",
            dir.display()
        )),
        "{stderr}"
    );
    let events = events(&out);
    let shown: Vec<&Json> = events.iter().filter(|e| e["type"] == "display").collect();
    assert_eq!(shown.len(), 2, "{events:?}");
    assert_eq!(shown[0]["mime_types"], json!(["text/html", "text/plain"]));
    assert!(
        shown[0]["text"].as_str().unwrap().contains("x  y"),
        "{}",
        shown[0]
    );
    let html = shown[0]["files"]["text/html"].as_str().unwrap();
    assert!(std::fs::read_to_string(html).unwrap().contains("<table"));
    assert_eq!(shown[1]["mime_types"], json!(["image/png", "text/plain"]));
    let png = shown[1]["files"]["image/png"].as_str().unwrap();
    assert!(std::fs::read(png).unwrap().starts_with(b"\x89PNG"));
    assert!(
        shown[0].get("item").is_none(),
        "the forms are in the files, not the stream"
    );
    // The model reads the text forms in place and a line per item.
    let sent = server.received()[1].body["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(sent.contains("x  y"), "{sent}");
    assert!(
        sent.contains("[text/html saved as display-1.html]"),
        "{sent}"
    );
    assert!(
        sent.contains("[image/png ") && sent.contains(" saved as display-2.png]"),
        "{sent}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--vision`: a figure a cell shows goes to the model with the result, as an `image_url`
/// part after the text; without it, the content stays text.
#[tokio::test(flavor = "multi_thread")]
async fn with_vision_a_figure_goes_to_the_model() {
    let code = "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()";
    for vision in [true, false] {
        let dir =
            std::env::temp_dir().join(format!("cave-cli-vision-{}-{vision}", std::process::id()));
        let server = server([
            answer(&block(code), 8, "stop"),
            answer("A line.", 8, "stop"),
        ])
        .await;
        let mut args = vec!["run", "--json", "--display-dir", dir.to_str().unwrap()];
        if vision {
            args.push("--vision");
        }
        args.push("Plot it.");
        let out = cave(Some(&server), &args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let content = server.received()[1].body["messages"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()["content"]
            .clone();
        if vision {
            let parts = content.as_array().expect("parts");
            assert_eq!(parts[0]["type"], "text");
            assert!(
                parts[0]["text"]
                    .as_str()
                    .unwrap()
                    .contains("saved as display-1.png"),
                "{content}"
            );
            assert_eq!(parts[1]["type"], "image_url");
            let url = parts[1]["image_url"]["url"].as_str().unwrap();
            assert!(
                url.starts_with("data:image/png;base64,iVBORw0KGgo"),
                "{url:.60}"
            );
        } else {
            assert!(content.is_string(), "{content}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// With nothing configured, what cells show goes to `cave-display-DATE-TIME` in the current
/// directory, made when first needed and named at the end of the run; a run that shows
/// nothing makes no directory.
#[tokio::test(flavor = "multi_thread")]
async fn by_default_shown_files_go_to_a_dated_directory_here() {
    let cwd = std::env::temp_dir().join(format!("cave-cli-display-cwd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cwd);
    std::fs::create_dir_all(&cwd).unwrap();
    let run = |code: &str| {
        let code = code.to_owned();
        let cwd = cwd.clone();
        async move {
            let server =
                server([answer(&block(&code), 8, "stop"), answer("Done.", 8, "stop")]).await;
            command(Some(&server), &["run", "--json", "Go."])
                .current_dir(&cwd)
                .output()
                .expect("the binary runs")
        }
    };
    let out = run("print('nothing to show')").await;
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(std::fs::read_dir(&cwd).unwrap().count(), 0, "no directory");
    let out = run("display({'text/plain': 'x', 'text/html': '<b>x</b>'}, raw=True)").await;
    assert_eq!(out.status.code(), Some(0));
    let made: Vec<std::path::PathBuf> = std::fs::read_dir(&cwd)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(made.len(), 1, "{made:?}");
    let name = made[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with("cave-display-") && name.len() == "cave-display-20261201-235959".len(),
        "{name}"
    );
    assert_eq!(
        std::fs::read_to_string(made[0].join("display-1.html")).unwrap(),
        "<b>x</b>"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "cave: what the cells showed is in {}",
            made[0].display()
        )),
        "{stderr}"
    );
    std::fs::remove_dir_all(&cwd).unwrap();
}

/// `--images sixel`: a figure a cell shows is drawn in the terminal's output as sixel, scaled
/// to the width images are drawn at; where libsixel's `sixel2png` is installed, it decodes the
/// drawing back into an image of that size.
#[tokio::test(flavor = "multi_thread")]
async fn with_images_sixel_a_figure_is_drawn_as_sixel() {
    let dir = std::env::temp_dir().join(format!("cave-cli-sixel-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let code = "import matplotlib.pyplot as plt\nplt.figure(figsize=(10, 5))\nplt.plot([1, 3, 2])\nplt.show()";
    let server = server([
        answer(&block(code), 8, "stop"),
        answer("A line.", 8, "stop"),
    ])
    .await;
    let out = cave(
        Some(&server),
        &[
            "run",
            "--images",
            "sixel",
            "--display-dir",
            dir.to_str().unwrap(),
            "Plot it.",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let start = stdout.find("\x1bP0;1;0q").expect("a sixel drawing");
    let end = start + stdout[start..].find("\x1b\\").expect("its end") + 2;
    let sixel = &stdout[start..end];
    // A figure about 1000 pixels wide, drawn 60 columns of 10 pixels wide.
    let size: Vec<u32> = sixel["\x1bP0;1;0q\"1;1;".len()..]
        .split('#')
        .next()
        .unwrap()
        .split(';')
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(size[0], 600, "{}", &sixel[..40]);
    assert!((250..350).contains(&size[1]), "{}", &sixel[..40]);
    let decoder = std::path::Path::new("/usr/bin/sixel2png");
    if decoder.is_file() {
        let six = dir.join("figure.six");
        let png = dir.join("figure.png");
        std::fs::write(&six, sixel).unwrap();
        let status = Command::new(decoder)
            .arg("-i")
            .arg(&six)
            .arg("-o")
            .arg(&png)
            .status()
            .unwrap();
        assert!(status.success());
        let decoded = std::fs::read(&png).unwrap();
        assert_eq!(
            cave_agent::image_size("image/png", &decoded),
            Some((size[0], size[1]))
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A streamed code answer whose usage gives every kind of token and, as a LiteLLM proxy with
/// `include_cost_in_streaming_usage` or OpenRouter does, its cost.
fn code_with_cost(code: &str, cost: f64) -> Reply {
    use crate::support::{Part, finish, text};
    Reply::Sse(vec![
        text(&block(code)),
        finish("stop"),
        Part::Data(json!({"choices": [], "usage": {
            "prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120,
            "prompt_tokens_details": {"cached_tokens": 64},
            "completion_tokens_details": {"reasoning_tokens": 7},
            "cost": cost
        }})),
        Part::Done,
    ])
}

/// A whole (not streamed) answer whose cost is in LiteLLM's header.
fn answer_with_cost_header(content: &str, cost: &str) -> Reply {
    status_with(
        200,
        &[("x-litellm-response-cost", cost)],
        json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55}}),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn the_stopped_event_carries_the_session_ledger() {
    let first = server([
        code_with_cost("x = sum(range(10))\nprint(x)", 0.01),
        answer_with_cost_header("Done.", "0.002"),
    ])
    .await;
    let out = cave(
        Some(&first),
        &[
            "run",
            "--json",
            "--runtime",
            "kernel",
            "--price",
            "1,2",
            "Sum.",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = events(&out);
    let stopped = said.iter().find(|e| e["type"] == "stopped").unwrap();
    let ledger = &stopped["ledger"];
    assert_eq!(
        ledger["tokens"],
        json!({"prompt_tokens": 150, "completion_tokens": 25, "total_tokens": 175,
               "estimated": false, "cached_tokens": 64, "reasoning_tokens": 7})
    );
    assert_eq!(stopped["usage"]["cached_tokens"], 64);
    // Both calls reported their cost: the price computes nothing.
    let cost = &ledger["cost"];
    assert!(
        (cost["usd"].as_f64().unwrap() - 0.012).abs() < 1e-12,
        "{cost}"
    );
    assert_eq!(
        (cost["computed"].as_f64(), cost["unpriced_calls"].as_u64()),
        (Some(0.0), Some(0))
    );
    assert_eq!(
        (ledger["model_calls"].as_u64(), ledger["cells"].as_u64()),
        (Some(2), Some(1))
    );
    assert!(
        ledger["cpu_seconds"].as_f64().is_some_and(|s| s > 0.0),
        "{ledger}"
    );
    assert!(
        ledger["peak_memory"].as_u64().is_some_and(|b| b > 1 << 20),
        "{ledger}"
    );

    // For people: the session's line under the run's.
    let second = server([
        code_with_cost("print(1)", 0.01),
        answer_with_cost_header("Done.", "0.002"),
    ])
    .await;
    let out = cave(Some(&second), &["run", "--runtime", "kernel", "Sum."]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains(
            "session · 175 tokens · 64 cached · 7 reasoning · $0.012 reported · 1 cell · "
        ),
        "{shown}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn budgets_given_on_the_command_line_stop_the_run() {
    let costly = server([
        code_with_cost("print(1)", 0.01),
        code_with_cost("print(2)", 0.01),
    ])
    .await;
    let out = cave(
        Some(&costly),
        &["run", "--json", "--max-cost", "$0.005", "Count."],
    );
    assert_eq!(out.status.code(), Some(1));
    let said = events(&out);
    let stopped = said.iter().find(|e| e["type"] == "stopped").unwrap();
    assert_eq!(stopped["stop_reason"], "budget_exhausted");
    assert_eq!(stopped["error"]["kind"], "max_cost");
    assert_eq!(stopped["steps"], 1, "{stopped}");
    // No price and an OpenAI-compatible server: cave says the budget may count nothing.
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("give the model's price with --price IN,OUT")
    );

    let spinning = server([code_with_cost("x = 0\nwhile True:\n    x += 1", 0.0)]).await;
    let out = cave(
        Some(&spinning),
        &[
            "run",
            "--json",
            "--runtime",
            "kernel",
            "--max-cpu",
            "300ms",
            "Spin.",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = events(&out);
    let stopped = said.iter().find(|e| e["type"] == "stopped").unwrap();
    assert_eq!(stopped["error"]["kind"], "max_cpu_time", "{stopped}");
    assert!(stopped["ledger"]["cpu_seconds"].as_f64().unwrap() >= 0.3);
    let result = said
        .iter()
        .find(|e| e["type"] == "execution_result")
        .unwrap();
    assert!(
        result["output"]
            .as_str()
            .unwrap()
            .contains("budget of 0.3 seconds of processor time is spent"),
        "{result}"
    );

    for bad in [
        ["--max-cost", "-1"],
        ["--price", "2"],
        ["--max-cpu", "soon"],
    ] {
        let out = cave(None, &["run", bad[0], bad[1], "x"]);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
    }
}
