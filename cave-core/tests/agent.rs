//! The agent loop with `ScriptedModel` and the in-test runtime.

use crate::support::FakeRuntime;
use cave_core::{
    Agent, AgentBuilder, BuildError, ByteEstimator, CancellationToken, CodePolicy, Compactor,
    Event, FinishReason, Interruption, Message, ModelError, ModelErrorKind, ModelInfo, Prepared,
    Runtime, Status, StopError, StopErrorKind, StopReason, Summarized, TokenAnchor, TokenEstimator,
    Usage, Value, Violation, prompt,
};
use cave_testing::{Reply, ScriptedModel};
use futures_util::StreamExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

fn block(src: &str) -> String {
    format!("```python\n{src}\n```")
}

struct Setup {
    model: Arc<ScriptedModel>,
    runtime: Arc<FakeRuntime>,
}

impl Setup {
    fn new(replies: impl IntoIterator<Item = Reply>) -> Self {
        Self::with(ScriptedModel::new(replies), FakeRuntime::new())
    }
    fn with(model: ScriptedModel, runtime: FakeRuntime) -> Self {
        Self {
            model: Arc::new(model),
            runtime: Arc::new(runtime),
        }
    }
    fn builder(&self) -> AgentBuilder {
        AgentBuilder::new(self.model.clone(), self.runtime.clone())
    }
    fn agent(&self) -> Agent {
        self.builder().build().unwrap()
    }
}

async fn events(agent: &mut Agent, prompt: &str) -> Vec<Event> {
    agent.stream(prompt).collect().await
}

fn kind(event: &Event) -> String {
    serde_json::to_value(event).unwrap()["type"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Event kinds with consecutive duplicates folded (text and thinking stream in pieces).
fn shape(events: &[Event]) -> Vec<String> {
    let mut kinds: Vec<String> = events.iter().map(kind).collect();
    kinds.dedup();
    kinds
}

fn stopped(events: &[Event]) -> (String, StopReason, u32, Usage, Option<StopError>) {
    match events.last() {
        Some(Event::Stopped {
            content,
            stop_reason,
            steps,
            usage,
            error,
            ..
        }) => (content.clone(), *stop_reason, *steps, *usage, error.clone()),
        other => panic!("last event is not stopped: {other:?}"),
    }
}

fn text_of(events: &[Event]) -> String {
    events
        .iter()
        .filter_map(|e| {
            if let Event::Text { content } = e {
                Some(content.as_str())
            } else {
                None
            }
        })
        .collect()
}

/// The history without the system prompt, as (type, content) pairs.
fn turns(agent: &Agent) -> Vec<(String, String)> {
    agent
        .history()
        .iter()
        .skip(1)
        .map(|m| {
            let v = serde_json::to_value(m).unwrap();
            (
                v["type"].as_str().unwrap().to_owned(),
                m.content().to_owned(),
            )
        })
        .collect()
}

fn result_of(events: &[Event]) -> (String, bool, Option<String>) {
    events
        .iter()
        .find_map(|e| match e {
            Event::ExecutionResult {
                output,
                success,
                persisted_variable,
                ..
            } => Some((output.clone(), *success, persisted_variable.clone())),
            _ => None,
        })
        .expect("an execution result")
}

#[tokio::test]
async fn a_code_step_then_an_answer() {
    let s = Setup::new([
        Reply::text(format!("Let me check.\n{}\nignored", block("print('2')"))),
        Reply::text("It is 2."),
    ]);
    let mut agent = s.agent();
    let ev = events(&mut agent, "What is 1+1?").await;
    assert_eq!(
        shape(&ev),
        [
            "user_prompt",
            "text",
            "code",
            "execution_result",
            "step",
            "text",
            "final_response",
            "step",
            "stopped"
        ]
    );
    assert_eq!(
        ev[0],
        Event::UserPrompt {
            content: "What is 1+1?".into(),
            format_version: cave_core::EVENT_FORMAT_VERSION,
        }
    );
    assert_eq!(text_of(&ev), "Let me check.\nIt is 2.");
    let (content, reason, steps, _, error) = stopped(&ev);
    assert_eq!(
        (content.as_str(), reason, steps, error),
        ("It is 2.", StopReason::Completed, 2, None)
    );
    assert_eq!(s.runtime.executed(), ["print('2')"]);
    assert_eq!(result_of(&ev), ("2\n".into(), true, None));
    let history = turns(&agent);
    assert_eq!(history[0], ("user".into(), "What is 1+1?".into()));
    // Recorded text ends at the closing fence; what followed it is not history.
    assert_eq!(
        history[1],
        (
            "code".into(),
            format!("Let me check.\n{}", block("print('2')"))
        )
    );
    assert_eq!(
        history[2],
        ("execution_result".into(), prompt::execution_output("2\n"))
    );
    assert_eq!(history[3], ("assistant".into(), "It is 2.".into()));
    assert!(matches!(agent.history()[0], Message::System { .. }));
}

#[tokio::test]
async fn only_the_first_block_runs_at_every_chunk_size() {
    let answer = format!(
        "Here:\n{}\nand also\n{}\n",
        block("print('first')"),
        block("print('second')")
    );
    for size in 1..=20 {
        let s = Setup::new([
            Reply::text(answer.clone()).chunk_size(size),
            Reply::text("done"),
        ]);
        let mut agent = s.agent();
        let ev = events(&mut agent, "go").await;
        assert_eq!(
            s.runtime.executed(),
            ["print('first')"],
            "chunk size {size}"
        );
        assert_eq!(
            turns(&agent)[1].1,
            format!("Here:\n{}", block("print('first')")),
            "chunk size {size}"
        );
        assert_eq!(stopped(&ev).1, StopReason::Completed);
        assert_eq!(
            s.model.open_streams(),
            0,
            "the stream is closed after the fence"
        );
    }
}

#[tokio::test]
async fn run_drains_the_same_stream() {
    let s = Setup::new([
        Reply::text(block("print('a')")),
        Reply::text(block("print('b')")),
        Reply::text("ok"),
    ]);
    let mut agent = s.agent();
    let response = agent.run("go").await;
    assert!(response.completed());
    assert_eq!(response.code_snippets, ["print('a')", "print('b')"]);
    assert_eq!((response.steps, response.content.as_str()), (3, "ok"));
    assert!(
        response
            .to_string()
            .starts_with("AgentResponse(stop_reason=completed, steps=3, tokens=")
    );
}

#[tokio::test]
async fn max_steps_stops_with_the_last_turn_as_content() {
    let s = Setup::with(
        ScriptedModel::repeating(Reply::text(format!(
            "I will calculate.\n{}",
            block("print('1')")
        ))),
        FakeRuntime::new(),
    );
    let mut agent = s.builder().max_steps(3).build().unwrap();
    let response = agent.run("go").await;
    assert_eq!(
        (response.stop_reason, response.steps),
        (StopReason::MaxSteps, 3)
    );
    assert_eq!(
        response.content,
        format!("I will calculate.\n{}", block("print('1')"))
    );
    // Every code message is paired with its result.
    let history = turns(&agent);
    assert_eq!(history.last().unwrap().0, "execution_result");
}

#[tokio::test]
async fn zero_limits_stop_before_any_step() {
    let s = Setup::new([Reply::text("never")]);
    let response = s.builder().max_steps(0).build().unwrap().run("go").await;
    assert_eq!(
        (response.stop_reason, response.steps),
        (StopReason::MaxSteps, 0)
    );
    let response = s
        .builder()
        .max_run_time(Duration::ZERO)
        .build()
        .unwrap()
        .run("go")
        .await;
    assert_eq!(
        (response.stop_reason, response.steps),
        (StopReason::Timeout, 0)
    );
    assert_eq!(s.model.calls(), 0);
}

#[tokio::test]
async fn budgets_are_checked_between_steps() {
    // The agent stops reading at the closing fence, so these steps' usage is estimated:
    // about 300 prompt tokens and 6 completion tokens each.
    let code = || Reply::text(block("print('1')"));
    for (cap, which, kind) in [
        (15, "total", StopErrorKind::MaxTotalTokens),
        (10, "input", StopErrorKind::MaxInputTokens),
        (5, "output", StopErrorKind::MaxOutputTokens),
    ] {
        let s = Setup::new([code(), code(), Reply::text("never")]);
        let mut b = s.builder();
        match which {
            "total" => b.max_total_tokens(cap),
            "input" => b.max_input_tokens(cap),
            _ => b.max_output_tokens(cap),
        };
        let mut agent = b.build().unwrap();
        let response = agent.run("go").await;
        assert_eq!(
            (response.stop_reason, response.steps),
            (StopReason::BudgetExhausted, 1),
            "{which}"
        );
        // Which budget ran out is data.
        assert_eq!(response.error.map(|e| e.kind), Some(kind), "{which}");
        // The crossing step completed and was recorded.
        assert_eq!(turns(&agent).last().unwrap().0, "execution_result");
    }
    // Under the caps, the run completes.
    let s = Setup::new([code(), Reply::text("done")]);
    let response = s
        .builder()
        .max_total_tokens(100_000)
        .build()
        .unwrap()
        .run("go")
        .await;
    assert!(response.completed());
}

#[tokio::test]
async fn usage_is_summed_and_estimated_when_not_reported() {
    // Read to its end, the first call's reported usage is used; the second reports none.
    let s = Setup::new([
        Reply::text("The answer")
            .finish(FinishReason::Length)
            .usage(Usage::new(100, 7)),
        Reply::text(" is all good."),
    ]);
    let mut agent = s.agent();
    let response = agent.run("go").await;
    let second_prompt: u64 = s.model.requests()[1]
        .messages
        .iter()
        .map(|m| ByteEstimator.estimate(&m.content))
        .sum();
    let estimated = Usage::new(second_prompt, ByteEstimator.estimate(" is all good.")).estimate();
    assert_eq!(response.usage, Usage::new(100, 7) + estimated);
    assert!(response.usage.estimated, "part of it was estimated");
    // A reply too short to estimate still costs a token.
    let s = Setup::new([Reply::text("ok")]);
    let response = s.agent().run("go").await;
    assert_eq!(response.usage.completion_tokens, 1);
    assert!(response.usage.estimated);
    // All reported: not estimated.
    let s = Setup::new([Reply::text("ok").usage(Usage::new(10, 2))]);
    let response = s.agent().run("go").await;
    assert_eq!(response.usage, Usage::new(10, 2));
    assert!(!response.usage.estimated);
    // A call that failed before the model produced anything charges nothing.
    let refused = ModelError::new(ModelErrorKind::Auth, "401 Unauthorized");
    let s = Setup::new([Reply::fails(refused)]);
    let response = s.agent().run("go").await;
    assert_eq!(response.stop_reason, StopReason::ModelError);
    assert_eq!(response.usage, Usage::default());
}

/// The usage a provider reports after the block the agent stopped at (its last chunk) is read
/// while the code runs, and is the step's usage instead of an estimate.
#[tokio::test]
async fn usage_after_the_block_is_taken_while_the_code_runs() {
    let s = Setup::new([
        Reply::text(format!("{}\nThat prints 1.", block("print(1)"))).usage(Usage::new(100, 20)),
        Reply::text("Done.").usage(Usage::new(130, 2)),
    ]);
    let mut agent = s.agent();
    let ev = events(&mut agent, "go").await;
    let steps: Vec<Usage> = ev
        .iter()
        .filter_map(|e| match e {
            Event::Step { usage, .. } => Some(*usage),
            _ => None,
        })
        .collect();
    assert_eq!(steps, [Usage::new(100, 20), Usage::new(130, 2)]);
    let (_, _, _, usage, _) = stopped(&ev);
    assert_eq!(usage, Usage::new(230, 22));
    assert!(!usage.estimated);
    assert_eq!(s.model.open_streams(), 0, "the tail was read and let go");
    // A model that goes on talking past the wait is cut off: the step stays estimated.
    let s = Setup::new([
        Reply::text(block("print(1)"))
            .then_stall(Duration::from_secs(30))
            .usage(Usage::new(100, 20)),
        Reply::text("Done."),
    ]);
    let ev = events(&mut s.agent(), "go").await;
    let (_, reason, _, usage, _) = stopped(&ev);
    assert_eq!(reason, StopReason::Completed);
    assert!(usage.estimated);
    assert_eq!(s.model.open_streams(), 0);
}

/// Small models often end their answer inside the block, with no closing fence: at a normal
/// end the block runs, marked `unclosed`; the model is then asked to go on as usual.
#[tokio::test]
async fn an_answer_that_ends_inside_a_block_runs_it() {
    let s = Setup::new([
        Reply::text("Let me check.\n```python\nx = 4\nprint(x)\n"),
        Reply::text("Four."),
    ]);
    let mut agent = s.agent();
    let ev = events(&mut agent, "go").await;
    assert_eq!(s.runtime.executed(), ["x = 4\nprint(x)"]);
    let code = ev
        .iter()
        .find(|e| matches!(e, Event::Code { .. }))
        .expect("a code event");
    assert_eq!(
        serde_json::to_value(code).unwrap(),
        serde_json::json!({"type": "code", "code": "x = 4\nprint(x)", "unclosed": true})
    );
    let text: String = ev
        .iter()
        .filter_map(|e| match e {
            Event::Text { content } => Some(content.as_str()),
            _ => None,
        })
        .collect();
    assert!(text.starts_with("Let me check.\n"), "{text:?}");
    assert_eq!(stopped(&ev).1, StopReason::Completed);
    // A closed block is not marked.
    let s = Setup::new([Reply::text("```python\nx = 1\n```"), Reply::text("One.")]);
    let ev = events(&mut s.agent(), "go").await;
    let code = ev.iter().find(|e| matches!(e, Event::Code { .. })).unwrap();
    assert_eq!(
        serde_json::to_value(code).unwrap(),
        serde_json::json!({"type": "code", "code": "x = 1"})
    );
    // A blank unterminated block is text, and the answer is final.
    let s = Setup::new([Reply::text("Done.\n```python\n\n")]);
    let response = s.agent().run("go").await;
    assert_eq!(response.stop_reason, StopReason::Completed);
    assert!(s.runtime.executed().is_empty());
}

/// `py` and `python3` open a block too, in any case; a bare fence does not.
#[tokio::test]
async fn python_tags_small_models_write_open_blocks() {
    for tag in ["py", "python3", "PY", "Python3 title=demo"] {
        let s = Setup::new([
            Reply::text(format!("```{tag}\nprint(1)\n```")),
            Reply::text("Done."),
        ]);
        s.agent().run("go").await;
        assert_eq!(s.runtime.executed(), ["print(1)"], "{tag}");
    }
    for text in [
        "```\nprint(1)\n```",
        "```pyx\nprint(1)\n```",
        "```python2\nprint(1)\n```",
    ] {
        let s = Setup::new([Reply::text(text)]);
        let response = s.agent().run("go").await;
        assert!(s.runtime.executed().is_empty(), "{text}");
        assert_eq!(response.stop_reason, StopReason::Completed);
    }
    // A host that chose its own tag gets exactly that tag.
    let s = Setup::new([Reply::text("```py\nprint(1)\n```")]);
    let mut builder = s.builder();
    builder.python_block_identifier("python");
    builder.build().unwrap().run("go").await;
    assert_eq!(s.runtime.executed(), ["print(1)"]);
    let s = Setup::new([Reply::text("```py\nprint(1)\n```")]);
    let mut builder = s.builder();
    builder.python_block_identifier("pycode");
    builder.build().unwrap().run("go").await;
    assert!(s.runtime.executed().is_empty());
}

#[tokio::test]
async fn a_block_cut_by_the_output_limit_runs_once_after_resuming() {
    let s = Setup::new([
        Reply::text("Working...\n```python\nx = 4\nprint(").finish(FinishReason::Length),
        Reply::text("'5')\n```"),
        Reply::text("Five."),
    ]);
    let mut agent = s.agent();
    let ev = events(&mut agent, "go").await;
    assert!(ev.contains(&Event::Status(Status::OutputRecovery {
        recovery: 1,
        max_recoveries: 3
    })));
    assert_eq!(s.runtime.executed(), ["x = 4\nprint('5')"]);
    assert_eq!(
        turns(&agent)[1..4],
        [
            (
                "assistant".into(),
                "Working...\n```python\nx = 4\nprint(".into()
            ),
            ("user".into(), prompt::OUTPUT_RECOVERY_PROMPT.into()),
            ("code".into(), "'5')\n```".into()),
        ]
    );
    assert_eq!(stopped(&ev).1, StopReason::Completed);
}

#[tokio::test]
async fn fragments_join_into_one_answer() {
    let s = Setup::new([
        Reply::text("The answer is").finish(FinishReason::Length),
        Reply::text(" 42."),
    ]);
    let response = s.agent().run("go").await;
    assert_eq!(
        (response.content.as_str(), response.stop_reason),
        ("The answer is 42.", StopReason::Completed)
    );
}

#[tokio::test]
async fn recovery_gives_up_after_three() {
    let s = Setup::with(
        ScriptedModel::repeating(Reply::text("still going").finish(FinishReason::Length)),
        FakeRuntime::new(),
    );
    let mut agent = s.agent();
    let response = agent.run("go").await;
    assert_eq!(
        (response.stop_reason, response.steps),
        (StopReason::ModelError, 4)
    );
    assert_eq!(response.content, "still going".repeat(4));
    let error = response.error.unwrap();
    assert_eq!(error.kind, StopErrorKind::Truncated);
    assert!(error.message.contains("output limit"));
}

#[tokio::test]
async fn a_cap_spent_on_thinking_adds_no_empty_message() {
    let s = Setup::new([
        Reply::default()
            .reasoning("hmm")
            .finish(FinishReason::Length),
        Reply::text("Answer."),
    ]);
    let mut agent = s.agent();
    let response = agent.run("go").await;
    assert!(response.completed());
    assert_eq!(
        turns(&agent)[1],
        ("user".into(), prompt::OUTPUT_RECOVERY_PROMPT.into())
    );
}

#[tokio::test]
async fn a_stream_broken_mid_answer_is_resumed() {
    let broken = ModelError::new(ModelErrorKind::StreamInterrupted, "connection reset");
    let s = Setup::new([
        Reply::text("Partial ans").then_error(broken),
        Reply::text("wer."),
    ]);
    let mut agent = s.agent();
    let response = agent.run("go").await;
    assert_eq!(
        (response.content.as_str(), response.stop_reason),
        ("Partial answer.", StopReason::Completed)
    );
    assert_eq!(
        turns(&agent)[2],
        ("user".into(), prompt::STREAM_INTERRUPTED_PROMPT.into())
    );
}

#[tokio::test]
async fn failures_before_any_answer_end_the_run() {
    let auth = ModelError::new(ModelErrorKind::Auth, "invalid API key");
    for reply in [
        Reply::fails(auth.clone()),
        Reply::default().then_error(auth),
    ] {
        let s = Setup::new([reply]);
        let mut agent = s.agent();
        let response = agent.run("go").await;
        assert_eq!(response.stop_reason, StopReason::ModelError);
        // A caller routes on the kind, not the prose.
        let error = response.error.unwrap();
        assert!(matches!(error.kind, StopErrorKind::Auth) && error.kind.is_model());
        assert_eq!(error.message, "invalid API key");
        assert_eq!(turns(&agent).len(), 1, "nothing recorded after the prompt");
    }
}

#[tokio::test]
async fn an_error_after_the_finish_reason_is_not_a_failure() {
    let lost_usage = ModelError::new(ModelErrorKind::StreamInterrupted, "lost usage chunk");
    let s = Setup::new([Reply::text("Done.")
        .then_finish(FinishReason::Stop)
        .then_error(lost_usage)]);
    let response = s.agent().run("go").await;
    assert_eq!(
        (response.stop_reason, s.model.calls()),
        (StopReason::Completed, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn stalls_are_fatal_before_content_and_resumed_after() {
    let s = Setup::new([Reply::default().then_hang()]);
    let response = s.agent().run("go").await;
    assert_eq!(response.stop_reason, StopReason::ModelError);
    let error = response.error.unwrap();
    assert_eq!(error.kind, StopErrorKind::StreamStalled);
    assert!(error.message.contains("stalled"));

    let s = Setup::new([Reply::text("Half").then_hang(), Reply::text(" done.")]);
    let response = s.agent().run("go").await;
    assert_eq!(
        (response.content.as_str(), response.stop_reason),
        ("Half done.", StopReason::Completed)
    );
}

#[tokio::test(start_paused = true)]
async fn a_backoff_extends_the_idle_deadline() {
    let reply = Reply::default()
        .then_backoff(Duration::from_secs(200))
        .then_stall(Duration::from_secs(250))
        .then_text("ok");
    let s = Setup::new([reply]);
    let ev = events(&mut s.agent(), "go").await;
    assert!(
        ev.contains(&Event::Backoff {
            delay: 200.0,
            reason: None
        }),
        "the wait is announced"
    );
    assert_eq!(stopped(&ev).1, StopReason::Completed);
    let reply = Reply::default()
        .then_stall(Duration::from_secs(121))
        .then_text("ok");
    let s = Setup::new([reply]);
    assert_eq!(
        s.agent().run("go").await.stop_reason,
        StopReason::ModelError
    );
}

#[tokio::test]
async fn how_an_ended_stream_is_judged() {
    let cases: Vec<(Reply, StopReason, &str)> = vec![
        (
            Reply::text("no finish").no_finish(),
            StopReason::ModelError,
            "",
        ),
        (
            // An empty 200, as llama.cpp answers a prompt larger than its context.
            Reply::default().no_finish(),
            StopReason::ModelError,
            "tokens (estimated): if the server's context is smaller",
        ),
        (
            Reply::text("partly").finish(FinishReason::ContentFilter),
            StopReason::ModelError,
            "withdrew",
        ),
        (
            Reply::default().finish(FinishReason::ContentFilter),
            StopReason::ModelError,
            "filtered",
        ),
        (
            Reply::default().refusal("I can't help with that."),
            StopReason::Completed,
            "",
        ),
        (
            Reply::default()
                .refusal("No.")
                .finish(FinishReason::ContentFilter),
            StopReason::Completed,
            "",
        ),
        (
            Reply::text("  \n "),
            StopReason::ModelError,
            "without returning an answer",
        ),
        (
            Reply::default().reasoning("thinking only"),
            StopReason::ModelError,
            "without returning an answer",
        ),
        (
            // Cut by the output cap inside a block, and never resumed: not run.
            Reply::text("Here:\n```python\nx = 1\n").no_finish(),
            StopReason::ModelError,
            "",
        ),
    ];
    for (reply, expected, error) in cases {
        let s = Setup::with(
            ScriptedModel::new([reply.clone()]).with_fallback(Reply::text("x").no_finish()),
            FakeRuntime::new(),
        );
        let response = s.agent().run("go").await;
        assert_eq!(response.stop_reason, expected, "{reply:?}");
        assert!(
            response
                .error
                .map(|e| e.message)
                .unwrap_or_default()
                .contains(error),
            "{reply:?}"
        );
        assert!(
            s.runtime.executed().is_empty(),
            "an unterminated block never runs"
        );
    }
    let s = Setup::new([Reply::default().refusal("I can't help with that.")]);
    let ev = events(&mut s.agent(), "go").await;
    assert_eq!(text_of(&ev), "I can't help with that.");
    assert_eq!(stopped(&ev).0, "I can't help with that.");
}

/// Each step says what its model call cost and how long its cell ran; the steps' tokens add
/// up to the run's.
#[tokio::test]
async fn each_step_says_its_tokens_and_timings() {
    let s = Setup::new([
        Reply::text(block("import time; time.sleep(0.05)")),
        Reply::text("Done.").usage(Usage::new(150, 5)),
    ]);
    let ev = events(&mut s.agent(), "go").await;
    let steps: Vec<(u32, Usage, f64, Option<f64>)> = ev
        .iter()
        .filter_map(|e| match e {
            Event::Step {
                step,
                usage,
                model_seconds,
                execution_seconds,
            } => Some((*step, *usage, *model_seconds, *execution_seconds)),
            _ => None,
        })
        .collect();
    assert_eq!(steps.len(), 2, "{ev:?}");
    // The agent stops reading at the closing fence, before the usage: estimated.
    assert_eq!(steps[0].0, 1);
    assert!(steps[0].1.estimated && steps[0].1.total_tokens > 0);
    assert_eq!((steps[1].0, steps[1].1), (2, Usage::new(150, 5)));
    assert!(steps.iter().all(|s| s.2 >= 0.0));
    assert!(steps[0].3.is_some(), "the first step ran a cell");
    assert_eq!(steps[1].3, None, "the answer ran none");
    let total = stopped(&ev).3;
    assert_eq!(total, steps[0].1 + steps[1].1);
    let json = serde_json::to_value(&ev[ev.len() - 2]).unwrap();
    assert_eq!(json["type"], "step");
    assert!(json.get("execution_seconds").is_none(), "{json}");
}

#[tokio::test]
async fn thinking_streams_then_seals_before_the_answer() {
    let s = Setup::new([Reply::text("Answer.")
        .reasoning("Let me think about it.")
        .chunk_size(5)]);
    let ev = events(&mut s.agent(), "go").await;
    assert_eq!(
        shape(&ev),
        [
            "user_prompt",
            "thinking_chunk",
            "thinking",
            "text",
            "final_response",
            "step",
            "stopped"
        ]
    );
    let thinking = ev.iter().find_map(|e| {
        if let Event::Thinking { content, .. } = e {
            Some(content)
        } else {
            None
        }
    });
    assert_eq!(thinking.unwrap(), "Let me think about it.");
}

/// Reasoning written in `<think>` tags in the content, as models served without a reasoning
/// parser send it: reported as thinking at every chunking, the block drafted inside never runs,
/// the block after it does.
#[tokio::test]
async fn thinking_in_tags_is_reasoning_and_its_code_never_runs() {
    let answer = format!(
        "<think>\nI could try:\n{}\nbut better not.\n</think>\n\nHere:\n{}",
        block("print('drafted')"),
        block("print('real')")
    );
    for size in [1, 3, 7, 13, 10_000] {
        let s = Setup::new([
            Reply::text(answer.clone()).chunk_size(size),
            Reply::text("<thinking>done?</thinking>Done."),
        ]);
        let mut agent = s.agent();
        let ev = events(&mut agent, "go").await;
        assert_eq!(
            s.runtime.executed(),
            ["print('real')"],
            "chunks of {size}: only the block after the reasoning ran"
        );
        let thinking: Vec<&String> = ev
            .iter()
            .filter_map(|e| match e {
                Event::Thinking { content, .. } => Some(content),
                _ => None,
            })
            .collect();
        assert_eq!(thinking.len(), 2, "chunks of {size}");
        assert!(thinking[0].contains("print('drafted')") && !thinking[0].contains("<think>"));
        assert_eq!(thinking[1], "done?");
        assert_eq!(text_of(&ev), format!("Here:\nDone."), "chunks of {size}");
        let (content, reason, ..) = stopped(&ev);
        assert_eq!((content.as_str(), reason), ("Done.", StopReason::Completed));
        // The history keeps reasoning beside the answer, never in its text.
        let last = agent.history().last().unwrap();
        assert_eq!(last.content(), "Done.");
    }
}

/// Reasoning in tags that is never closed is reasoning too: nothing in it runs, and the model
/// is asked for its answer (within the resume limit).
#[tokio::test]
async fn unclosed_thinking_in_tags_asks_for_the_answer() {
    let s = Setup::new([
        Reply::text(format!("<think>maybe {}", block("print('drafted')"))),
        Reply::text("The answer is 4."),
    ]);
    let mut agent = s.agent();
    let ev = events(&mut agent, "go").await;
    assert!(s.runtime.executed().is_empty(), "nothing drafted ran");
    let (content, reason, ..) = stopped(&ev);
    assert_eq!(
        (content.as_str(), reason),
        ("The answer is 4.", StopReason::Completed)
    );
    assert!(
        turns(&agent).contains(&("user".into(), prompt::UNCLOSED_THINKING_PROMPT.into())),
        "{:?}",
        turns(&agent)
    );
    // A model that never closes its reasoning ends the run as an empty answer.
    let s = Setup::with(
        ScriptedModel::repeating(Reply::text("<think>forever")),
        FakeRuntime::new(),
    );
    let ev = events(&mut s.agent(), "go").await;
    let (_, reason, _, _, error) = stopped(&ev);
    assert_eq!(reason, StopReason::ModelError);
    assert_eq!(error.unwrap().kind, StopErrorKind::EmptyAnswer);
}

/// A reply that is only a tool call carrying code (gpt-oss's `python`, a `run_code` habit) runs
/// that code as the turn's block, recorded as an ordinary code message; the request advertises
/// no tools, and the next one carries no tool call.
#[tokio::test]
async fn a_tool_call_with_code_runs_as_the_block() {
    let calls = [
        ("python", "print(6 * 7)".to_owned()),
        (
            "run_code",
            serde_json::json!({"code": "print(6 * 7)"}).to_string(),
        ),
        (
            "whatever",
            serde_json::json!({"script": "print(6 * 7)", "n": 1}).to_string(),
        ),
    ];
    for (tool, arguments) in calls {
        for size in [1, 5, 10_000] {
            let s = Setup::new([
                Reply::default()
                    .then_tool_call(tool, arguments.clone())
                    .chunk_size(size),
                Reply::text("It is 42."),
            ]);
            let mut agent = s.agent();
            let ev = events(&mut agent, "go").await;
            assert_eq!(
                s.runtime.executed(),
                ["print(6 * 7)"],
                "{tool} in chunks of {size}"
            );
            let code = ev.iter().find_map(|e| match e {
                Event::Code { tool_call, .. } => Some(tool_call.clone()),
                _ => None,
            });
            assert_eq!(code, Some(Some(tool.to_owned())));
            let (content, reason, steps, ..) = stopped(&ev);
            assert_eq!(
                (content.as_str(), reason, steps),
                ("It is 42.", StopReason::Completed, 2)
            );
            let recorded = &turns(&agent)[1];
            assert_eq!(recorded, &("code".to_owned(), block("print(6 * 7)")));
        }
    }
}

/// Any other tool call is answered with one correction and the run goes on.
#[tokio::test]
async fn a_tool_call_without_code_is_answered_and_the_run_goes_on() {
    let s = Setup::new([
        Reply::default().then_tool_call("get_weather", r#"{"city": "Paris"}"#),
        Reply::text("Let me look.").then_tool_call("search", r#"{"q": "x"}"#),
        Reply::text(block("print('ok')")),
        Reply::text("Done."),
    ]);
    let mut agent = s.agent();
    let ev = events(&mut agent, "go").await;
    let (content, reason, steps, ..) = stopped(&ev);
    assert_eq!(
        (content.as_str(), reason, steps),
        ("Done.", StopReason::Completed, 4)
    );
    assert_eq!(s.runtime.executed(), ["print('ok')"]);
    let answered: Vec<&Vec<String>> = ev
        .iter()
        .filter_map(|e| match e {
            Event::Status(Status::ToolCallsAnswered { tools }) => Some(tools),
            _ => None,
        })
        .collect();
    assert_eq!(
        answered,
        [&vec!["get_weather".to_owned()], &vec!["search".to_owned()]]
    );
    let turns = turns(&agent);
    assert_eq!(
        turns[1],
        (
            "assistant".into(),
            r#"get_weather({"city": "Paris"})"#.into()
        )
    );
    assert_eq!(turns[2].0, "user");
    assert!(turns[2].1.contains("`get_weather`") && turns[2].1.contains("```python"));
    assert_eq!(turns[3], ("assistant".into(), "Let me look.".into()));
    // Every request is a plain conversation: assistant text, never an empty message.
    for request in s.model.requests() {
        assert!(
            request
                .messages
                .iter()
                .all(|m| !m.content.trim().is_empty())
        );
    }
}

/// A compactor that records what the agent asked of it.
#[derive(Default)]
struct TestCompactor {
    summarize_every_step: bool,
    /// Summaries fail (with this message) instead of replacing history.
    fail_with: Option<&'static str>,
    overflow_calls: AtomicUsize,
    summaries: AtomicUsize,
}

/// What each summary call of the test compactor costs.
fn summary_usage() -> Usage {
    Usage::new(70, 30)
}

#[async_trait::async_trait]
impl Compactor for TestCompactor {
    fn prepare(
        &self,
        _history: &[Message],
        _anchor: Option<TokenAnchor>,
        _estimator: &dyn TokenEstimator,
    ) -> Prepared {
        Prepared::new(None, self.summarize_every_step)
    }
    async fn summarize(&self, history: Vec<Message>, _: &dyn TokenEstimator) -> Summarized {
        self.summaries.fetch_add(1, Ordering::SeqCst);
        if let Some(why) = self.fail_with {
            return Summarized::failed(
                history,
                summary_usage(),
                cave_core::SummaryError::Unusable(why.to_owned()),
            );
        }
        let mut out = vec![
            history[0].clone(),
            Message::Summary {
                content: "<s>old</s>".into(),
                body: "old".into(),
            },
        ];
        out.extend(history.into_iter().skip(1).rev().take(1));
        Summarized::new(out, summary_usage())
    }
    async fn recover_from_overflow(
        &self,
        history: Vec<Message>,
        estimator: &dyn TokenEstimator,
    ) -> Summarized {
        self.overflow_calls.fetch_add(1, Ordering::SeqCst);
        self.summarize(history, estimator).await
    }
}

#[tokio::test]
async fn a_prompt_too_long_is_compacted_and_retried_once() {
    let too_long = || ModelError::new(ModelErrorKind::PromptTooLong, "context length exceeded");
    let s = Setup::new([Reply::fails(too_long()), Reply::text("Fits now.")]);
    let compactor = Arc::new(TestCompactor::default());
    let mut agent = s.builder().compactor(compactor.clone()).build().unwrap();
    agent.push_message(Message::user("old question"));
    agent.push_message(Message::assistant("old answer"));
    let ev = events(&mut agent, "go").await;
    assert_eq!(
        shape(&ev),
        [
            "user_prompt",
            "status",
            "text",
            "final_response",
            "step",
            "stopped"
        ]
    );
    assert!(matches!(ev[1], Event::Status(Status::Compacting)));
    assert!(matches!(
        ev[2],
        Event::Status(Status::Compacted {
            before: 4,
            after: 3
        })
    ));
    assert_eq!(compactor.overflow_calls.load(Ordering::SeqCst), 1);
    assert_eq!(stopped(&ev).1, StopReason::Completed);

    let s = Setup::new([
        Reply::fails(too_long()),
        Reply::fails(too_long()),
        Reply::text("never"),
    ]);
    let response = s
        .builder()
        .compactor(compactor.clone())
        .build()
        .unwrap()
        .run("go")
        .await;
    assert_eq!(
        (response.stop_reason, s.model.calls()),
        (StopReason::ModelError, 2)
    );
}

#[tokio::test]
async fn compaction_is_announced_and_its_history_kept() {
    let s = Setup::with(
        ScriptedModel::new([Reply::text("Hi.")])
            .with_info(ModelInfo::new("m").with_max_output_tokens(Some(4096))),
        FakeRuntime::new(),
    );
    let compactor = Arc::new(TestCompactor {
        summarize_every_step: true,
        ..TestCompactor::default()
    });
    let mut agent = s.builder().compactor(compactor.clone()).build().unwrap();
    let ev = events(&mut agent, "go").await;
    assert_eq!(shape(&ev)[..3], ["user_prompt", "status", "text"]);
    assert!(matches!(agent.history()[1], Message::Summary { .. }));
    assert_eq!(compactor.summaries.load(Ordering::SeqCst), 1);
    // The summary's tokens are part of the run's usage.
    let (_, _, _, usage, _) = stopped(&ev);
    assert!(
        usage.total_tokens >= summary_usage().total_tokens,
        "{usage:?}"
    );
}

#[tokio::test]
async fn a_failed_summary_is_an_event_and_its_tokens_count() {
    let s = Setup::new([Reply::text("Hi.")]);
    let compactor = Arc::new(TestCompactor {
        summarize_every_step: true,
        fail_with: Some("the summarizer refused"),
        ..TestCompactor::default()
    });
    let mut agent = s.builder().compactor(compactor.clone()).build().unwrap();
    let ev = events(&mut agent, "go").await;
    assert!(
        ev.contains(&Event::Status(Status::CompactionFailed {
            message: "the summarizer refused".into()
        })),
        "{ev:?}"
    );
    assert!(
        !ev.iter()
            .any(|e| matches!(e, Event::Status(Status::Compacted { .. })))
    );
    let (_, reason, _, usage, _) = stopped(&ev);
    assert_eq!(reason, StopReason::Completed);
    assert!(usage.total_tokens >= summary_usage().total_tokens);
}

#[tokio::test]
async fn the_estimator_is_the_agents_own_input() {
    /// Ten tokens per character: easy to see in the estimated usage.
    struct Heavy;
    impl TokenEstimator for Heavy {
        fn estimate(&self, text: &str) -> u64 {
            text.chars().count() as u64 * 10
        }
    }
    let s = Setup::new([Reply::text("Hi.")]);
    let mut agent = s.builder().estimator(Heavy).build().unwrap();
    let ev = events(&mut agent, "go").await;
    let (_, _, _, usage, _) = stopped(&ev);
    assert_eq!(
        usage.completion_tokens, 30,
        "three characters, estimated by Heavy"
    );
}

#[tokio::test]
async fn failed_cells_and_empty_cells_read_clearly() {
    let s = Setup::new([
        Reply::text(block(
            "print('before')\nraise ZeroDivisionError('division by zero')",
        )),
        Reply::text(block("raise_silent MemoryError('machinery died')")),
        Reply::text(block("x = 1")),
        Reply::text("ok"),
    ]);
    let mut agent = s.agent();
    let ev = events(&mut agent, "go").await;
    let results: Vec<_> = ev
        .iter()
        .filter_map(|e| {
            if let Event::ExecutionResult {
                output, success, ..
            } = e
            {
                Some((output.clone(), *success))
            } else {
                None
            }
        })
        .collect();
    assert!(
        results[0].0.starts_with("before\nTraceback")
            && results[0]
                .0
                .ends_with("ZeroDivisionError: division by zero\n")
    );
    assert!(!results[0].1);
    assert_eq!(results[1], ("MemoryError: machinery died".into(), false));
    assert_eq!(results[2], (prompt::EMPTY_OUTPUT.into(), true));
}

#[tokio::test]
async fn live_output_streams_before_the_result() {
    let s = Setup::new([Reply::text(block("stream(a,b,c)")), Reply::text("ok")]);
    let ev = events(&mut s.agent(), "go").await;
    let chunks: Vec<_> = ev
        .iter()
        .filter_map(|e| {
            if let Event::ExecutionOutput { chunk } = e {
                Some(chunk.as_str())
            } else {
                None
            }
        })
        .collect();
    assert_eq!(chunks, ["a", "b", "c"]);
    assert_eq!(
        shape(&ev)[1..4],
        ["code", "execution_output", "execution_result"]
    );
}

#[tokio::test]
async fn large_output_is_persisted_with_a_marker() {
    let s = Setup::new([
        Reply::text(block("big(6000)")),
        Reply::text(block("big(5001)")),
        Reply::text(block("big(5000)")),
        Reply::text("ok"),
    ]);
    s.runtime
        .bind("_output_1", Value::Str("model-made".into()))
        .await;
    let mut agent = s.agent();
    let ev = events(&mut agent, "go").await;
    let vars: Vec<_> = ev
        .iter()
        .filter_map(|e| {
            if let Event::ExecutionResult {
                persisted_variable, ..
            } = e
            {
                Some(persisted_variable.clone())
            } else {
                None
            }
        })
        .collect();
    assert_eq!(
        vars,
        [
            Some("_output_2".to_owned()),
            Some("_output_3".to_owned()),
            None
        ]
    );
    assert_eq!(
        s.runtime.value("_output_2").await,
        Some(Value::Str("x".repeat(6000)))
    );
    assert_eq!(
        s.runtime.value("_output_1").await,
        Some(Value::Str("model-made".into()))
    );
    let result = &turns(&agent)[2].1;
    assert!(result.contains("<persisted-output>\nOutput too large to inline (6000 chars)"));
    assert!(result.contains("`_output_2`") && result.contains("Preview (first 2000 chars):"));
    assert!(!result.contains(&"x".repeat(2001)));
    // The event carries the whole output.
    assert_eq!(result_of(&ev).0.len(), 6000);

    // A resumed history continues after the highest persisted index.
    let s2 = Setup::new([Reply::text(block("big(6000)")), Reply::text("ok")]);
    let mut resumed = s2
        .builder()
        .history(agent.take_history())
        .exec_output_preview_chars(0)
        .build()
        .unwrap();
    let ev = events(&mut resumed, "again").await;
    assert_eq!(result_of(&ev).2.as_deref(), Some("_output_4"));
    assert!(!turns(&resumed).last().unwrap().1.contains("Preview"));
}

#[tokio::test]
async fn runtime_failures_end_the_run_with_a_valid_history() {
    let s = Setup::with(
        ScriptedModel::new([Reply::text(block("big(9000)"))]),
        FakeRuntime {
            fail_bind: true,
            ..FakeRuntime::new()
        },
    );
    let mut agent = s.agent();
    let response = agent.run("go").await;
    assert_eq!(response.stop_reason, StopReason::RuntimeError);
    let error = response.error.unwrap();
    assert_eq!(error.kind, StopErrorKind::Runtime);
    assert!(error.message.contains("no memory left") && !error.kind.is_model());
    assert_eq!(
        turns(&agent).last().unwrap(),
        &(
            "execution_result".to_owned(),
            prompt::EXECUTION_INCOMPLETE.to_owned()
        )
    );

    let s = Setup::new([Reply::text(block("crash()"))]);
    let mut agent = s.agent();
    assert_eq!(agent.run("go").await.stop_reason, StopReason::RuntimeError);
    assert_eq!(
        turns(&agent).last().unwrap().1,
        prompt::EXECUTION_INCOMPLETE
    );
}

#[tokio::test]
async fn a_panic_is_an_internal_error_and_the_agent_stays_usable() {
    let s = Setup::new([Reply::text(block("panic()")), Reply::text("fine")]);
    let mut agent = s.agent();
    let ev = events(&mut agent, "go").await;
    let (_, reason, _, _, error) = stopped(&ev);
    assert_eq!(reason, StopReason::InternalError);
    let error = error.unwrap();
    assert_eq!(error.kind, StopErrorKind::Internal);
    assert!(error.message.contains("fake runtime defect"));
    assert_eq!(
        turns(&agent).last().unwrap().1,
        prompt::EXECUTION_INCOMPLETE
    );
    assert!(agent.run("again").await.completed());
}

struct NoPrint;
impl CodePolicy for NoPrint {
    fn check(&self, code: &str) -> Vec<Violation> {
        code.lines()
            .enumerate()
            .filter(|(_, l)| l.contains("print"))
            .map(|(i, _)| {
                Violation::new(format!("Forbidden function call 'print' at line {}", i + 1))
                    .at_line(i + 1)
            })
            .collect()
    }
}

#[tokio::test]
async fn the_policy_blocks_code_before_it_runs() {
    let s = Setup::new([
        Reply::text(block("print('a')\nprint('b')")),
        Reply::text("ok"),
    ]);
    let mut agent = s.builder().policy(NoPrint).build().unwrap();
    let ev = events(&mut agent, "go").await;
    let message = "Code execution blocked: 2 violations found:\n  - Forbidden function call 'print' at line 1\n  - Forbidden function call 'print' at line 2";
    let violations: Vec<Violation> = (1..=2)
        .map(|line| {
            Violation::new(format!("Forbidden function call 'print' at line {line}")).at_line(line)
        })
        .collect();
    assert!(ev.contains(&Event::SecurityError {
        message: message.into(),
        violations,
    }));
    assert!(s.runtime.executed().is_empty());
    assert_eq!(
        turns(&agent)[2],
        ("execution_result".into(), prompt::security_error(message))
    );
}

#[tokio::test]
async fn an_exec_timeout_needs_an_interruptible_runtime() {
    let s = Setup::new([]);
    let err = s
        .builder()
        .max_exec_timeout(Duration::from_secs(1))
        .build()
        .unwrap_err();
    assert!(matches!(err, BuildError::ExecTimeoutNeedsInterrupt));
    assert!(err.to_string().contains("interrupter"));
}

/// An agent whose one cell, `code`, runs on a runtime that answers an interrupt with
/// `outcome`, under a limit of 0.5 s.
fn timed(code: &str, outcome: Interruption) -> (Setup, Agent) {
    let s = Setup::with(
        ScriptedModel::new([Reply::text(block(code)), Reply::text("ok")]),
        FakeRuntime::interruptible(outcome),
    );
    let agent = s
        .builder()
        .max_exec_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    (s, agent)
}

#[tokio::test(start_paused = true)]
async fn an_execution_past_its_limit_is_interrupted() {
    for (outcome, code, state_lost, notice) in [
        (Interruption::Delivered, "spin()", false, None),
        (
            Interruption::StateLost,
            "spin()",
            true,
            Some(prompt::STATE_LOST_NOTICE),
        ),
        (
            Interruption::Pending,
            "block()",
            false,
            Some(prompt::INTERRUPT_PENDING_NOTICE),
        ),
    ] {
        let (s, mut agent) = timed(code, outcome);
        assert!(
            agent
                .system_prompt()
                .contains("Each execution is stopped after 0.5 seconds")
        );
        let ev = events(&mut agent, "go").await;
        assert!(
            ev.contains(&Event::ExecutionTimeout {
                timeout: 0.5,
                state_lost
            }),
            "{outcome:?}"
        );
        assert_eq!(ev.iter().any(Event::lost_state), state_lost, "{outcome:?}");
        assert_eq!(s.runtime.interrupts(), 1);
        let result = &turns(&agent)[2].1;
        assert!(result.starts_with(&prompt::execution_timeout(0.5)));
        assert_eq!(notice.is_some_and(|n| result.contains(n)), notice.is_some());
        assert_eq!(stopped(&ev).1, StopReason::Completed);
    }
    let plain = Setup::new([]).agent().system_prompt();
    assert!(!plain.contains("stopped after") && !plain.contains("timeout"));
    // The response says it too, for a session saved after the run.
    for (outcome, state_lost) in [
        (Interruption::StateLost, true),
        (Interruption::Delivered, false),
    ] {
        let (_s, mut agent) = timed("spin()", outcome);
        assert_eq!(agent.run("go").await.state_lost, state_lost, "{outcome:?}");
    }
}

#[tokio::test]
async fn cancelling_interrupts_the_execution_and_repairs_history() {
    let s = Setup::with(
        ScriptedModel::new([Reply::text(block("spin()")), Reply::text("fresh")]),
        FakeRuntime::interruptible(Interruption::Delivered),
    );
    let mut agent = s.agent();
    let cancel = CancellationToken::new();
    let mut stream = agent.stream_until("go", cancel.clone());
    let mut seen = Vec::new();
    while let Some(event) = stream.next().await {
        if matches!(event, Event::Code { .. }) {
            // Cancel once the execution is in flight.
            let cancel = cancel.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                cancel.cancel();
            });
        }
        seen.push(event);
    }
    drop(stream);
    assert_eq!(stopped(&seen).1, StopReason::Cancelled);
    assert_eq!(s.runtime.interrupts(), 1);
    let history = turns(&agent);
    assert_eq!(
        history[history.len() - 2..],
        [
            (
                "execution_result".to_owned(),
                prompt::EXECUTION_CANCELLED.to_owned()
            ),
            ("user".to_owned(), prompt::USER_INTERRUPTION.to_owned()),
        ]
    );
    assert!(agent.run("again").await.completed(), "the next run works");
    assert_eq!(s.model.open_streams(), 0);
}

#[tokio::test]
async fn cancelling_a_runtime_that_lost_its_state_says_so() {
    let s = Setup::with(
        ScriptedModel::new([Reply::text(block("spin()"))]),
        FakeRuntime::interruptible(Interruption::StateLost),
    );
    let mut agent = s.agent();
    let cancel = CancellationToken::new();
    let canceller = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        canceller.cancel();
    });
    let response = agent.run_until("go", cancel).await;
    assert_eq!(response.stop_reason, StopReason::Cancelled);
    assert!(
        turns(&agent)
            .iter()
            .any(|(_, c)| c == prompt::EXECUTION_CANCELLED_STATE_LOST)
    );
}

#[tokio::test]
async fn dropping_the_stream_stops_the_run_and_repairs_history() {
    let s = Setup::with(
        ScriptedModel::new([Reply::text(block("spin()")), Reply::text("fresh")]),
        FakeRuntime::interruptible(Interruption::Delivered),
    );
    let mut agent = s.agent();
    {
        let mut stream = agent.stream("go");
        while let Some(event) = stream.next().await {
            if matches!(event, Event::Code { .. }) {
                break;
            }
        }
        // Poll once more so the execution is in flight, then drop.
        let _ = tokio::time::timeout(Duration::from_millis(10), stream.next()).await;
    }
    assert_eq!(s.runtime.interrupts(), 1);
    let history = turns(&agent);
    assert_eq!(
        history[history.len() - 2..],
        [
            (
                "execution_result".to_owned(),
                prompt::EXECUTION_INCOMPLETE.to_owned()
            ),
            ("user".to_owned(), prompt::USER_INTERRUPTION.to_owned()),
        ]
    );
    assert!(agent.run("again").await.completed());
}

#[tokio::test]
async fn dropping_mid_answer_closes_the_model_stream() {
    let s = Setup::new([Reply::text("a long answer that streams in pieces")
        .chunk_size(1)
        .then_hang()]);
    let mut agent = s.agent();
    {
        let mut stream = agent.stream("go");
        for _ in 0..3 {
            stream.next().await;
        }
        assert_eq!(s.model.open_streams(), 1);
    }
    assert_eq!(s.model.open_streams(), 0);
    assert_eq!(turns(&agent).last().unwrap().1, prompt::USER_INTERRUPTION);
}

#[tokio::test]
async fn asynchronous_filtering_reads_to_the_end_before_running() {
    let deferred = || ModelInfo::new("azure").with_filters_asynchronously(true);
    let s = Setup::with(
        ScriptedModel::new([
            Reply::text(format!("{}\ntail", block("print('1')"))),
            Reply::text("ok"),
        ])
        .with_info(deferred()),
        FakeRuntime::new(),
    );
    let response = s.agent().run("go").await;
    assert!(response.completed());
    assert_eq!(s.runtime.executed(), ["print('1')"]);

    for reply in [
        Reply::text(block("print('1')")).finish(FinishReason::ContentFilter),
        Reply::text(block("print('1')")).no_finish(),
        Reply::text(block("print('1')"))
            .no_finish()
            .then_error(ModelError::new(ModelErrorKind::Other, "reset")),
    ] {
        let s = Setup::with(
            ScriptedModel::new([reply.clone()]).with_info(deferred()),
            FakeRuntime::new(),
        );
        let mut agent = s.agent();
        let response = agent.run("go").await;
        assert_eq!(response.stop_reason, StopReason::ModelError, "{reply:?}");
        assert!(s.runtime.executed().is_empty(), "{reply:?}");
        assert_eq!(
            turns(&agent).len(),
            1,
            "withdrawn text is not kept: {reply:?}"
        );
    }
}

#[tokio::test]
async fn the_system_prompt_is_rebuilt_and_the_date_travels_separately() {
    let s = Setup::new([Reply::text("one"), Reply::text("two")]);
    let mut agent = s.agent();
    agent.run("first").await;
    s.runtime
        .register(
            cave_core::Resources::new().variable(cave_core::Variable::new("late", Value::Int(1))),
        )
        .await
        .unwrap();
    agent.run("second").await;
    let requests = s.model.requests();
    let system = |i: usize| requests[i].messages[0].content.clone();
    assert!(!system(0).contains("- name: late") && system(1).contains("- name: late"));
    for request in &requests {
        assert!(
            request.messages[1]
                .content
                .starts_with("<system-reminder>\nThe current date and time is ")
        );
    }
    // Stored history has one system prompt and no reminder; user turns accumulate.
    let history = agent.history();
    assert_eq!(
        history
            .iter()
            .filter(|m| matches!(m, Message::System { .. }))
            .count(),
        1
    );
    assert!(
        history
            .iter()
            .all(|m| !m.content().contains("<system-reminder>"))
    );
    assert_eq!(turns(&agent).iter().filter(|(k, _)| k == "user").count(), 2);
    assert_eq!(requests[1].messages.len(), 1 + 1 + 3);
}

#[tokio::test]
async fn the_system_prompt_has_its_sections_and_the_block_tag() {
    let s = Setup::new([]);
    let prompt = s
        .builder()
        .python_block_identifier("py3")
        .build()
        .unwrap()
        .system_prompt();
    for section in [
        "<functions>\nNo functions available\n</functions>",
        "<variables>",
        "<types>",
        "<skills>\nNo skills available\n</skills>",
    ] {
        assert!(prompt.contains(section), "{section}");
    }
    assert!(prompt.starts_with(prompt::DEFAULT_INSTRUCTIONS));
    assert!(
        prompt.contains("```py3\ntotal = add(5, 3)")
            && !prompt.contains("{python_block_identifier}")
    );
    let custom = s
        .builder()
        .prompt_template("{instructions}|{current_time}|{{literal}}")
        .build()
        .unwrap()
        .system_prompt();
    assert!(custom.ends_with("|{literal}") && !custom.contains("{current_time}"));
}

#[tokio::test]
async fn settings_are_checked_when_building() {
    let s = Setup::new([]);
    let err = s
        .builder()
        .persisted_output_prefix("bad-name")
        .build()
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("it would name the variable 'bad-name_1'"),
        "{err}"
    );
    assert!(s.builder().persisted_output_prefix("输出").build().is_ok());
    let err = s
        .builder()
        .prompt_template("{instructions} {nope}")
        .build()
        .unwrap_err();
    assert!(
        err.to_string().contains("unknown placeholder {nope}"),
        "{err}"
    );
    let err = s
        .builder()
        .system_instructions("use {braces}")
        .build()
        .unwrap_err();
    assert!(matches!(
        err,
        BuildError::Template {
            which: "system_instructions",
            ..
        }
    ));
    assert!(s.builder().python_block_identifier("").build().is_err());
}

#[tokio::test]
async fn events_serialize_to_the_wire_format() {
    let usage = Usage::new(3, 4);
    let cases = [
        (
            Event::UserPrompt {
                content: "hi".into(),
                format_version: cave_core::EVENT_FORMAT_VERSION,
            },
            r#"{"type":"user_prompt","content":"hi","format_version":1}"#,
        ),
        (
            Event::ThinkingChunk {
                content: "h".into(),
            },
            r#"{"type":"thinking_chunk","content":"h"}"#,
        ),
        (
            Event::Thinking {
                content: "h".into(),
                duration_ms: 5,
            },
            r#"{"type":"thinking","content":"h","duration_ms":5}"#,
        ),
        (
            Event::Code {
                code: "x".into(),
                unclosed: false,
                tool_call: None,
            },
            r#"{"type":"code","code":"x"}"#,
        ),
        (
            Event::ExecutionOutput { chunk: "o".into() },
            r#"{"type":"execution_output","chunk":"o"}"#,
        ),
        (
            Event::ExecutionResult {
                output: "o".into(),
                success: true,
                persisted: true,
                persisted_variable: Some("_output_1".into()),
                state_lost: false,
            },
            r#"{"type":"execution_result","output":"o","success":true,"persisted":true,"persisted_variable":"_output_1","state_lost":false}"#,
        ),
        (
            Event::ExecutionTimeout {
                timeout: 1.5,
                state_lost: true,
            },
            r#"{"type":"execution_timeout","timeout":1.5,"state_lost":true}"#,
        ),
        (
            Event::SecurityError {
                message: "m".into(),
                violations: Vec::new(),
            },
            r#"{"type":"security_error","message":"m"}"#,
        ),
        (
            Event::SecurityError {
                message: "m".into(),
                violations: vec![Violation::new("no os").at_line(2)],
            },
            r#"{"type":"security_error","message":"m","violations":[{"message":"no os","line":2,"kind":"other"}]}"#,
        ),
        (
            Event::Status(Status::OutputRecovery {
                recovery: 1,
                max_recoveries: 3,
            }),
            r#"{"type":"status","status":"output_recovery","recovery":1,"max_recoveries":3}"#,
        ),
        (
            Event::Status(Status::Compacted {
                before: 40,
                after: 12,
            }),
            r#"{"type":"status","status":"compacted","before":40,"after":12}"#,
        ),
        (
            Event::Status(Status::Compacting),
            r#"{"type":"status","status":"compacting"}"#,
        ),
        (
            Event::Backoff {
                delay: 0.5,
                reason: None,
            },
            r#"{"type":"backoff","delay":0.5}"#,
        ),
        (
            Event::FinalResponse {
                content: "a".into(),
            },
            r#"{"type":"final_response","content":"a"}"#,
        ),
        (
            Event::Stopped {
                content: "a".into(),
                stop_reason: StopReason::BudgetExhausted,
                steps: 2,
                elapsed: 0.5,
                usage,
                error: None,
                ledger: Default::default(),
            },
            r#"{"type":"stopped","content":"a","stop_reason":"budget_exhausted","steps":2,"elapsed":0.5,"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7,"estimated":false,"cached_tokens":0,"reasoning_tokens":0},"ledger":{"tokens":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0,"estimated":false,"cached_tokens":0,"reasoning_tokens":0},"model_calls":0,"model_seconds":0.0,"cost":{"usd":0.0,"reported":0.0,"computed":0.0,"unpriced_calls":0},"cells":0,"cell_seconds":0.0,"cpu_seconds":null,"peak_memory":null,"host_calls":{},"mcp_calls":{},"refused_host_calls":0,"egress":{"connections":0,"refused":0,"sent":0,"received":0}}}"#,
        ),
        (
            Event::Stopped {
                content: String::new(),
                stop_reason: StopReason::ModelError,
                steps: 1,
                elapsed: 0.5,
                usage,
                error: Some(StopError::new(StopErrorKind::BillingExhausted, "no credit")),
                ledger: Default::default(),
            },
            r#"{"type":"stopped","content":"","stop_reason":"model_error","steps":1,"elapsed":0.5,"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7,"estimated":false,"cached_tokens":0,"reasoning_tokens":0},"error":{"kind":"billing_exhausted","message":"no credit"},"ledger":{"tokens":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0,"estimated":false,"cached_tokens":0,"reasoning_tokens":0},"model_calls":0,"model_seconds":0.0,"cost":{"usd":0.0,"reported":0.0,"computed":0.0,"unpriced_calls":0},"cells":0,"cell_seconds":0.0,"cpu_seconds":null,"peak_memory":null,"host_calls":{},"mcp_calls":{},"refused_host_calls":0,"egress":{"connections":0,"refused":0,"sent":0,"received":0}}}"#,
        ),
    ];
    for (event, json) in cases {
        assert_eq!(serde_json::to_string(&event).unwrap(), json);
        assert_eq!(serde_json::from_str::<Event>(json).unwrap(), event);
    }
    // A stream written before the ledger (no `ledger`, no token kinds) still reads.
    let old = r#"{"type":"stopped","content":"a","stop_reason":"budget_exhausted","steps":2,"elapsed":0.5,"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7,"estimated":false}}"#;
    let Event::Stopped {
        ledger,
        usage: read,
        ..
    } = serde_json::from_str::<Event>(old).unwrap()
    else {
        panic!("not a stopped event");
    };
    assert_eq!((*ledger, read), (cave_core::Ledger::new(), usage));
    let history = vec![
        Message::user("q"),
        Message::code("c"),
        Message::Summary {
            content: "w".into(),
            body: "b".into(),
        },
    ];
    let json = serde_json::to_string(&history).unwrap();
    assert_eq!(
        json,
        r#"[{"type":"user","content":"q"},{"type":"code","content":"c"},{"type":"summary","content":"w","body":"b"}]"#
    );
    assert_eq!(
        serde_json::from_str::<Vec<Message>>(&json).unwrap(),
        history
    );
}

#[test]
fn a_persisted_result_carries_its_pointer_as_data() {
    let message = Message::persisted_result(
        "marker text",
        cave_core::PersistedOutput::new("_output", 3, 9000),
    );
    let json = serde_json::to_string(&message).unwrap();
    assert_eq!(
        json,
        r#"{"type":"execution_result","content":"marker text","persisted":{"variable":"_output_3","index":3,"chars":9000}}"#
    );
    assert_eq!(serde_json::from_str::<Message>(&json).unwrap(), message);
    // The index comes from the data, whatever the text says.
    assert_eq!(cave_core::highest_persisted_index(&[message], "_output"), 3);
    let plain = r#"{"type":"execution_result","content":"x"}"#;
    assert_eq!(
        serde_json::from_str::<Message>(plain).unwrap(),
        Message::execution_result("x")
    );
}

#[test]
fn saved_histories_carry_their_format_version() {
    use cave_core::{HISTORY_FORMAT_VERSION, HistoryError, SavedHistory};
    let saved = SavedHistory::new(vec![Message::user("q"), Message::assistant("a")]);
    let json = saved.to_json();
    assert!(json.starts_with(&format!(
        r#"{{"format_version":{HISTORY_FORMAT_VERSION},"messages":[{{"type":"user""#
    )));
    assert_eq!(SavedHistory::from_json(&json).unwrap(), saved);
    let newer = json.replacen(
        &format!(r#""format_version":{HISTORY_FORMAT_VERSION}"#),
        r#""format_version":99"#,
        1,
    );
    assert!(matches!(
        SavedHistory::from_json(&newer),
        Err(HistoryError::Newer { found: 99 })
    ));
    assert!(matches!(
        SavedHistory::from_json("[1, 2]"),
        Err(HistoryError::Invalid(_))
    ));
}

/// A server that dies mid-answer: the run ends in an error, and its content is what streamed.
#[tokio::test]
async fn a_run_that_fails_after_text_keeps_the_partial_answer() {
    let broken = ModelError::new(ModelErrorKind::StreamInterrupted, "connection reset");
    let gone = ModelError::new(ModelErrorKind::Auth, "HTTP 401: the server went away");
    let s = Setup::new([
        Reply::text("The first half of the answer").then_error(broken),
        Reply::fails(gone),
    ]);
    let response = s.agent().run("go").await;
    assert_eq!(response.stop_reason, StopReason::ModelError);
    assert_eq!(response.content, "The first half of the answer");
}

/// A cell's whole output, kept in a file, is what `_output_N` holds; when the runtime cannot
/// take it, the variable holds the ends the result shows, and its declaration says so (the
/// result's own note says the whole is kept).
#[tokio::test]
async fn a_whole_output_the_runtime_cannot_take_is_declared_as_its_ends() {
    let dir = cave_testing::TestDir::new("spool");
    let whole: String = (0..4_000).map(|i| format!("line {i}\n")).collect();
    let spooled_output = || {
        let mut cell = cave_cell::CellOutput::new(1_000, None)
            .with_spool(cave_cell::OutputSpool::new(dir.path(), 1 << 20));
        cell.push(&whole);
        let (text, spooled) = cell.finish();
        (
            text,
            spooled.expect("past the cap, the whole output is in the file"),
        )
    };
    for fail in [false, true] {
        let runtime = FakeRuntime {
            fail_bind_spooled: fail,
            ..FakeRuntime::new()
        };
        let (text, spooled) = spooled_output();
        let persisted =
            cave_core::persist_output(&runtime, "_output", &text, Some(&spooled), 1, 200)
                .await
                .expect("bound");
        let bound = runtime.value(&persisted.variable).await;
        let says_ends_only = persisted
            .marker
            .contains("It holds only the beginning and the end");
        if fail {
            assert_eq!(bound, Some(Value::Str(text.clone())));
            assert!(says_ends_only, "{}", persisted.marker);
            assert!(persisted.marker.contains("larger than a frame"));
        } else {
            assert_eq!(bound, Some(Value::Str(whole.clone())));
            assert!(!says_ends_only, "{}", persisted.marker);
            assert_eq!(persisted.chars, whole.chars().count());
        }
    }
}

/// `print!("{event}")` over a run is a transcript: the prompt, the cell and its output once,
/// the answer, and a closing line; a refusal and a sub-agent's answer say what they are.
#[tokio::test]
async fn events_print_as_a_transcript() {
    let s = Setup::new([
        Reply::text(format!("Let me count.\n{}", block("print('counted')"))),
        Reply::text("There are 3."),
    ]);
    let mut agent = s.agent();
    let run = events(&mut agent, "How many?").await;
    let transcript: String = run.iter().map(ToString::to_string).collect();
    let (output, _, _) = result_of(&run);
    assert!(transcript.starts_with("> How many?\n"), "{transcript}");
    assert!(
        transcript.contains("```python\nprint('counted')\n```\n"),
        "{transcript}"
    );
    assert!(
        transcript.contains(&format!("```\n{output}[ran]\n")),
        "the output once, after the code: {transcript}"
    );
    assert!(transcript.contains("There are 3.\n"), "{transcript}");
    assert!(
        transcript.contains("\n[completed after 2 steps, "),
        "{transcript}"
    );
    let refused = Event::ExecutionRefused {
        reason: Some("not now".to_owned()),
    };
    assert_eq!(refused.to_string(), "[refused by the host: not now]\n");
    let nested = Event::SubAgent {
        agent: "cleaner".to_owned(),
        event: Box::new(Event::FinalResponse {
            content: "Done.\nAll clean.".to_owned(),
        }),
    };
    assert_eq!(
        nested.to_string(),
        "  cleaner | Done.\n  cleaner | All clean.\n"
    );
    let mut reached = cave_core::Connection::new("pypi.org", 443, true);
    reached.sent = 512;
    reached.received = 4096;
    let mut refused = cave_core::Connection::new("evil.test", 443, false);
    refused.reason = Some("not in the allowlist".to_owned());
    let egress = Event::Egress(cave_core::Connections::new(vec![reached, refused], 2));
    assert_eq!(
        egress.to_string(),
        "[network: pypi.org:443, 512 B sent, 4 KiB received]\n[network: evil.test:443 refused: not in the allowlist]\n[network: 2 more connections]\n"
    );
}

/// The connections a cell made through the runtime's egress proxy add up in the ledger: those
/// let through and refused, the bytes both ways, and those past a cell's account counted.
#[tokio::test]
async fn the_ledger_adds_up_the_cells_connections() {
    let model = ScriptedModel::new([
        Reply::text(block("connect()")),
        Reply::text(block("connect()")),
        Reply::text("Done."),
    ]);
    let mut agent = AgentBuilder::new(model, FakeRuntime::new())
        .build()
        .unwrap();
    let response = agent.run("Fetch.").await;
    assert!(response.completed(), "{response:?}");
    let egress = response.ledger.egress;
    assert_eq!(
        (
            egress.connections,
            egress.refused,
            egress.sent,
            egress.received
        ),
        (2 + 6, 2, 2 * 517, 2 * 4096)
    );
    assert_eq!(response.ledger.cells, 2);
    // A runtime that measures nothing: no processor time, no memory, rather than zeros.
    assert_eq!(
        (response.ledger.cpu_seconds, response.ledger.peak_memory),
        (None, None)
    );
}
