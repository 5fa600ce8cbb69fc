//! The adapters against a real HTTP server on 127.0.0.1 that injects faults.

use crate::support::{
    Part, Reply, TestServer, answer, finish, finish_with_usage, reasoning, status, status_with,
    text, usage,
};
use cave_core::{
    Agent, AgentBuilder, ChatMessage, ChatRequest, ChatRole, Delta, Event, FinishReason, Message,
    Model, ModelError, ModelErrorKind, StopReason, Usage, prompt,
};
use cave_models::{
    ApiKey, LiteLlmModel, ModelConfig, OpenAiModel, RecordingModel, ReplayModel, RetryPolicy,
};
use cave_testing::EchoRuntime;
use futures_util::StreamExt;
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const KEY: &str = "sk-test-0123456789abcdef";

/// Fast retries, so tests that retry take milliseconds.
fn quick() -> RetryPolicy {
    RetryPolicy {
        max_retries: 3,
        base_delay: Duration::from_millis(10),
        max_delay: Duration::from_secs(32),
    }
}

fn config(server: &TestServer) -> ModelConfig {
    ModelConfig::new("test-model")
        .base_url(server.base_url())
        .api_key(ApiKey::new(KEY))
        .retry(quick())
}

fn request() -> ChatRequest {
    ChatRequest::new(vec![ChatMessage::new(ChatRole::User, "hi")])
}

/// Everything a model streams for one request: deltas until the end, or the error.
async fn collect(model: &dyn Model) -> (Vec<Delta>, Option<ModelError>) {
    let mut stream = match model.stream(request()).await {
        Ok(stream) => stream,
        Err(e) => return (vec![], Some(e)),
    };
    let mut deltas = Vec::new();
    while let Some(item) = stream.next().await {
        match item {
            Ok(delta) => deltas.push(delta),
            Err(e) => return (deltas, Some(e)),
        }
    }
    (deltas, None)
}

fn text_of(deltas: &[Delta]) -> String {
    deltas.iter().map(|d| d.text.as_str()).collect()
}

#[tokio::test]
async fn streams_an_answer_with_usage_and_sends_what_it_should() {
    let server = TestServer::start([Reply::Sse(vec![
        text("Hel"),
        text("lo"),
        finish("stop"),
        usage(12, 3),
        Part::Done,
    ])])
    .await;
    let model = OpenAiModel::new(
        config(&server)
            .max_output_tokens(256)
            .param("temperature", json!(0.2)),
    )
    .unwrap();
    let (deltas, error) = collect(&model).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(text_of(&deltas), "Hello");
    assert_eq!(
        deltas.iter().find_map(|d| d.finish_reason.clone()),
        Some(FinishReason::Stop)
    );
    assert_eq!(deltas.iter().find_map(|d| d.usage), Some(Usage::new(12, 3)));
    let sent = &server.received()[0];
    assert_eq!(sent.path, "/v1/chat/completions");
    assert_eq!(
        sent.header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert_eq!(sent.body["model"], "test-model");
    assert_eq!(sent.body["stream"], true);
    assert_eq!(sent.body["stream_options"], json!({"include_usage": true}));
    assert_eq!(sent.body["max_tokens"], 256);
    assert_eq!(sent.body["temperature"], 0.2);
    assert_eq!(
        sent.body["messages"],
        json!([{"role": "user", "content": "hi"}])
    );
    assert_eq!(model.info().max_output_tokens, Some(256));
}

#[tokio::test]
async fn consecutive_requests_share_one_connection() {
    let done = || Reply::Sse(vec![text("Hi"), finish("stop"), Part::Done]);
    // The stream's end comes a while after `[DONE]`: read in the background.
    let late_end = Reply::Sse(vec![
        text("Hi"),
        finish("stop"),
        Part::Done,
        Part::Pause(Duration::from_millis(50)),
    ]);
    let server = TestServer::start([done(), late_end, done(), done()]).await;
    let model = OpenAiModel::new(config(&server)).unwrap();
    for request in 0..4 {
        let (deltas, error) = collect(&model).await;
        assert!(error.is_none(), "request {request}: {error:?}");
        assert_eq!(text_of(&deltas), "Hi");
        if request == 1 {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    // Without reading past `[DONE]`, the connections were not kept (3 when last checked).
    assert_eq!(server.connections(), 1);
}

#[tokio::test]
async fn reasoning_arrives_under_either_field_name() {
    for field in ["reasoning_content", "reasoning"] {
        let server = TestServer::start([Reply::Sse(vec![
            reasoning(field, "think"),
            text("ok"),
            finish_with_usage("stop", 1, 2),
            Part::Done,
        ])])
        .await;
        let (deltas, _) = collect(&OpenAiModel::new(config(&server)).unwrap()).await;
        assert_eq!(
            deltas
                .iter()
                .map(|d| d.reasoning.as_str())
                .collect::<String>(),
            "think",
            "{field}"
        );
        assert_eq!(
            deltas.iter().find_map(|d| d.usage),
            Some(Usage::new(1, 2)),
            "usage and finish in one chunk"
        );
    }
}

#[tokio::test]
async fn transient_failures_are_retried_with_announced_backoff() {
    let server = TestServer::start([
        status_with(
            429,
            &[("retry-after", "0.05")],
            json!({"error": {"message": "slow down", "code": "rate_limit"}}),
        ),
        status(500, "boom"),
        answer("fine", 2, "stop"),
    ])
    .await;
    let (deltas, error) = collect(&OpenAiModel::new(config(&server)).unwrap()).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(text_of(&deltas), "fine");
    let backoffs: Vec<Duration> = deltas.iter().filter_map(|d| d.backoff).collect();
    assert_eq!(backoffs.len(), 2);
    // Each retry says why: the status and the provider's message.
    let reasons: Vec<&str> = deltas
        .iter()
        .filter_map(|d| d.backoff_reason.as_deref())
        .collect();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(
        reasons[0].contains("429") && reasons[0].contains("slow down"),
        "{reasons:?}"
    );
    assert!(
        reasons[1].contains("500") && reasons[1].contains("boom"),
        "{reasons:?}"
    );
    assert_eq!(
        backoffs[0],
        Duration::from_millis(50),
        "Retry-After is honoured"
    );
    assert!(
        backoffs[1] >= Duration::from_millis(20) && backoffs[1] <= Duration::from_millis(25),
        "base·2 + ≤25% jitter: {:?}",
        backoffs[1]
    );
    assert_eq!(server.received().len(), 3);
}

#[tokio::test]
async fn what_money_or_a_shorter_prompt_fixes_is_never_retried() {
    let cases = [
        (
            status(402, "Payment required"),
            ModelErrorKind::BillingExhausted,
        ),
        (
            status(
                429,
                "You exceeded your current quota, please check your plan",
            ),
            ModelErrorKind::BillingExhausted,
        ),
        (status(413, "too large"), ModelErrorKind::PromptTooLong),
        (
            status(400, "This model's maximum context length is 8192 tokens"),
            ModelErrorKind::PromptTooLong,
        ),
        (
            status_with(
                400,
                &[],
                json!({"error": {"message": "bad", "code": "context_length_exceeded"}}),
            ),
            ModelErrorKind::PromptTooLong,
        ),
        (
            status(400, "max_tokens must be positive"),
            ModelErrorKind::InvalidRequest,
        ),
        (status(401, "bad key"), ModelErrorKind::Auth),
        (status(403, "forbidden"), ModelErrorKind::Auth),
    ];
    for (reply, kind) in cases {
        let server = TestServer::start([reply.clone(), answer("never", 5, "stop")]).await;
        let (_, error) = collect(&OpenAiModel::new(config(&server)).unwrap()).await;
        let error = error.expect("an error");
        assert_eq!(error.kind(), &kind, "{reply:?}: {error}");
        assert_eq!(server.received().len(), 1, "not retried: {reply:?}");
    }
}

#[tokio::test]
async fn a_key_echoed_back_is_redacted() {
    let body = json!({"error": {"message": format!("Incorrect API key provided: {KEY}. Also sk-proj-****wxyz is invalid."), "code": "invalid_api_key"}});
    let server = TestServer::start([status_with(401, &[], body)]).await;
    let model = OpenAiModel::new(config(&server)).unwrap();
    let (_, error) = collect(&model).await;
    let text = format!("{} {:?}", error.as_ref().unwrap(), error);
    assert!(
        !text.contains(KEY) && !text.contains("0123456789abcdef") && !text.contains("wxyz"),
        "{text}"
    );
    assert!(
        text.contains(
            "Incorrect API key provided: [redacted: API key]. Also sk-[redacted] is invalid."
        ),
        "{text}"
    );
    assert!(!format!("{model:?}").contains(KEY));
}

#[tokio::test]
async fn a_stream_that_breaks_before_content_reconnects() {
    let server = TestServer::start([
        Reply::Sse(vec![Part::Drop]),
        answer("second try", 4, "stop"),
    ])
    .await;
    let (deltas, error) = collect(&OpenAiModel::new(config(&server)).unwrap()).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(text_of(&deltas), "second try");
    assert_eq!(server.received().len(), 2);
}

#[tokio::test]
async fn a_stream_that_breaks_after_content_is_reported_not_retried() {
    let server = TestServer::start([
        Reply::Sse(vec![text("half"), Part::Drop]),
        answer("never", 4, "stop"),
    ])
    .await;
    let (deltas, error) = collect(&OpenAiModel::new(config(&server)).unwrap()).await;
    assert_eq!(text_of(&deltas), "half");
    assert_eq!(error.unwrap().kind(), &ModelErrorKind::StreamInterrupted);
    assert_eq!(server.received().len(), 1);
}

#[tokio::test]
async fn a_break_after_the_finish_reason_just_ends_the_stream() {
    let server =
        TestServer::start([Reply::Sse(vec![text("done"), finish("stop"), Part::Drop])]).await;
    let (deltas, error) = collect(&OpenAiModel::new(config(&server)).unwrap()).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(text_of(&deltas), "done");
}

#[tokio::test]
async fn litellm_asks_for_usage_and_reads_its_errors() {
    let litellm_429 = json!({"error": {"message": "litellm.RateLimitError: AnthropicException - rate limited", "type": null, "param": null, "code": "429"}});
    let server = TestServer::start([
        status_with(429, &[], litellm_429),
        answer("routed", 3, "stop"),
    ])
    .await;
    let model = LiteLlmModel::new(
        ModelConfig::new("anthropic/claude-sonnet")
            .base_url(server.base_url())
            .retry(quick()),
    )
    .unwrap();
    let (deltas, error) = collect(&model).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(text_of(&deltas), "routed");
    let sent = server.received();
    assert_eq!(sent[1].body["model"], "anthropic/claude-sonnet");
    assert_eq!(
        sent[1].body["stream_options"],
        json!({"include_usage": true})
    );
    assert!(
        sent[1].header("authorization").is_none(),
        "no key configured, none sent"
    );
    let server = TestServer::start([Reply::Sse(vec![Part::Data(json!({"error": {"message": "litellm.BudgetExceededError: budget exceeded", "code": "400"}}))])]).await;
    let model = LiteLlmModel::new(ModelConfig::new("m").base_url(server.base_url())).unwrap();
    let (_, error) = collect(&model).await;
    assert_eq!(error.unwrap().kind(), &ModelErrorKind::InvalidRequest);
}

/// A server that refuses `stream_options` is asked again without, once, and never again.
#[tokio::test]
async fn a_server_that_refuses_stream_options_is_asked_without() {
    let refusal = json!({"error": {"message": "litellm.BadRequestError: Unrecognized request argument supplied: stream_options", "code": "400"}});
    let server = TestServer::start([
        status_with(400, &[], refusal),
        answer("first", 3, "stop"),
        answer("second", 3, "stop"),
    ])
    .await;
    let model = LiteLlmModel::new(ModelConfig::new("m").base_url(server.base_url())).unwrap();
    let (deltas, error) = collect(&model).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(text_of(&deltas), "first");
    let (deltas, _) = collect(&model).await;
    assert_eq!(text_of(&deltas), "second");
    let sent = server.received();
    assert_eq!(sent.len(), 3);
    assert!(sent[0].body.get("stream_options").is_some());
    assert!(sent[1].body.get("stream_options").is_none());
    assert!(sent[2].body.get("stream_options").is_none(), "remembered");
}

fn block(code: &str) -> String {
    format!("```python\n{code}\n```")
}

async fn run_agent(model: impl Model + 'static, idle: Option<Duration>) -> (Agent, Vec<Event>) {
    let mut agent = AgentBuilder::new(model, EchoRuntime::new())
        .stream_idle_timeout(idle)
        .max_steps(5)
        .build()
        .unwrap();
    let events: Vec<Event> = agent.stream("go").collect().await;
    (agent, events)
}

fn stopped(events: &[Event]) -> (StopReason, u32, Usage) {
    match events.last() {
        Some(Event::Stopped {
            stop_reason,
            steps,
            usage,
            ..
        }) => (*stop_reason, *steps, *usage),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn at_agent_level_steps_keep_the_connection_unless_the_model_talks_on() {
    // The agent stops reading at each block's end; the answer's finish, usage and end follow
    // at once, so the connection is kept for the next step.
    let step = || {
        let mut parts = vec![text(&block("x = 1"))];
        parts.extend([finish("stop"), usage(10, 5), Part::Done]);
        Reply::Sse(parts)
    };
    let server = TestServer::start([step(), step(), step(), answer("Done.", 4, "stop")]).await;
    let (_, events) = run_agent(OpenAiModel::new(config(&server)).unwrap(), None).await;
    assert_eq!(stopped(&events).0, StopReason::Completed);
    assert_eq!(server.received().len(), 4);
    assert_eq!(server.connections(), 1, "every step on one connection");

    // A model that goes on after its block (here: forever) loses its connection, which is
    // how a server learns to stop generating.
    let server = TestServer::start([
        Reply::Sse(vec![text(&block("x = 1")), text(" and"), Part::Hang]),
        answer("Done.", 4, "stop"),
    ])
    .await;
    let (_, events) = run_agent(OpenAiModel::new(config(&server)).unwrap(), None).await;
    assert_eq!(stopped(&events).0, StopReason::Completed);
    assert_eq!(server.connections(), 2);
}

#[tokio::test]
async fn at_agent_level_a_retried_run_completes_and_billing_ends_it() {
    let server =
        TestServer::start([status(503, "overloaded"), answer("All good.", 4, "stop")]).await;
    let (_, events) = run_agent(
        OpenAiModel::new(config(&server)).unwrap(),
        Some(Duration::from_secs(5)),
    )
    .await;
    assert_eq!(stopped(&events).0, StopReason::Completed);
    assert_eq!(server.received().len(), 2);

    let server = TestServer::start([
        status(402, "insufficient credits"),
        answer("never", 4, "stop"),
    ])
    .await;
    let (_, events) = run_agent(
        OpenAiModel::new(config(&server)).unwrap(),
        Some(Duration::from_secs(5)),
    )
    .await;
    assert_eq!(stopped(&events).0, StopReason::ModelError);
    assert_eq!(server.received().len(), 1, "one request, no retry");
}

#[tokio::test]
async fn at_agent_level_stalls_truncation_and_filters_behave_as_documented() {
    let idle = Some(Duration::from_millis(300));
    // Stalled before content: the run ends.
    let server = TestServer::start([Reply::Sse(vec![Part::Hang])]).await;
    let (_, events) = run_agent(OpenAiModel::new(config(&server)).unwrap(), idle).await;
    assert_eq!(stopped(&events).0, StopReason::ModelError);
    // Stalled after content: the partial answer is kept and resumed.
    let server = TestServer::start([
        Reply::Sse(vec![text("Half"), Part::Hang]),
        answer(" done.", 3, "stop"),
    ])
    .await;
    let (agent, events) = run_agent(OpenAiModel::new(config(&server)).unwrap(), idle).await;
    assert_eq!(stopped(&events).0, StopReason::Completed);
    assert!(
        agent
            .history()
            .contains(&Message::user(prompt::STREAM_INTERRUPTED_PROMPT))
    );
    // Dropped mid-answer: the same.
    let server = TestServer::start([
        Reply::Sse(vec![text("Hal"), Part::Drop]),
        answer("f.", 3, "stop"),
    ])
    .await;
    let (_, events) = run_agent(OpenAiModel::new(config(&server)).unwrap(), idle).await;
    assert_eq!(stopped(&events).0, StopReason::Completed);
    // Cut by the output cap: resumed with the recovery prompt.
    let server = TestServer::start([
        answer("The answer", 4, "length"),
        answer(" is 42.", 4, "stop"),
    ])
    .await;
    let (agent, events) = run_agent(OpenAiModel::new(config(&server)).unwrap(), idle).await;
    assert!(events.contains(&Event::FinalResponse {
        content: "The answer is 42.".into()
    }));
    assert!(
        agent
            .history()
            .contains(&Message::user(prompt::OUTPUT_RECOVERY_PROMPT))
    );
    // Filtered after streaming part of it: nothing runs, the run ends.
    let server = TestServer::start([answer(&block("print(1)"), 5, "content_filter")]).await;
    let model = OpenAiModel::new(config(&server).filters_asynchronously(true)).unwrap();
    let (agent, events) = run_agent(model, idle).await;
    assert_eq!(stopped(&events).0, StopReason::ModelError);
    assert!(!events.iter().any(|e| matches!(e, Event::Code { .. })));
    assert_eq!(agent.history().len(), 2, "withdrawn text is not kept");
}

#[tokio::test]
async fn at_agent_level_usage_is_reported_or_estimated() {
    let idle = Some(Duration::from_secs(5));
    for (parts, reported) in [
        (
            vec![text("Hi."), finish("stop"), usage(100, 5), Part::Done],
            true,
        ),
        (
            vec![text("Hi."), finish_with_usage("stop", 100, 5), Part::Done],
            true,
        ),
        (vec![text("Hi."), finish("stop"), Part::Done], false),
    ] {
        let server = TestServer::start([Reply::Sse(parts)]).await;
        let (_, events) = run_agent(OpenAiModel::new(config(&server)).unwrap(), idle).await;
        let (reason, _, usage) = stopped(&events);
        assert_eq!(reason, StopReason::Completed);
        if reported {
            assert_eq!(usage, Usage::new(100, 5));
        } else {
            assert!(
                usage.prompt_tokens > 100 && usage.completion_tokens == 1,
                "estimated: {usage:?}"
            );
        }
    }
}

#[tokio::test]
async fn a_recorded_run_replays_to_the_same_events() {
    let dir = std::env::temp_dir().join(format!("cave-cassette-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cassette = dir.join("run.jsonl");
    let server = TestServer::start([
        status(500, "blip"),
        Reply::Sse(vec![
            reasoning("reasoning_content", "plan"),
            text("Let me run it.\n```python\nx = 1\n"),
            text("print(x)\n```"),
            finish("stop"),
            usage(50, 9),
            Part::Done,
        ]),
        answer("x is 1.", 3, "stop"),
    ])
    .await;
    let recording =
        RecordingModel::create(OpenAiModel::new(config(&server)).unwrap(), &cassette).unwrap();
    let (_, recorded) = run_agent(recording, Some(Duration::from_secs(5))).await;
    assert_eq!(stopped(&recorded).0, StopReason::Completed);
    let text = std::fs::read_to_string(&cassette).unwrap();
    assert!(!text.contains(KEY), "the key never reaches a cassette");

    let (_, replayed) = run_agent(
        ReplayModel::open(&cassette).unwrap(),
        Some(Duration::from_secs(5)),
    )
    .await;
    let strip = |events: &[Event]| -> Vec<Event> {
        events
            .iter()
            .map(|e| match e {
                Event::Stopped {
                    content,
                    stop_reason,
                    steps,
                    usage,
                    error,
                    ..
                } => Event::Stopped {
                    content: content.clone(),
                    stop_reason: *stop_reason,
                    steps: *steps,
                    elapsed: 0.0,
                    usage: *usage,
                    error: error.clone(),
                    // Timings differ between the runs.
                    ledger: Default::default(),
                },
                Event::Backoff { .. } => Event::Backoff {
                    delay: 0.0,
                    reason: None,
                },
                Event::Thinking { content, .. } => Event::Thinking {
                    content: content.clone(),
                    duration_ms: 0,
                },
                Event::Step {
                    step,
                    usage,
                    execution_seconds,
                    ..
                } => Event::Step {
                    step: *step,
                    usage: *usage,
                    model_seconds: 0.0,
                    execution_seconds: execution_seconds.map(|_| 0.0),
                },
                other => other.clone(),
            })
            .collect()
    };
    assert_eq!(strip(&replayed), strip(&recorded));

    // A conversation that goes elsewhere fails loudly.
    let mut agent = AgentBuilder::new(ReplayModel::open(&cassette).unwrap(), EchoRuntime::new())
        .build()
        .unwrap();
    let response = agent.run("something else").await;
    assert_eq!(response.stop_reason, StopReason::ModelError);
    assert!(
        response
            .error
            .unwrap()
            .message
            .contains("replay diverged at call 1: message"),
        "says where"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// A cassette recorded where the code printed something else (another Python words its
/// errors differently) still plays: an execution result is matched by its place and kind,
/// and its difference is reported, naming the line where it starts. Cassettes written
/// before messages carried their kind play the same way. Any other message that differs
/// still stops the replay, saying which message and where.
#[tokio::test]
async fn a_replay_matches_execution_results_by_place_and_reports_their_difference() {
    let dir = std::env::temp_dir().join(format!("cave-cassette-stable-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cassette = dir.join("run.jsonl");
    let server = TestServer::start([
        answer(&block("print(1)"), 3, "stop"),
        answer("Done.", 2, "stop"),
    ])
    .await;
    let recording =
        RecordingModel::create(OpenAiModel::new(config(&server)).unwrap(), &cassette).unwrap();
    let (_, recorded) = run_agent(recording, None).await;
    assert_eq!(stopped(&recorded).0, StopReason::Completed);
    let text = std::fs::read_to_string(&cassette).unwrap();
    assert!(text.contains(r#""kind":"execution_result""#), "{text}");

    // The execution result as another interpreter would have printed it.
    let mut lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let second = lines
        .iter_mut()
        .filter(|l| l.get("request").is_some())
        .nth(1)
        .unwrap();
    let messages = second["request"]["messages"].as_array_mut().unwrap();
    let result = messages
        .iter_mut()
        .find(|m| m["kind"] == "execution_result")
        .unwrap();
    let recorded_result = result["content"].as_str().unwrap().to_owned();
    result["content"] = json!(recorded_result.replacen("print(1)", "print(1)  # 3.9", 1));
    assert_ne!(
        result["content"],
        json!(recorded_result),
        "the echo shows the code"
    );
    let write = |lines: &[serde_json::Value]| {
        let text: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
        std::fs::write(&cassette, text.join("\n")).unwrap();
    };
    write(&lines);
    let without_kinds: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| {
            let mut l = l.clone();
            if let Some(messages) = l
                .get_mut("request")
                .and_then(|r| r.get_mut("messages"))
                .and_then(|m| m.as_array_mut())
            {
                for m in messages {
                    m.as_object_mut().unwrap().remove("kind");
                }
            }
            l
        })
        .collect();
    for (label, cassette_lines) in [("with kinds", &lines), ("without kinds", &without_kinds)] {
        write(cassette_lines);
        let reported = Arc::new(Mutex::new(Vec::<String>::new()));
        let sink = reported.clone();
        let replay = ReplayModel::open(&cassette)
            .unwrap()
            .on_difference(move |d| sink.lock().unwrap().push(d.to_owned()));
        let (_, replayed) = run_agent(replay, None).await;
        assert_eq!(
            stopped(&replayed).0,
            StopReason::Completed,
            "{label}: {replayed:?}"
        );
        let reported = reported.lock().unwrap().clone();
        assert_eq!(reported.len(), 1, "{label}: {reported:?}");
        assert!(
            reported[0].contains(
                "call 2: message 3, an execution result, differs from the recording from line"
            ) && reported[0].contains("# 3.9"),
            "{label}: {}",
            reported[0]
        );
    }

    // The code message is the model's own answer: a difference there is a divergence.
    let mut changed = lines.clone();
    let second = changed
        .iter_mut()
        .filter(|l| l.get("request").is_some())
        .nth(1)
        .unwrap();
    let code = second["request"]["messages"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|m| m["kind"] == "code")
        .unwrap();
    code["content"] = json!(block("print(2)"));
    write(&changed);
    let (_, replayed) = run_agent(ReplayModel::open(&cassette).unwrap(), None).await;
    let Some(Event::Stopped { error, .. }) = replayed.last() else {
        panic!("{replayed:?}")
    };
    let message = &error.as_ref().unwrap().message;
    assert!(
        message
            .contains("replay diverged at call 2: message 2 (a code message) differs from line 2"),
        "{message}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn reasoning_goes_back_only_when_configured() {
    for send in [false, true] {
        let server = TestServer::start([
            Reply::Sse(vec![
                reasoning("reasoning_content", "I should print."),
                text(&block("print(1)")),
                finish("stop"),
                Part::Done,
            ]),
            answer("Done.", 3, "stop"),
        ])
        .await;
        let model = OpenAiModel::new(config(&server).send_reasoning(send)).unwrap();
        let (agent, events) = run_agent(model, Some(Duration::from_secs(5))).await;
        assert_eq!(stopped(&events).0, StopReason::Completed);
        assert_eq!(
            agent.history()[2].reasoning(),
            Some("I should print."),
            "kept in history either way"
        );
        let second = &server.received()[1].body["messages"];
        let assistant = second
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["role"] == "assistant")
            .unwrap();
        assert_eq!(
            assistant.get("reasoning_content").is_some(),
            send,
            "{assistant}"
        );
    }
}

/// The adapters' retries, around a model of the user's own.
#[tokio::test]
async fn any_model_gets_the_same_retries() {
    use cave_models::{Retrying, classify_http, retry_after};
    use cave_testing::{Reply, ScriptedModel};
    let policy = RetryPolicy {
        base_delay: Duration::from_millis(1),
        ..RetryPolicy::default()
    };
    let busy = || {
        classify_http(
            429,
            r#"{"error":{"message":"slow down"}}"#,
            retry_after("0"),
        )
    };
    assert!(matches!(
        busy().kind(),
        ModelErrorKind::Transient {
            retry_after: Some(d)
        } if d.is_zero()
    ));
    // Two transient failures, then an answer: two announced backoffs, then the answer.
    let inner = ScriptedModel::new([
        Reply::fails(busy()),
        Reply::fails(busy()),
        Reply::text("ok"),
    ]);
    let model = Retrying::with_policy(inner, policy);
    let (deltas, error) = collect(&model).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(deltas.iter().filter(|d| d.backoff.is_some()).count(), 2);
    assert_eq!(text_of(&deltas), "ok");
    // What retrying cannot fix fails at once.
    let auth = classify_http(401, r#"{"error":{"message":"bad key"}}"#, None);
    assert_eq!(auth.kind(), &ModelErrorKind::Auth);
    let inner = ScriptedModel::new([Reply::fails(auth), Reply::text("never")]);
    let model = Retrying::with_policy(inner, policy);
    let (deltas, error) = collect(&model).await;
    assert!(deltas.is_empty() && error.is_some_and(|e| e.kind() == &ModelErrorKind::Auth));
    // After content, a failure passes through (the agent keeps the partial answer).
    let inner = ScriptedModel::new([Reply::text("partial").then_error(busy()), Reply::text("x")]);
    let counting = Retrying::with_policy(inner, policy);
    let (deltas, error) = collect(&counting).await;
    assert_eq!(text_of(&deltas), "partial");
    assert!(error.is_some());
    let too_long = classify_http(
        400,
        r#"{"error":{"message":"too long","code":"context_length_exceeded"}}"#,
        None,
    );
    assert_eq!(too_long.kind(), &ModelErrorKind::PromptTooLong);
}

#[test]
fn retry_delays_double_and_spread() {
    let policy = RetryPolicy::default();
    let first: Vec<Duration> = (0..200).map(|_| policy.delay(0, None)).collect();
    assert!(
        first
            .iter()
            .all(|d| *d >= Duration::from_millis(500) && *d <= Duration::from_millis(625)),
        "0.5 s plus up to 25 %"
    );
    let mut distinct = first.clone();
    distinct.sort();
    distinct.dedup();
    assert!(
        distinct.len() > 100,
        "jitter spreads clients apart: {}",
        distinct.len()
    );
    let third = policy.delay(2, None);
    assert!(third >= Duration::from_secs(2) && third <= Duration::from_millis(2500));
    assert_eq!(
        policy.delay(9, Some(Duration::from_secs(3))),
        Duration::from_secs(3),
        "the provider's Retry-After wins"
    );
    let capped = policy.delay(30, None);
    assert!(
        capped >= Duration::from_secs(32) && capped <= Duration::from_secs(40),
        "capped at 32 s, plus jitter: {capped:?}"
    );
}

/// An error the provider reports inside the stream, after some text, is classified like an
/// HTTP error: by its status, its code and its type, the provider's message kept (redacted).
#[tokio::test]
async fn errors_inside_the_stream_are_classified() {
    let transient = ModelErrorKind::Transient { retry_after: None };
    let cases = [
        (
            json!({"message": "Overloaded", "type": "overloaded_error"}),
            transient.clone(),
        ),
        (
            json!({"message": "Rate limit reached", "type": "rate_limit_error", "code": "rate_limit_exceeded"}),
            transient.clone(),
        ),
        (json!({"message": "busy", "code": 529}), transient.clone()),
        (json!({"message": "busy", "status": 503}), transient.clone()),
        (
            json!({"message": "oops", "type": "server_error", "code": null}),
            transient,
        ),
        (
            json!({"message": format!("Incorrect API key {KEY}"), "type": "authentication_error"}),
            ModelErrorKind::Auth,
        ),
        (
            json!({"message": "flagged", "code": "content_filter"}),
            ModelErrorKind::ContentFiltered,
        ),
        (
            json!({"message": "too long", "code": "context_length_exceeded"}),
            ModelErrorKind::PromptTooLong,
        ),
        (
            json!({"message": "no credit", "code": "insufficient_quota"}),
            ModelErrorKind::BillingExhausted,
        ),
    ];
    for (error, kind) in cases {
        let server = TestServer::start([Reply::Sse(vec![
            text("half an ans"),
            Part::Data(json!({ "error": error })),
        ])])
        .await;
        let model = OpenAiModel::new(config(&server)).unwrap();
        let (deltas, failure) = collect(&model).await;
        assert_eq!(text_of(&deltas), "half an ans");
        let failure = failure.expect("the provider's error");
        assert_eq!(failure.kind(), &kind, "{error}");
        let message = error["message"].as_str().unwrap().replace(KEY, "");
        assert!(failure.message().contains(message.trim()), "{failure}");
        assert!(!failure.message().contains(KEY), "{failure}");
        assert_eq!(server.received().len(), 1, "no reconnect after content");
    }
}

/// Through the agent: a transient error the provider reports mid-answer makes the agent ask
/// again from the start; the half answer is not continued, not spliced, and not kept.
#[tokio::test]
async fn an_agent_asks_again_after_an_error_inside_the_stream() {
    let server = TestServer::start([
        Reply::Sse(vec![
            text("Let me run it.\n```pytho"),
            Part::Data(json!({"error": {"message": "Overloaded", "type": "overloaded_error"}})),
        ]),
        answer("```python\nprint(1)\n```", 7, "stop"),
        answer("Done.", 8, "stop"),
    ])
    .await;
    let model = OpenAiModel::new(config(&server)).unwrap();
    let mut agent = AgentBuilder::new(model, EchoRuntime::new())
        .build()
        .unwrap();
    let events: Vec<Event> = agent.stream("Run it.").collect().await;
    assert!(
        events.iter().any(|e| matches!(
            e,
            Event::Backoff { reason: Some(reason), .. } if reason.contains("Overloaded")
        )),
        "{events:?}"
    );
    let final_response = events.iter().find_map(|e| match e {
        Event::FinalResponse { content } => Some(content.clone()),
        _ => None,
    });
    assert_eq!(final_response.as_deref(), Some("Done."));
    let history: Vec<String> = agent
        .history()
        .iter()
        .map(|m| m.to_chat().content)
        .collect();
    assert!(
        history.iter().any(|m| m == "```python\nprint(1)\n```"),
        "{history:?}"
    );
    assert!(
        !history
            .iter()
            .any(|m| m.contains("pytho```") || m.contains("Let me run it.")),
        "{history:?}"
    );
    assert_eq!(server.received().len(), 3);
}

/// A `refusal` field is the answer (shown, never run, even when it quotes code), and a
/// `content_filter` finish with nothing streamed ends the run saying the provider filtered it.
#[tokio::test]
async fn a_refusal_is_the_answer_and_a_filtered_empty_answer_ends_the_run() {
    let refusal = "I can't help with that:\n```python\nimport os\n```";
    let server = TestServer::start([Reply::Sse(vec![
        Part::Data(
            json!({"choices": [{"index": 0, "delta": {"refusal": &refusal[..14]}, "finish_reason": null}]}),
        ),
        Part::Data(
            json!({"choices": [{"index": 0, "delta": {"refusal": &refusal[14..]}, "finish_reason": null}]}),
        ),
        finish("stop"),
        Part::Done,
    ])])
    .await;
    let (_, events) = run_agent(OpenAiModel::new(config(&server)).unwrap(), None).await;
    assert_eq!(stopped(&events).0, StopReason::Completed, "{events:?}");
    assert!(
        events.contains(&Event::FinalResponse {
            content: refusal.into()
        }),
        "{events:?}"
    );
    assert!(!events.iter().any(|e| matches!(e, Event::Code { .. })));

    let server = TestServer::start([Reply::Sse(vec![finish("content_filter"), Part::Done])]).await;
    let (agent, events) = run_agent(OpenAiModel::new(config(&server)).unwrap(), None).await;
    let Some(Event::Stopped {
        stop_reason, error, ..
    }) = events.last()
    else {
        panic!("{events:?}")
    };
    assert_eq!(*stop_reason, StopReason::ModelError);
    let error = error.as_ref().unwrap();
    assert!(error.message.contains("filtered"), "{error:?}");
    assert_eq!(
        agent.history().len(),
        2,
        "nothing kept from the filtered answer"
    );
}

/// The content type decides how the answer is read: a whole JSON completion (a server that
/// ignores `stream: true`) is the answer, usage included; anything but an event stream or JSON
/// is a clear error naming it.
#[tokio::test]
async fn the_content_type_decides_how_the_answer_is_read() {
    let completion = json!({
        "id": "c", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello whole"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    });
    let server = TestServer::start([Reply::Status {
        status: 200,
        headers: vec![],
        body: completion.to_string(),
    }])
    .await;
    let model = OpenAiModel::new(config(&server)).unwrap();
    let (deltas, error) = collect(&model).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(text_of(&deltas), "Hello whole");
    assert_eq!(
        deltas.iter().find_map(|d| d.finish_reason.clone()),
        Some(FinishReason::Stop)
    );
    assert_eq!(
        deltas.iter().find_map(|d| d.usage).map(|u| u.total_tokens),
        Some(7)
    );

    let server = TestServer::start([Reply::Status {
        status: 200,
        headers: vec![(
            "content-type".to_owned(),
            "text/html; charset=utf-8".to_owned(),
        )],
        body: "<html><body>Welcome to the proxy</body></html>".to_owned(),
    }])
    .await;
    let model = OpenAiModel::new(config(&server)).unwrap();
    let (deltas, error) = collect(&model).await;
    assert!(deltas.is_empty());
    let error = error.expect("refused");
    assert!(error.message().contains("text/html"), "{error}");
    assert!(error.message().contains("Welcome to the proxy"), "{error}");
}

/// Event streams as servers write them: comments, CRLF line ends, `data:` without a space,
/// one event's data over several lines, no `[DONE]` at the end.
#[tokio::test]
async fn event_streams_are_read_as_servers_write_them() {
    let chunk = |content: &str| {
        json!({"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": null}]})
            .to_string()
    };
    let server = TestServer::start([Reply::Sse(vec![
        Part::Raw(": keep-alive\r\n\r\n".to_owned()),
        Part::Raw(format!("data:{}\r\n\r\n", chunk("one "))),
        Part::Raw(
            "event: message\ndata: {\"choices\": [{\"index\": 0,\ndata: \"delta\": {\"content\": \"two \"}, \"finish_reason\": null}]}\n\n"
                .to_owned(),
        ),
        Part::Raw(format!("data: {}\n\n", chunk("three"))),
        finish("stop"),
    ])])
    .await;
    let model = OpenAiModel::new(config(&server)).unwrap();
    let (deltas, error) = collect(&model).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(text_of(&deltas), "one two three");
}

/// A configured async-openai client, Azure's: its deployment path, `api-version` and `api-key`
/// header reach the server; failures go through the adapter's own transport (a 429 with
/// `Retry-After` is retried as announced, the key never shows); settings the client holds
/// cannot be given twice.
#[tokio::test]
async fn an_azure_client_is_used_as_configured() {
    use async_openai::config::AzureConfig;
    let server = TestServer::start([
        status_with(
            429,
            &[("retry-after", "0.05")],
            json!({"error": {"message": "slow down, key sk-azure-0123456789abcdef", "code": "429"}}),
        ),
        answer("Hi from Azure", 3, "stop"),
    ])
    .await;
    server.record(true);
    let azure = || {
        AzureConfig::new()
            .with_api_base(server.base_url().trim_end_matches("/v1"))
            .with_deployment_id("gpt-4o-deploy")
            .with_api_version("2024-10-21")
            .with_api_key("sk-azure-0123456789abcdef")
    };
    let model = OpenAiModel::from_client(
        async_openai::Client::with_config(azure()),
        ModelConfig::new("gpt-4o").retry(quick()),
    )
    .unwrap();
    let (deltas, error) = collect(&model).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(text_of(&deltas), "Hi from Azure");
    let reasons: Vec<&str> = deltas
        .iter()
        .filter_map(|d| d.backoff_reason.as_deref())
        .collect();
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert!(reasons[0].contains("slow down"), "{reasons:?}");
    assert!(
        !reasons[0].contains("sk-azure-0123456789abcdef"),
        "{reasons:?}"
    );
    assert_eq!(
        deltas.iter().find_map(|d| d.backoff),
        Some(Duration::from_millis(50)),
        "Retry-After is honoured"
    );
    assert!(!format!("{model:?}").contains("sk-azure"));
    let received = server.received();
    assert_eq!(received.len(), 2);
    let request = &received[1];
    assert_eq!(
        request.path,
        "/openai/deployments/gpt-4o-deploy/chat/completions?api-version=2024-10-21"
    );
    assert_eq!(request.header("api-key"), Some("sk-azure-0123456789abcdef"));
    assert_eq!(request.header("authorization"), None);
    assert_eq!(request.body["model"], "gpt-4o");
    assert_eq!(request.body["stream"], true);

    let refused = OpenAiModel::from_client(
        async_openai::Client::with_config(azure()),
        ModelConfig::new("gpt-4o").base_url("http://elsewhere"),
    );
    let error = refused.expect_err("base_url twice");
    assert!(error.to_string().contains("base_url"), "{error}");
}

/// `new` sends the key as a bearer token and the organisation and project headers, and
/// nothing from the process's environment (async-openai's own `OpenAIConfig` would read
/// `OPENAI_API_KEY`); a key that cannot be a header is a typed error, not a panic.
#[tokio::test]
async fn new_sends_what_the_config_says_and_nothing_else() {
    let server = TestServer::start([answer("Hi", 2, "stop"), answer("Hi", 2, "stop")]).await;
    server.record(true);
    let model = OpenAiModel::new(config(&server).organization("org-1").project("proj-1")).unwrap();
    let (_, error) = collect(&model).await;
    assert!(error.is_none(), "{error:?}");
    let keyless = OpenAiModel::new(ModelConfig::new("m").base_url(server.base_url())).unwrap();
    let (_, error) = collect(&keyless).await;
    assert!(error.is_none(), "{error:?}");
    let received = server.received();
    assert_eq!(received[0].path, "/v1/chat/completions");
    assert_eq!(
        received[0].header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert_eq!(received[0].header("openai-organization"), Some("org-1"));
    assert_eq!(received[0].header("openai-project"), Some("proj-1"));
    assert_eq!(received[0].header("accept"), Some("text/event-stream"));
    assert_eq!(received[1].header("authorization"), None);

    let error = OpenAiModel::new(ModelConfig::new("m").api_key(ApiKey::new("sk-bad\nkey")))
        .expect_err("a line break in the key");
    assert!(error.to_string().contains("API key"), "{error}");
    assert!(!error.to_string().contains("sk-bad"), "{error}");
}
