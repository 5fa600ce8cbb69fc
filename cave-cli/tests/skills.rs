//! `cave skills list|validate` and `cave run --skills`, through the binary.

use crate::support::{TestServer, answer};
use cave_agent::testing::TestDir;
use serde_json::Value as Json;
use std::path::Path;
use std::process::Command;

/// A fresh directory for one test, removed when it ends.
fn dir(test: &str) -> TestDir {
    TestDir::new(&format!("cli-skills-{test}"))
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn cave(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_cave"))
        .args(args)
        .output()
        .expect("cave runs")
}

fn valid_skills(root: &Path) {
    write(
        &root.join("inches/SKILL.md"),
        "---\nname: inches\ndescription: Converts centimetres to inches.\n---\nDivide by 2.54.\n",
    );
    write(&root.join("inches/references/table.md"), "| cm | in |");
    write(
        &root.join("greet/SKILL.md"),
        "---\nname: greet\ndescription: Greets people.\n---\nSay hello.\n",
    );
}

#[test]
fn validate_says_valid_or_lists_every_problem() {
    let good = dir("good");
    valid_skills(&good);
    let out = cave(&["skills", "validate", good.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(": 2 skills, valid"));

    let bad = dir("bad");
    write(
        &bad.join("one/SKILL.md"),
        "---\nname: One\ndescription: x\n---\n",
    );
    write(&bad.join("two/SKILL.md"), "no frontmatter\n");
    let out = cave(&["skills", "validate", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("one/SKILL.md") && l.contains("field `name`")),
        "{stderr}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("two/SKILL.md") && l.contains("no frontmatter")),
        "{stderr}"
    );
}

#[test]
fn list_shows_a_table() {
    let root = dir("list");
    valid_skills(&root);
    let out = cave(&["skills", "list", root.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(
        lines[0].starts_with("NAME")
            && lines[0].contains("DESCRIPTION")
            && lines[0].ends_with("INJECTS")
    );
    assert!(
        lines[1].starts_with("greet ")
            && lines[1].contains("Greets people.")
            && lines[1].ends_with(" 0  no"),
        "{stdout}"
    );
    assert!(
        lines[2].starts_with("inches") && lines[2].ends_with(" 1  no"),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn run_with_skills_lets_the_model_activate_one() {
    let root = dir("run");
    valid_skills(&root);
    let server = TestServer::start([
        answer("```python\nprint(activate_skill('inches'))\n```", 8, "stop"),
        answer("```python\nprint(round(127 / 2.54, 1))\n```", 8, "stop"),
        answer("50.0 inches.", 8, "stop"),
    ])
    .await;
    let outputs = run_json(
        &server,
        &[
            "--skills",
            root.to_str().unwrap(),
            "How many inches is 127 cm?",
        ],
    );
    let outputs: Vec<&str> = outputs.iter().map(String::as_str).collect();
    assert!(outputs[0].starts_with("Divide by 2.54."), "{outputs:?}");
    assert!(outputs[0].contains("- references/table.md"), "{outputs:?}");
    assert_eq!(outputs[1], "50.0\n");
    let system = server.received()[0].body["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        system.contains("- greet: Greets people.\n- inches: Converts centimetres to inches."),
        "{system}"
    );

    // A bad skills directory is a usage error naming every problem.
    let bad = dir("run-bad");
    write(&bad.join("x/SKILL.md"), "---\nname: x\n---\n");
    let out = Command::new(env!("CARGO_BIN_EXE_cave"))
        .args([
            "run",
            "--model",
            "m",
            "--skills",
            bad.to_str().unwrap(),
            "hi",
        ])
        .output()
        .expect("cave runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("field `description` is missing"));
}

/// The example skill directory (CaveAgent-style, with an `injection.py`), through `cave run`.
#[tokio::test(flavor = "multi_thread")]
async fn the_example_skill_runs_through_cave() {
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/skills");
    let out = cave(&["skills", "list", examples]);
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.starts_with("order-desk") && l.ends_with("yes"))
    );
    for runtime in ["inproc", "kernel"] {
        let server = TestServer::start([
            answer(
                "```python\nprint(activate_skill('order-desk'))\n```",
                8,
                "stop",
            ),
            answer("```python\nprint(total(pending))\n```", 8, "stop"),
            answer("989.70 EUR.", 8, "stop"),
        ])
        .await;
        let outputs = run_json(
            &server,
            &[
                "--runtime",
                runtime,
                "--skills",
                examples,
                "What are the orders worth?",
            ],
        );
        let outputs: Vec<&str> = outputs.iter().map(String::as_str).collect();
        assert!(
            outputs[0].contains("total(orders: list[Order]) -> int"),
            "{runtime}: {outputs:?}"
        );
        assert_eq!(outputs[1], "98970\n", "{runtime}");
    }
}

/// `cave run --json ARGS` against `server`: the outputs of its executions (it must exit 0).
fn run_json(server: &TestServer, args: &[&str]) -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_cave"))
        .args(["run", "--json"])
        .args(args)
        .env("LLM_MODEL_ID", "test-model")
        .env("LLM_BASE_URL", server.base_url())
        .env("LLM_API_KEY", "sk-skills-test")
        .output()
        .expect("cave runs");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Json>(l).unwrap())
        .filter(|e| e["type"] == "execution_result")
        .map(|e| e["output"].as_str().unwrap().to_owned())
        .collect()
}

/// `--approve calls --json --audit FILE`: calling into the host (a skill's function) waits for
/// an answer on stdin, announced by an `approval_requested` event of kind `call`; cells are not
/// asked about; a refusal is a `PermissionError` in the cell; the audit records both calls.
#[tokio::test(flavor = "multi_thread")]
async fn host_calls_wait_for_approval() {
    let root = dir("approve");
    valid_skills(&root);
    let audit = root.join("audit.jsonl");
    let server = TestServer::start([
        answer(
            "```python\ntry:\n    activate_skill('inches')\nexcept PermissionError as e:\n    print(e)\nprint(activate_skill('greet'))\n```",
            8,
            "stop",
        ),
        answer("Greeted.", 8, "stop"),
    ])
    .await;
    let mut command = Command::new(env!("CARGO_BIN_EXE_cave"));
    command
        .args(["run", "--json", "--approve", "calls", "--skills"])
        .arg(&root)
        .arg("--audit")
        .arg(&audit)
        .arg("Greet.")
        .env("LLM_MODEL_ID", "test-model")
        .env("LLM_BASE_URL", server.base_url())
        .env("LLM_API_KEY", "sk-skills-test");
    let out = crate::cli::with_stdin(
        command,
        b"{\"approve\": false, \"reason\": \"not that one\"}\n{\"approve\": true}\n",
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events: Vec<Json> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let asked: Vec<&Json> = events
        .iter()
        .filter(|e| e["type"] == "approval_requested")
        .map(|e| &e["request"])
        .collect();
    assert_eq!(
        asked,
        [
            &serde_json::json!({"kind": "call", "function": "activate_skill", "arguments": "name='inches'"}),
            &serde_json::json!({"kind": "call", "function": "activate_skill", "arguments": "name='greet'"}),
        ]
    );
    let output = events
        .iter()
        .find(|e| e["type"] == "execution_result")
        .expect("the cell ran")["output"]
        .as_str()
        .unwrap();
    assert!(
        output.starts_with(
            "the user did not approve calling activate_skill: not that one\nSay hello."
        ),
        "{output}"
    );
    let records: Vec<Json> = std::fs::read_to_string(&audit)
        .expect("the audit trail")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let calls: Vec<(&str, bool)> = records
        .iter()
        .filter(|r| r["kind"] == "host_call")
        .map(|r| (r["arguments"].as_str().unwrap(), r["error"].is_null()))
        .collect();
    assert_eq!(calls, [("name='inches'", false), ("name='greet'", true)]);
    assert!(records.iter().any(|r| r["kind"] == "approval_asked"));
}
