//! A question put to a real `python3` in JSON: for tests that hold a reading of Python source
//! to CPython's own (its tokenizer, its syntax tree, its literals).

use serde::{Serialize, de::DeserializeOwned};
use std::process::{Command, Stdio};

/// Runs `script` with `python3 -W ignore -c`, gives it `question` as JSON on its standard
/// input, and returns what it prints as JSON. Panics (failing the test) when `python3` is not
/// on `PATH`, exits with an error, or prints anything else.
pub fn ask<Q: Serialize + ?Sized, A: DeserializeOwned>(script: &str, question: &Q) -> A {
    let mut child = Command::new("python3")
        .args(["-W", "ignore", "-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 on PATH (the runtimes need it too)");
    let input = serde_json::to_vec(question).expect("the question serialises");
    let mut stdin = child.stdin.take().expect("piped");
    // Written from a thread: a large question must not wait on an answer nobody reads yet.
    let writer = std::thread::spawn(move || std::io::Write::write_all(&mut stdin, &input));
    let output = child.wait_with_output().expect("python3 ran");
    writer
        .join()
        .expect("the writer ended")
        .expect("python3 read the question");
    assert!(
        output.status.success(),
        "python3 failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("python3's answer is JSON")
}

#[cfg(test)]
mod tests {
    #[test]
    fn python_answers_in_json() {
        let lengths: Vec<usize> = super::ask(
            "import json, sys\njson.dump([len(s) for s in json.load(sys.stdin)], sys.stdout)",
            &["a", "é", "ab"],
        );
        assert_eq!(lengths, [1, 1, 2]);
    }
}
