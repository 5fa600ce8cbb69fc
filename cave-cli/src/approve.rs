//! `--approve cells`: the person at the terminal, or the program driving `cave --json`,
//! answers each approval request on stdin.

use cave_agent::{Approval, ApprovalRequest, Approver, async_trait};
use std::io::BufRead;
use std::sync::atomic::{AtomicBool, Ordering};

/// Reads answers from stdin: `y`, `n` or `a` (always, for the rest of the session) from a
/// person; one JSON object per request (`{"approve": true}`, `{"approve": false, "reason":
/// "..."}`, `{"approve": true, "always": true}`) in JSON mode. End of input or an answer that
/// cannot be read refuses.
#[derive(Debug)]
pub(crate) struct Prompted {
    json: bool,
    always: AtomicBool,
}

impl Prompted {
    pub(crate) fn new(json: bool) -> Self {
        Self {
            json,
            always: AtomicBool::new(false),
        }
    }
}

/// An answer, read.
#[derive(Debug, PartialEq)]
pub(crate) enum Answer {
    Yes,
    No(Option<String>),
    Always,
}

/// Reads one answer line (`json`: the JSON form).
pub(crate) fn parse(line: &str, json: bool) -> Answer {
    let line = line.trim();
    if json {
        let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else {
            return Answer::No(Some(format!("the approval answer was not JSON: {line:?}")));
        };
        let reason = value["reason"].as_str().map(str::to_owned);
        return match (value["approve"].as_bool(), value["always"].as_bool()) {
            (Some(true), Some(true)) => Answer::Always,
            (Some(true), _) => Answer::Yes,
            (Some(false), _) => Answer::No(reason),
            (None, _) => Answer::No(Some(
                "the approval answer had no \"approve\": true or false".to_owned(),
            )),
        };
    }
    match line.to_ascii_lowercase().as_str() {
        "y" | "yes" => Answer::Yes,
        "a" | "always" => Answer::Always,
        "" | "n" | "no" => Answer::No(None),
        other => Answer::No(Some(other.to_owned())),
    }
}

#[async_trait]
impl Approver for Prompted {
    async fn approve(&self, request: &ApprovalRequest) -> Approval {
        if self.always.load(Ordering::SeqCst) {
            return Approval::Approved;
        }
        let json = self.json;
        let what = match request {
            ApprovalRequest::Cell { .. } => "Run this cell?".to_owned(),
            ApprovalRequest::Call { function, .. } => format!("Call {function}?"),
            _ => "Allow this?".to_owned(),
        };
        let line = tokio::task::spawn_blocking(move || {
            if !json {
                eprint!("{what} [y]es, [n]o (or a reason), [a]lways: ");
            }
            let mut line = String::new();
            match std::io::stdin().lock().read_line(&mut line) {
                Ok(0) | Err(_) => None,
                Ok(_) => Some(line),
            }
        })
        .await
        .ok()
        .flatten();
        let Some(line) = line else {
            return Approval::Refused(Some("no answer: stdin is closed".to_owned()));
        };
        match parse(&line, json) {
            Answer::Yes => Approval::Approved,
            Answer::Always => {
                self.always.store(true, Ordering::SeqCst);
                Approval::Approved
            }
            Answer::No(reason) => Approval::Refused(reason),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_in_both_forms() {
        assert_eq!(parse("y\n", false), Answer::Yes);
        assert_eq!(parse("A", false), Answer::Always);
        assert_eq!(parse("\n", false), Answer::No(None));
        assert_eq!(
            parse("not on prod\n", false),
            Answer::No(Some("not on prod".into()))
        );
        assert_eq!(parse(r#"{"approve": true}"#, true), Answer::Yes);
        assert_eq!(
            parse(r#"{"approve": true, "always": true}"#, true),
            Answer::Always
        );
        assert_eq!(
            parse(r#"{"approve": false, "reason": "too risky"}"#, true),
            Answer::No(Some("too risky".into()))
        );
        assert!(matches!(parse("yes", true), Answer::No(Some(_))));
        assert!(matches!(parse("{}", true), Answer::No(Some(_))));
    }
}
