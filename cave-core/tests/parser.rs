//! The fence parser against the reference vectors, at several chunkings, and as a property.

use cave_core::{FenceParser, ThinkSplitter};
use proptest::prelude::*;
use serde_json::Value;

/// What a whole stream produced: concatenated text, code blocks, remainder, completion.
#[derive(Clone, Debug, PartialEq)]
struct Outcome {
    text: String,
    code: Vec<String>,
    remainder: String,
    completed: bool,
}

/// Feeds `input` in chunks of `size` chars (0 = whole), then flushes if no block closed.
fn parse(input: &str, size: usize) -> Outcome {
    parse_chunked(input, &[size])
}

/// Feeds `input` in chunks whose sizes cycle through `sizes` (0 = the whole rest).
fn parse_chunked(input: &str, sizes: &[usize]) -> Outcome {
    let mut parser = FenceParser::new("python");
    let mut out = Outcome {
        text: String::new(),
        code: vec![],
        remainder: String::new(),
        completed: false,
    };
    let chars: Vec<char> = input.chars().collect();
    let (mut at, mut i) = (0, 0);
    while at < chars.len() {
        let size = match sizes[i % sizes.len()] {
            0 => chars.len(),
            n => n,
        };
        let end = (at + size).min(chars.len());
        let chunk: String = chars[at..end].iter().collect();
        let parsed = parser.push(&chunk);
        out.text.push_str(parsed.text);
        out.code.extend(parsed.code.map(str::to_owned));
        if parser.is_complete() {
            out.remainder.push_str(parser.remainder());
        }
        at = end;
        i += 1;
    }
    out.completed = parser.is_complete();
    if !out.completed {
        let parsed = parser.flush();
        out.text.push_str(parsed.text);
        out.code.extend(parsed.code.map(str::to_owned));
    }
    out
}

fn vectors() -> Vec<(String, Outcome)> {
    include_str!("data/fence_vectors.jsonl")
        .lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).expect("vector is JSON");
            let s = |k: &str| v[k].as_str().expect("string field").to_owned();
            let code = v["code"]
                .as_array()
                .expect("code array")
                .iter()
                .map(|c| c.as_str().unwrap().to_owned())
                .collect();
            (
                s("input"),
                Outcome {
                    text: s("text"),
                    code,
                    remainder: s("remainder"),
                    completed: v["completed"].as_bool().unwrap(),
                },
            )
        })
        .collect()
}

#[test]
fn reference_vectors_pass_at_every_chunk_size() {
    let vectors = vectors();
    assert_eq!(vectors.len(), 47);
    for (input, expected) in &vectors {
        for size in [1, 7, 13, 0] {
            assert_eq!(
                &parse(input, size),
                expected,
                "input {input:?} at chunk size {size}"
            );
        }
    }
}

#[test]
fn plain_text_streams_as_it_arrives() {
    let mut parser = FenceParser::new("python");
    let pieces: Vec<String> = "ABC"
        .chars()
        .map(|c| parser.push(&c.to_string()).text.to_owned())
        .collect();
    assert_eq!(pieces, ["A", "B", "C"]);
}

#[test]
fn custom_tag_and_reuse_after_flush() {
    let mut parser = FenceParser::new("javascript");
    assert_eq!(
        parser.push("```javascript\nlet x = 1;\n```").code,
        Some("let x = 1;")
    );
    assert_eq!(parser.push("trailing text").text, "");
    assert_eq!(parser.remainder(), "trailing text");
    parser.flush();
    assert!(!parser.is_complete());
    assert_eq!(parser.push("```JavaScript\ny()\n```").code, Some("y()"));
}

#[test]
fn first_error_hides_a_later_string() {
    // Python's tokenizer stops at the first error: the stray apostrophe on line 1 wins.
    let out = parse("```python\nprint('it's')\nx = '''\n```\nmore\n'''\n```", 1);
    assert_eq!(out.code, ["print('it's')\nx = '''"]);
    assert_eq!(out.remainder, "\nmore\n'''\n```");
    for input in [
        "```python\nx = '''\nit's\n```\n'''\n```",
        "```python\nx = 1 # don't\ny = '''\n```\n'''\n```",
    ] {
        let out = parse(input, 1);
        assert!(
            out.code[0].ends_with("'''"),
            "{input:?} kept the inner fence: {:?}",
            out.code
        );
        assert!(out.completed);
    }
}

#[test]
fn unterminated_block_is_code_only_at_flush() {
    let mut parser = FenceParser::new("python");
    assert_eq!(parser.push("so:\n```python\nx = 1\n").code, None);
    assert_eq!(parser.flush().code, Some("x = 1"));
    // An opening fence with nothing after it is not lost.
    parser.push("so:\n```python\n");
    assert_eq!(parser.flush().text, "```python\n");
}

/// Inputs built from the pieces that matter to the parser, so random strings hit fences.
fn markdownish() -> impl Strategy<Value = String> {
    let atoms = prop::sample::select(vec![
        "```",
        "```python",
        "```Python",
        "``",
        "`",
        "\n",
        " ",
        "   ",
        "    ",
        "x = 1",
        "'",
        "\"",
        "'''",
        "\"\"\"",
        "\\",
        "#",
        "(",
        ")",
        "\r",
        "python",
        " info",
        "é",
        "你",
        "\t",
        "if a:\n    b",
    ]);
    prop::collection::vec(atoms, 0..40).prop_map(|v| v.concat())
}

/// Reasoning, answer text, code and remainder of `input` through the think splitter and then
/// the fence parser, as the agent reads an answer, in chunks whose sizes cycle through `sizes`.
fn split_then_parse(input: &str, sizes: &[usize]) -> (String, Outcome) {
    let mut splitter = ThinkSplitter::new();
    let mut parser = FenceParser::new("python");
    let mut reasoning = String::new();
    let mut out = Outcome {
        text: String::new(),
        code: vec![],
        remainder: String::new(),
        completed: false,
    };
    let feed = |text: &str, parser: &mut FenceParser, out: &mut Outcome| {
        if out.completed {
            out.remainder.push_str(text);
            return;
        }
        let parsed = parser.push(text);
        out.text.push_str(parsed.text);
        out.code.extend(parsed.code.map(str::to_owned));
        if parser.is_complete() {
            out.completed = true;
            out.remainder.push_str(parser.remainder());
        }
    };
    let chars: Vec<char> = input.chars().collect();
    let (mut at, mut i) = (0, 0);
    while at < chars.len() {
        let end = (at + sizes[i % sizes.len()].max(1)).min(chars.len());
        let split = splitter.push(&chars[at..end].iter().collect::<String>());
        reasoning.push_str(&split.reasoning);
        feed(&split.text, &mut parser, &mut out);
        at = end;
        i += 1;
    }
    let last = splitter.finish();
    reasoning.push_str(&last.reasoning);
    feed(&last.text, &mut parser, &mut out);
    if !out.completed {
        let parsed = parser.flush();
        out.text.push_str(parsed.text);
        out.code.extend(parsed.code.map(str::to_owned));
    }
    (reasoning, out)
}

/// Answers that may open with reasoning in tags, and draft blocks inside it.
fn with_thinking() -> impl Strategy<Value = String> {
    let tag = prop::sample::select(vec![
        "",
        "<think>",
        "<thinking>",
        " \n<think>",
        "<thi",
        "</think>",
        "</thinking>",
    ]);
    let atoms = prop::sample::select(vec![
        "</think>",
        "</thinking>",
        "</thi",
        "<think>",
        "nk>",
        "\n",
    ]);
    (
        tag,
        markdownish(),
        prop::collection::vec(atoms, 0..4),
        markdownish(),
    )
        .prop_map(|(tag, a, atoms, b)| format!("{tag}{a}{}{b}", atoms.concat()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, .. ProptestConfig::default() })]

    #[test]
    fn thinking_tags_split_the_same_for_every_chunking(input in with_thinking(), sizes in prop::collection::vec(1usize..9, 1..8)) {
        let whole = split_then_parse(&input, &[usize::MAX]);
        prop_assert_eq!(split_then_parse(&input, &sizes), whole.clone());
        // Nothing drafted inside reasoning is ever code: the code the parser found is in the
        // answer text that followed it.
        let (reasoning, out) = whole;
        if input.trim_start().starts_with("<think>") || input.trim_start().starts_with("<thinking>") {
            prop_assert!(input.contains(&reasoning));
        } else {
            prop_assert_eq!(reasoning, "");
            prop_assert_eq!(out, parse(&input, 0));
        }
    }

    #[test]
    fn output_is_the_same_for_every_chunking(input in markdownish(), sizes in prop::collection::vec(1usize..9, 1..8)) {
        prop_assert_eq!(parse_chunked(&input, &sizes), parse(&input, 0));
    }

    #[test]
    fn nothing_is_invented_or_lost_in_prose(input in "[^`]{0,60}") {
        let out = parse(&input, 1);
        prop_assert_eq!(out.text, input);
    }
}

/// A small deterministic generator (SplitMix64): the corpus is the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Inclusive range, like Python's `randint`.
    fn int(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }
    fn choice<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.int(0, items.len() - 1)]
    }
}

const PROSE: &[&str] = &[
    "Here is the plan.",
    "First, look at `df.head()` output.",
    "Use ``inline double`` spans.",
    "Wrap code in ```python fences like this:",
    "Results:",
    "",
    "  indented prose",
    "a line with ` one backtick",
    "done ```",
];
const OPENERS: &[&str] = &[
    "```python",
    "```Python",
    "```PYTHON",
    " ```python",
    "   ```python",
];
const BODIES: &[&str] = &[
    "x = 1",
    "print('hello')",
    "def f():\n    return 1",
    "   x = 1\n   y = 2",
    "data = {'a': 1}",
    "for i in range(3):\n    print(i)",
    "s = 'it''s'",
    "print('a `tick`')",
];
const CLOSERS: &[&str] = &["```", " ```", "   ```"];
const SUFFIXES: &[&str] = &["", "\n", "\ntrailing text"];

fn response(rng: &mut Rng) -> String {
    let blocks = rng.int(0, 3);
    let mut lines: Vec<&str> = Vec::new();
    for index in 0..(blocks + rng.int(0, 2)).max(1) {
        for _ in 0..rng.int(0, 3) {
            lines.push(rng.choice(PROSE));
        }
        if index < blocks {
            lines.push(rng.choice(OPENERS));
            lines.push(rng.choice(BODIES));
            lines.push(rng.choice(CLOSERS));
        }
    }
    lines.join("\n") + rng.choice(SUFFIXES)
}

/// The line-based extractor the streaming parser replaced: the first non-empty block.
fn oracle_first_block(text: &str) -> Option<String> {
    let mut block: Option<Vec<&str>> = None;
    for line in text.split('\n') {
        match &mut block {
            None if line.trim().to_lowercase() == "```python" => block = Some(Vec::new()),
            None => {}
            Some(lines) if line.trim() == "```" => {
                let code = lines.join("\n").trim_end().to_owned();
                if !code.is_empty() {
                    return Some(code);
                }
                block = None;
            }
            Some(lines) => lines.push(line),
        }
    }
    None
}

#[test]
fn agrees_with_the_line_based_extractor() {
    let mut rng = Rng(0xCAFE);
    let mut with_code = 0;
    for _ in 0..1500 {
        let input = response(&mut rng);
        // The parser dedents and strips what the old extractor returned.
        let expected = oracle_first_block(&input).map(|code| {
            let block = parse(&format!("```python\n{code}\n```"), 0).code;
            assert_eq!(block.len(), 1, "oracle block {code:?} re-parses");
            block[0].clone()
        });
        with_code += usize::from(expected.is_some());
        for size in [1, 7, 0] {
            let out = parse(&input, size);
            let first = if out.completed {
                out.code.first().cloned()
            } else {
                None
            };
            assert_eq!(first, expected, "input {input:?} at chunk size {size}");
        }
    }
    assert!(
        with_code > 500,
        "the corpus exercises blocks ({with_code} of 1500)"
    );
}

/// `CAVE_PARSER_SOAK=N` runs N random inputs (default 20 000): no panic, and the same output
/// for a random chunking as for the whole input.
#[test]
fn soak_random_inputs() {
    let cases: u64 = std::env::var("CAVE_PARSER_SOAK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let atoms = [
        "```",
        "```python",
        "``",
        "`",
        "\n",
        " ",
        "   ",
        "'",
        "\"",
        "'''",
        "\"\"\"",
        "\\",
        "#",
        "(",
        ")",
        "]",
        "\r",
        "python",
        "x",
        "é",
        "\t",
        "    ",
        "{",
        "你好",
    ];
    let mut rng = Rng(0xBEEF);
    for _ in 0..cases {
        let len = rng.int(0, 30);
        let input: String = (0..len)
            .map(|_| atoms[rng.int(0, atoms.len() - 1)])
            .collect();
        let whole = parse(&input, 0);
        let size = rng.int(1, 9);
        assert_eq!(
            parse(&input, size),
            whole,
            "input {input:?} at chunk size {size}"
        );
    }
}

/// Nesting as deep as a model can write: the scanner keeps its state on the heap.
#[test]
fn deep_nesting_and_huge_blocks_parse() {
    let deep = format!(
        "```python\nx = {}\n{}\n```\nafter",
        "[(".repeat(100_000),
        ")]".repeat(100_000)
    );
    for size in [0, 7] {
        let out = parse(&deep, size);
        assert_eq!(out.code.len(), 1);
        assert_eq!(out.code[0].len(), 400_005, "the whole block, and only it");
    }
    let huge = format!("```python\nprint({})\n```", vec!["'a'"; 300_000].join("+"));
    assert_eq!(parse(&huge, 4096).code.len(), 1);
}

/// The agent's default parser (`python`, `py`, `python3`): where it differs from the single
/// tag of the reference vectors (see docs/CAVEAGENT.md).
#[test]
fn the_agents_python_tags() {
    let cases: [(&str, Option<&str>, &str); 8] = [
        ("```py\nx=1\n```", Some("x=1"), ""),
        ("```python3\nx=1\n```", Some("x=1"), ""),
        ("```Python3 title=a.py\nx=1\n```", Some("x=1"), ""),
        ("```PY\r\nx=1\n```", Some("x=1"), ""),
        ("```python2\nx=1\n```", None, "```python2\nx=1\n```"),
        ("```pyth\nx=1\n```", None, "```pyth\nx=1\n```"),
        ("```\nx=1\n```", None, "```\nx=1\n```"),
        ("text ```py\nx=1\n```", None, "text ```py\nx=1\n```"),
    ];
    for (input, code, text) in cases {
        for size in [1, 3, 0] {
            let mut parser = FenceParser::with_tags(&["python", "py", "python3"]);
            let mut seen_text = String::new();
            let mut seen_code = None;
            let chars: Vec<char> = input.chars().collect();
            let step = if size == 0 { chars.len() } else { size };
            for chunk in chars.chunks(step) {
                let chunk: String = chunk.iter().collect();
                let parsed = parser.push(&chunk);
                seen_text.push_str(parsed.text);
                if let Some(c) = parsed.code {
                    seen_code = Some(c.to_owned());
                }
            }
            if !parser.is_complete() {
                let parsed = parser.flush();
                seen_text.push_str(parsed.text);
                if let Some(c) = parsed.code {
                    seen_code = Some(c.to_owned());
                }
            }
            assert_eq!(seen_code.as_deref(), code, "{input:?} at {size}");
            assert_eq!(seen_text, text, "{input:?} at {size}");
        }
    }
    // An opener cut off by the end of the stream is text.
    let mut parser = FenceParser::with_tags(&["python", "py", "python3"]);
    assert_eq!(parser.push("```pyt").text, "");
    assert_eq!(parser.flush().text, "```pyt");
}
