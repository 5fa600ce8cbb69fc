//! What models and servers send as they are, through the binary and a real SSE server: reasoning
//! in `<think>` tags inside the content, replies that are only tool calls, usage reported after
//! the block the agent stopped at; and cells that print more than the host holds.

use crate::cli::{block, command, events};
use crate::support::{Part, Reply, TestServer, answer, finish, finish_with_usage, text};
use serde_json::{Value as Json, json};

/// A streamed reply that calls `name` with `arguments`, in pieces of `size` characters.
fn tool_call_reply(id: &str, name: &str, arguments: &str, size: usize) -> Reply {
    let chars: Vec<char> = arguments.chars().collect();
    let mut parts = vec![Part::Data(json!({"choices": [{"index": 0, "delta": {
        "role": "assistant", "content": null,
        "tool_calls": [{"index": 0, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]
    }, "finish_reason": null}]}))];
    for piece in chars.chunks(size) {
        let piece: String = piece.iter().collect();
        parts.push(Part::Data(json!({"choices": [{"index": 0, "delta": {
            "tool_calls": [{"index": 0, "function": {"arguments": piece}}]
        }, "finish_reason": null}]})));
    }
    parts.push(finish("tool_calls"));
    parts.push(Part::Done);
    Reply::Sse(parts)
}

fn of_type<'a>(events: &'a [Json], kind: &str) -> Vec<&'a Json> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn thinking_in_tags_is_reasoning_and_never_runs() {
    let drafted = block("open('drafted', 'w').write('x')\nprint('drafted')");
    let content = format!(
        "<think>\nFirst idea:\n{drafted}\nNo, simpler.\n</think>\n\n{}",
        block("print('real')")
    );
    for runtime in ["inproc", "kernel"] {
        let server = TestServer::start([
            answer(&content, 3, "stop"),
            answer("<think>all good</think>Printed it.", 2, "stop"),
        ])
        .await;
        let out = command(
            Some(&server),
            &["run", "--json", "--runtime", runtime, "go"],
        )
        .output()
        .unwrap();
        let events = events(&out);
        let results = of_type(&events, "execution_result");
        assert_eq!(results.len(), 1, "{runtime}: {events:?}");
        assert_eq!(results[0]["output"], "real\n", "{runtime}");
        let thinking = of_type(&events, "thinking");
        assert_eq!(thinking.len(), 2, "{runtime}");
        assert!(
            thinking[0]["content"]
                .as_str()
                .unwrap()
                .contains("print('drafted')")
        );
        assert_eq!(thinking[1]["content"], "all good");
        let text: String = of_type(&events, "text")
            .iter()
            .map(|e| e["content"].as_str().unwrap())
            .collect();
        assert!(
            !text.contains("<think>") && !text.contains("drafted"),
            "{text}"
        );
        let stopped = events.last().unwrap();
        assert_eq!(stopped["stop_reason"], "completed");
        assert_eq!(stopped["content"], "Printed it.");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reply_that_is_only_a_tool_call_is_answered() {
    for runtime in ["inproc", "kernel"] {
        let server = TestServer::start([
            // gpt-oss's built-in tool: the arguments are the code itself.
            tool_call_reply("call_a", "python", "x = 6 * 7\nprint(x)", 4),
            tool_call_reply("call_b", "get_weather", r#"{"city": "Paris"}"#, 5),
            Reply::Sse(vec![text("The answer is 42."), finish("stop"), Part::Done]),
        ])
        .await;
        server.record(true);
        let out = command(
            Some(&server),
            &["run", "--json", "--runtime", runtime, "go"],
        )
        .output()
        .unwrap();
        let events = events(&out);
        let stopped = events.last().unwrap();
        assert_eq!(stopped["stop_reason"], "completed", "{runtime}: {events:?}");
        assert_eq!(stopped["steps"], 3);
        let code = of_type(&events, "code");
        assert_eq!(code[0]["code"], "x = 6 * 7\nprint(x)");
        assert_eq!(code[0]["tool_call"], "python");
        assert_eq!(of_type(&events, "execution_result")[0]["output"], "42\n");
        let answered = of_type(&events, "status");
        assert!(
            answered
                .iter()
                .any(|e| e["status"] == "tool_calls_answered"
                    && e["tools"] == json!(["get_weather"])),
            "{answered:?}"
        );
        // No request offers tools, and none replays a tool call: strict providers accept each.
        let received = server.received();
        assert_eq!(received.len(), 3);
        for request in &received {
            assert!(request.body.get("tools").is_none());
            for message in request.body["messages"].as_array().unwrap() {
                assert!(message.get("tool_calls").is_none() && message["role"] != "tool");
                assert!(!message["content"].as_str().unwrap_or("x").trim().is_empty());
            }
        }
        let last = received[2].body["messages"].as_array().unwrap();
        let n = last.len();
        assert_eq!(last[n - 2]["role"], "assistant");
        assert!(
            last[n - 1]["content"]
                .as_str()
                .unwrap()
                .contains("`get_weather`")
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn usage_reported_after_the_block_is_the_steps() {
    let code = format!("{}\nThis prints 2.", block("print(1 + 1)"));
    let mut parts: Vec<Part> = code
        .chars()
        .collect::<Vec<_>>()
        .chunks(6)
        .map(|c| text(&c.iter().collect::<String>()))
        .collect();
    parts.push(finish_with_usage("stop", 321, 17));
    parts.push(Part::Done);
    let server = TestServer::start([
        Reply::Sse(parts),
        Reply::Sse(vec![
            text("Two."),
            finish_with_usage("stop", 350, 2),
            Part::Done,
        ]),
    ])
    .await;
    let out = command(Some(&server), &["run", "--json", "go"])
        .output()
        .unwrap();
    let events = events(&out);
    let steps = of_type(&events, "step");
    assert_eq!(
        steps[0]["usage"],
        json!({"prompt_tokens": 321, "completion_tokens": 17, "total_tokens": 338, "estimated": false, "cached_tokens": 0, "reasoning_tokens": 0}),
        "{events:?}"
    );
    let stopped = events.last().unwrap();
    assert_eq!(stopped["usage"]["total_tokens"], 690);
    assert_eq!(stopped["usage"]["estimated"], false);
}

/// What the model was told about the first cell: the last message of the second request.
fn told_after_first_cell(server: &TestServer) -> String {
    let asked = server.received();
    asked[1].body["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// A cell that prints 20 MB, more than the host holds (8 MiB): `_output_1` is the whole text on
/// both runtimes, and with `--max-cell-output 10M` its first 10 MiB, the model told what was cut.
#[tokio::test(flavor = "multi_thread")]
async fn a_large_output_is_kept_whole_in_its_variable() {
    let print =
        block("import sys\nfor i in range(2000):\n    sys.stdout.write(f'{i:09}\\n' * 1000)");
    let read = block("print(len(_output_1), _output_1[10_000_000:10_000_009], _output_1[-10:-1])");
    for runtime in ["inproc", "kernel"] {
        for (limit, length, cut) in [(None, 20_000_000, false), (Some("10M"), 10 << 20, true)] {
            let server = TestServer::start([
                answer(&print, 64, "stop"),
                answer(&read, 64, "stop"),
                answer("Done.", 8, "stop"),
            ])
            .await;
            let mut args = vec!["run", "--json", "--runtime", runtime];
            if let Some(limit) = limit {
                args.extend(["--max-cell-output", limit]);
            }
            args.push("Print it all.");
            let out = command(Some(&server), &args).output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(0), "{runtime} {limit:?}: {stderr}");
            let events = events(&out);
            let results = of_type(&events, "execution_result");
            assert_eq!(results.len(), 2, "{runtime} {limit:?}");
            assert_eq!(results[0]["persisted_variable"], "_output_1");
            let last = if cut { "000001048" } else { "000001999" };
            let middle = "000001000";
            assert_eq!(
                results[1]["output"],
                format!("{length} {middle} {last}\n"),
                "{runtime} {limit:?}: _output_1 holds what was kept"
            );
            let told = told_after_first_cell(&server);
            assert!(
                told.contains(&format!("Output too large to inline ({length} chars)")),
                "{runtime} {limit:?}: {}",
                &told[..told.len().min(600)]
            );
            assert_eq!(
                told.contains("the limit a cell's output is kept to; the 9.1 MiB written after that were dropped."),
                cut,
                "{runtime} {limit:?}: {}",
                &told[..told.len().min(600)]
            );
        }
    }
}
