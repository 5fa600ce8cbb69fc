//! `cave run --runtime jupyter`, through the binary, against a real Kernel Gateway.

use crate::support::{TestServer, answer};
use serde_json::Value as Json;
use std::process::Command;

#[path = "../../cave-runtime-kernel/tests/support/gateway.rs"]
pub(crate) mod gateway;

/// A run whose code calls into the host (a skill's function) from a cell in a kernel behind
/// the gateway, with a variable in and out; a wrong token is a usage-time error.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_goes_through_a_jupyter_kernel() {
    let Some(gateway) = gateway::gateway() else {
        return;
    };
    let skills = cave_agent::testing::TestDir::new("cli-jupyter");
    std::fs::create_dir_all(skills.join("greet")).expect("a temp dir");
    std::fs::write(
        skills.join("greet/SKILL.md"),
        "---\nname: greet\ndescription: Greets people.\n---\nSay hello.\n",
    )
    .expect("writes");
    let server = TestServer::start([
        answer(
            "```python\ndata.append(len(activate_skill('greet')))\nprint(data)\n```",
            8,
            "stop",
        ),
        answer("Done.", 8, "stop"),
    ])
    .await;
    let run = |token: &str| {
        Command::new(env!("CARGO_BIN_EXE_cave"))
            .args(["run", "--json", "--runtime", "jupyter", "--jupyter-url"])
            .arg(&gateway.url)
            .args(["--var", "data=[1]", "--retrieve", "data", "--skills"])
            .arg(&skills)
            .arg("Go.")
            .env("JUPYTER_TOKEN", token)
            .env("LLM_MODEL_ID", "test-model")
            .env("LLM_BASE_URL", server.base_url())
            .env("LLM_API_KEY", "sk-jupyter-test")
            .output()
            .expect("cave runs")
    };
    let out = run(&gateway.token);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let events: Vec<Json> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    let result = events
        .iter()
        .find(|e| e["type"] == "execution_result")
        .expect("the cell ran");
    let retrieved = events.last().expect("events");
    assert_eq!(retrieved["type"], "retrieved", "{events:?}");
    assert_eq!(retrieved["value"][0], 1);
    // The host call's answer (the skill's instructions) came back into the kernel.
    let length = retrieved["value"][1].as_u64().expect("a length");
    assert!(length >= "Say hello.".len() as u64, "{retrieved}");
    assert_eq!(result["output"], format!("[1, {length}]\n"));
    assert!(
        !stderr.contains(&gateway.token),
        "the token never shows: {stderr}"
    );

    let wrong = run("not-the-token");
    assert_eq!(
        wrong.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&wrong.stderr)
    );
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        stderr.contains("no Jupyter kernel at") && stderr.contains("JUPYTER_TOKEN"),
        "{stderr}"
    );
    assert!(!stderr.contains("not-the-token"), "{stderr}");
}

/// The Jupyter options are usage errors where they cannot apply, each saying what to do.
#[test]
fn jupyter_options_are_checked() {
    let cave = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_cave"))
            .args(["run", "--model", "m"])
            .args(args)
            .arg("hi")
            .output()
            .expect("cave runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let url = [
        "--runtime",
        "jupyter",
        "--jupyter-url",
        "http://127.0.0.1:1",
    ];
    let dir = cave_agent::testing::TestDir::new("cli-not-pem");
    let not_pem = dir.join("not.pem");
    std::fs::write(&not_pem, "not a certificate\n").expect("writes");
    let not_pem = not_pem.to_str().expect("a UTF-8 path");
    let cases: [(Vec<&str>, &str); 8] = [
        (
            vec!["--jupyter-url", "http://127.0.0.1:1"],
            "--jupyter-url applies to the Jupyter runtime: add --runtime jupyter",
        ),
        (
            vec!["--runtime", "jupyter"],
            "--runtime jupyter needs --jupyter-url URL",
        ),
        (
            [&url[..], &["--memory-limit", "1G"]].concat(),
            "the server sets its kernels' interpreter, limits and isolation",
        ),
        (
            [&url[..], &["--jupyter-env", "=x"]].concat(),
            "--jupyter-env takes NAME=VALUE",
        ),
        (
            [
                &url[..],
                &["--jupyter-kernel", "a", "--jupyter-kernel-id", "b"],
            ]
            .concat(),
            "cannot be used with",
        ),
        (
            vec!["--jupyter-ca", "ca.pem"],
            "--jupyter-ca applies to the Jupyter runtime: add --runtime jupyter",
        ),
        (
            [&url[..], &["--jupyter-ca", "/nonexistent/ca.pem"]].concat(),
            "--jupyter-ca: could not read /nonexistent/ca.pem",
        ),
        (
            [&url[..], &["--jupyter-ca", not_pem]].concat(),
            "hold no certificate",
        ),
    ];
    for (args, expected) in cases {
        let (code, stderr) = cave(&args);
        assert_eq!(code, Some(2), "{args:?}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}
