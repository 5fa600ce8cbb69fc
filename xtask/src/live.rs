//! `cargo xtask test-live [--provider openai|litellm]`: the live suite
//! (`cave-agent/tests/live.rs`) against the endpoint in `LLM_MODEL_ID` / `LLM_BASE_URL`
//! / `LLM_API_KEY`, one test at a time, then a summary of its results: structure checks
//! (which must pass) and the task pass rate (for information), with the wall time.
//! `--local`: against the local model, directly and through LiteLLM (what CI runs).

use serde_json::Value as Json;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

/// The one line printed when there is no endpoint.
pub(crate) const SKIP: &str = "test-live: skipped: no endpoint (set LLM_MODEL_ID, LLM_BASE_URL and LLM_API_KEY for an OpenAI-compatible server, or run `cargo xtask local-llm start` for a local one)";

/// Which adapter the suite talks through.
pub(crate) fn provider(args: &[String]) -> Result<&'static str, String> {
    match args.iter().position(|a| a == "--provider") {
        None => Ok("openai"),
        Some(i) => match args.get(i + 1).map(String::as_str) {
            Some("openai") => Ok("openai"),
            Some("litellm") => Ok("litellm"),
            other => Err(format!(
                "--provider takes openai or litellm, not {}",
                other.unwrap_or("nothing")
            )),
        },
    }
}

/// Returns true if and only if the environment names a model.
pub(crate) fn has_endpoint(var: impl Fn(&str) -> Option<String>) -> bool {
    var("LLM_MODEL_ID").is_some_and(|m| !m.trim().is_empty())
}

/// `cargo xtask test-live --local`: starts the local model and its LiteLLM proxy (`cargo
/// xtask local-llm start`, installed once into `target/local-llm`), runs the suite against
/// the model directly and through the proxy, and stops them again if it started them. `Ok`
/// when every structure check passed both ways.
pub(crate) fn run_local(root: &Path) -> Result<(), String> {
    let dir = crate::local_llm::dir(root);
    let started_here = crate::local_llm::running(&dir).is_none();
    let state = crate::local_llm::start(root, &dir)?;
    let mut failed = Vec::new();
    for (provider, variables) in crate::local_llm::endpoints(&state) {
        let variables: Vec<(&str, &str)> =
            variables.iter().map(|(k, v)| (*k, v.as_str())).collect();
        if let Err(e) = run_against(root, provider, &variables) {
            failed.push(format!("{provider}: {e}"));
        }
    }
    if started_here {
        crate::local_llm::stop(&dir);
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}

/// Runs the suite against the endpoint in the environment and prints its summary; `Ok` when
/// every structure check passed.
pub(crate) fn run(root: &Path, provider: &str) -> Result<(), String> {
    if !has_endpoint(|name| std::env::var(name).ok()) {
        println!("{SKIP}");
        return Ok(());
    }
    run_against(root, provider, &[])
}

/// Runs the suite with `endpoint` (`LLM_*` variables) over the environment's.
fn run_against(root: &Path, provider: &str, endpoint: &[(&str, &str)]) -> Result<(), String> {
    let var = |name: &str| {
        endpoint
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| (*v).to_owned())
            .or_else(|| std::env::var(name).ok())
    };
    let dir = root.join("target").join("live").join(provider);
    // A fresh directory: the summary reads only this run's results.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)
        .map_err(|e| format!("could not create {}: {e}", dir.display()))?;
    println!(
        "xtask: the live suite against {} at {} through the {provider} adapter",
        var("LLM_MODEL_ID").unwrap_or_default(),
        var("LLM_BASE_URL").unwrap_or_else(|| "https://api.openai.com/v1".to_owned())
    );
    let started = Instant::now();
    let dir_text = dir.display().to_string();
    let outcome = crate::cargo(
        &[
            "test",
            "-p",
            "cave-agent",
            "--all-features",
            "--test",
            "live",
            "--",
            "--ignored",
            "--test-threads",
            "1",
        ],
        &[
            ("CAVE_LIVE_PROVIDER", provider),
            ("CAVE_LIVE_DIR", dir_text.as_str()),
        ]
        .into_iter()
        .chain(endpoint.iter().copied())
        .collect::<Vec<_>>(),
    );
    let results = std::fs::read_to_string(dir.join("results.jsonl")).unwrap_or_default();
    let summary = summary(&results, provider, started.elapsed().as_secs_f64());
    println!("{summary}");
    let _ = std::fs::write(dir.join("summary.md"), &summary);
    outcome.map_err(|e| format!("{e}: a structure check failed; transcripts in {dir_text}"))
}

/// The Markdown summary of `results.jsonl`.
pub(crate) fn summary(results: &str, provider: &str, wall_seconds: f64) -> String {
    let rows: Vec<Json> = results
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let mut out = format!(
        "# Live suite ({provider})\n\n| test | stop | steps | task done | exercised | seconds |\n|---|---|---:|---|---|---:|\n"
    );
    let mut done = 0;
    for row in &rows {
        let task = row["task_done"].as_bool().unwrap_or(false);
        done += usize::from(task);
        let exercised: Vec<&str> = row["exercised"]
            .as_array()
            .map(|a| a.iter().filter_map(Json::as_str).collect())
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {:.1} |",
            row["test"].as_str().unwrap_or("?"),
            row["stop_reason"].as_str().unwrap_or("?"),
            row["steps"].as_u64().unwrap_or(0),
            if task { "yes" } else { "no" },
            if exercised.is_empty() {
                "-".to_owned()
            } else {
                exercised.join(", ")
            },
            row["elapsed_s"].as_f64().unwrap_or(0.0)
        );
    }
    let _ = write!(
        out,
        "\nStructure checks passed: {} tests (a test that failed one has no row). Task done: {done}/{} (for information). Wall time: {wall_seconds:.0} s.\n",
        rows.len(),
        rows.len()
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_provider_is_openai_or_litellm() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(provider(&args(&["test-live"])), Ok("openai"));
        assert_eq!(
            provider(&args(&["test-live", "--provider", "litellm"])),
            Ok("litellm")
        );
        let err = provider(&args(&["test-live", "--provider", "anthropic"])).unwrap_err();
        assert!(err.contains("anthropic"), "{err}");
        assert!(provider(&args(&["test-live", "--provider"])).is_err());
    }

    #[test]
    fn an_endpoint_needs_a_model_id() {
        assert!(!has_endpoint(|_| None));
        assert!(!has_endpoint(|_| Some("  ".to_owned())));
        assert!(has_endpoint(
            |n| (n == "LLM_MODEL_ID").then(|| "smollm2".to_owned())
        ));
    }

    #[test]
    fn the_summary_counts_tasks_for_information() {
        let results = concat!(
            r#"{"test":"hello_world","stop_reason":"completed","steps":2,"task_done":true,"exercised":["code ran"],"elapsed_s":12.5}"#,
            "\n",
            r#"{"test":"truncation_recovery","stop_reason":"max_steps","steps":4,"task_done":false,"exercised":[],"elapsed_s":40.0}"#,
            "\n"
        );
        let summary = summary(results, "openai", 53.2);
        assert!(
            summary.contains("| hello_world | completed | 2 | yes | code ran | 12.5 |"),
            "{summary}"
        );
        assert!(
            summary.contains("| truncation_recovery | max_steps | 4 | no | - | 40.0 |"),
            "{summary}"
        );
        assert!(summary.contains("Task done: 1/2"), "{summary}");
        assert!(summary.contains("Wall time: 53 s"), "{summary}");
    }
}
