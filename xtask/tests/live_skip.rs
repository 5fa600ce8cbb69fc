//! `cargo xtask test-live` with no endpoint says so in one line and succeeds, without
//! building or running anything.

use std::process::Command;

#[test]
fn test_live_skips_cleanly_without_an_endpoint() {
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("test-live")
        .env_remove("LLM_MODEL_ID")
        .env_remove("LLM_BASE_URL")
        .env_remove("LLM_API_KEY")
        .output()
        .expect("xtask runs");
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "one line: {stdout}");
    assert!(
        stdout.starts_with("test-live: skipped: no endpoint") && stdout.contains("local-llm start"),
        "{stdout}"
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn test_live_refuses_an_unknown_provider() {
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["test-live", "--provider", "nope"])
        .env_remove("LLM_MODEL_ID")
        .output()
        .expect("xtask runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--provider takes openai or litellm"));
}

#[test]
fn local_llm_refuses_an_unknown_command() {
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["local-llm", "restart"])
        .output()
        .expect("xtask runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("start, stop or status, not restart"));
}
