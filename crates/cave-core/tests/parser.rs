//! The fence parser against the reference vectors, at several chunkings, and as a property.

use cave_core::FenceParser;
use proptest::prelude::*;
use serde_json::Value;

/// What a whole stream produced: concatenated text, code blocks, remainder, completion.
#[derive(Debug, PartialEq)]
struct Outcome {
    text: String,
    code: Vec<String>,
    remainder: String,
    completed: bool,
}

/// Feeds `input` in chunks of `size` chars (0 = whole), then flushes if no block closed.
fn parse(input: &str, size: usize) -> Outcome {
    let mut parser = FenceParser::new("python");
    let mut out = Outcome {
        text: String::new(),
        code: vec![],
        remainder: String::new(),
        completed: false,
    };
    let chars: Vec<char> = input.chars().collect();
    let size = if size == 0 { chars.len().max(1) } else { size };
    let mut remainder = String::new();
    for chunk in chars.chunks(size) {
        let chunk: String = chunk.iter().collect();
        let parsed = parser.push(&chunk);
        out.text.push_str(parsed.text);
        out.code.extend(parsed.code.map(str::to_owned));
        if parser.is_complete() {
            remainder.push_str(parser.remainder());
        }
    }
    out.completed = parser.is_complete();
    out.remainder = remainder;
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, .. ProptestConfig::default() })]

    #[test]
    fn output_is_the_same_for_every_chunking(input in markdownish(), sizes in prop::collection::vec(1usize..9, 1..8)) {
        let whole = parse(&input, 0);
        // An irregular chunking: sizes cycle through `sizes`.
        let mut parser = FenceParser::new("python");
        let (mut text, mut code, mut remainder) = (String::new(), vec![], String::new());
        let chars: Vec<char> = input.chars().collect();
        let (mut at, mut i) = (0, 0);
        while at < chars.len() {
            let end = (at + sizes[i % sizes.len()]).min(chars.len());
            let chunk: String = chars[at..end].iter().collect();
            let parsed = parser.push(&chunk);
            text.push_str(parsed.text);
            code.extend(parsed.code.map(str::to_owned));
            if parser.is_complete() { remainder.push_str(parser.remainder()); }
            at = end;
            i += 1;
        }
        let completed = parser.is_complete();
        if !completed {
            let parsed = parser.flush();
            text.push_str(parsed.text);
            code.extend(parsed.code.map(str::to_owned));
        }
        prop_assert_eq!(Outcome { text, code, remainder, completed }, whole);
    }

    #[test]
    fn nothing_is_invented_or_lost_in_prose(input in "[^`]{0,60}") {
        let out = parse(&input, 1);
        prop_assert_eq!(out.text, input);
    }
}
