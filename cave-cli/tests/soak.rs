//! Random model output through the pieces `cave` wires (the in-process runtime with its
//! descriptors captured, a code policy, the JSON Lines writer and the human renderer): no
//! panic, no abort, every run ends with `stopped`, every stdout line is JSON.
//!
//! `CAVE_AGENT_SOAK=N` sets the number of runs (`cargo xtask soak N` runs it in release, after the parser's soak);
//! the regular test suite runs a hundred.

use cave_agent::AgentExt;
use cave_agent::inproc::{CapturedStreams, StdioCapture};
use cave_agent::testing::{Reply, ScriptedModel};
use cave_agent::{Agent, CodePolicy, Event, InProcRuntime, Runtime, SecurityPolicy};
use cave_cli::output::{Human, JsonLines, Output};
use futures_util::StreamExt;
use std::sync::Arc;

/// A small deterministic generator (xorshift), so that a failing case can be replayed by seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

const STATEMENTS: &[&str] = &[
    "x = 1",
    "print('hi')",
    "print(x)",
    "y = [i * i for i in range(10)]",
    "raise ValueError('boom')",
    "import os\nos.write(1, b'fd out\\n')",
    "import os\nos.write(2, b'\\xff\\xfe not utf-8\\n')",
    "import os\nos.system('echo from a child')",
    "print('\\udcff lone surrogate')",
    "print(b'\\xff'.decode('latin-1'))",
    "import sys\nsys.stdout = None",
    "import sys\nsys.stderr = open('/dev/null', 'w')",
    "getattr(__builtins__, '\\x65val')('1')",
    "eval('1 + 1')",
    "'\\N{LATIN SMALL LETTER E}val'",
    "def f(n):\n    return f(n + 1)\nf(0)",
    "while False:\n    pass",
    "print('```')",
    "s = '''\n```\n'''",
    "await __import__('asyncio').sleep(0)",
    "print('x' * 30000)",
    "deep = []\nfor _ in range(5000):\n    deep = [deep]\ndeep",
    "import ctypes\nctypes.CDLL(None).printf(b'c stdio\\n')",
    "1/0",
    "   indented = 1",
    "def broken(:",
];

const PROSE: &[&str] = &[
    "Let me look.",
    "Here is the code:",
    "Done.",
    "```",
    "``` python",
    "```py",
    "`inline`",
    "# Heading",
    "| a | b |\n|---|---|\n| 1 | 2 |",
    "- item\n  - nested",
    "\u{1F600} ünïcödé",
    "",
];

/// A cell: statements, or (one time in fifty) something deep or huge.
fn cell(rng: &mut Rng) -> String {
    match rng.below(150) {
        0 => {
            let depth = 1 + rng.below(100_000);
            format!("x = {}0{}", "[".repeat(depth), "]".repeat(depth))
        }
        1 => {
            let terms = 1 + rng.below(300_000);
            format!("getattr(x, {})", vec!["'a'"; terms].join("+"))
        }
        2 => format!("s = '{}'", "\\x41".repeat(rng.below(20_000))),
        _ => (0..1 + rng.below(4))
            .map(|_| rng.pick(STATEMENTS))
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

/// One reply: prose and fences in random order, sometimes unclosed.
fn reply(rng: &mut Rng) -> String {
    let mut text = String::new();
    for _ in 0..1 + rng.below(4) {
        match rng.below(4) {
            0 | 1 => {
                let fence =
                    rng.pick(&["```python", "```Python", "```python3", "```py", "~~~python"]);
                text.push_str(&format!("{fence}\n{}\n", cell(rng)));
                if rng.below(5) != 0 {
                    text.push_str("```\n");
                }
            }
            2 if rng.below(20) == 0 => {
                // Markdown nested as deep as a model can write it.
                let depth = 1 + rng.below(20_000);
                let marker = rng.pick(&["> ", "- ", "  - ", "1. ", "*", "|"]);
                text.push_str(&marker.repeat(depth));
                text.push_str("x\n\n");
            }
            _ => {
                text.push_str(rng.pick(PROSE));
                text.push('\n');
            }
        }
    }
    text
}

fn policy(rng: &mut Rng) -> Option<Arc<dyn CodePolicy>> {
    match rng.below(3) {
        0 => None,
        1 => Some(Arc::new(SecurityPolicy::new().deny_calls(["eval"], None))),
        _ => Some(Arc::new(SecurityPolicy::strict())),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_model_output_never_breaks_a_run() {
    let runs: usize = std::env::var("CAVE_AGENT_SOAK")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100);
    let seed: u64 = std::env::var("CAVE_AGENT_SOAK_SEED")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0x9e37_79b9_7f4a_7c15);
    let runtime = InProcRuntime::new().unwrap();
    // As `cave --json` does: the cells' descriptors are captured for the whole session.
    let capture = StdioCapture::start(CapturedStreams::StdoutAndStderr).unwrap();
    runtime.attach_stdio(&capture);
    let mut rng = Rng(seed);
    for case in 0..runs {
        let case_seed = rng.0;
        let replies: Vec<Reply> = (0..1 + rng.below(3))
            .map(|_| Reply::text(reply(&mut rng)).chunk_size(1 + rng.below(64)))
            .collect();
        let model = ScriptedModel::new(replies).with_fallback(Reply::text("Finished."));
        let mut builder = Agent::builder(model, runtime.clone());
        if let Some(policy) = policy(&mut rng) {
            builder.policy(policy);
        }
        builder.max_steps(4);
        builder.max_exec_timeout(std::time::Duration::from_secs(5));
        let mut agent = builder.build().unwrap();
        let mut json = JsonLines::new(Vec::new());
        let mut human = Human::new(Vec::new(), rng.below(2) == 0);
        let mut events = agent.stream("go");
        let mut last = None;
        while let Some(event) = events.next().await {
            json.event(&event).unwrap();
            human.event(&event).unwrap();
            last = Some(event);
        }
        drop(events);
        assert!(
            matches!(last, Some(Event::Stopped { .. })),
            "case {case} (seed {case_seed}): the run did not end with `stopped`: {last:?}"
        );
        let bytes = json.into_inner();
        let text = String::from_utf8(bytes).expect("the JSON Lines stream is UTF-8");
        for line in text.lines() {
            serde_json::from_str::<serde_json::Value>(line).unwrap_or_else(|e| {
                panic!("case {case} (seed {case_seed}): a line that is not JSON ({e}): {line:?}")
            });
        }
        if runs >= 10_000 && (case + 1) % (runs / 10) == 0 {
            eprintln!("soak: {} of {runs} runs", case + 1);
        }
        if case % 500 == 499 {
            runtime.reset().await.unwrap();
        }
    }
    drop(capture);
}
