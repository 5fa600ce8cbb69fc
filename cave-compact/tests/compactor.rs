//! Compaction tiers, pair preservation, incremental summaries, the breaker, overflow recovery.

use cave_compact::{ContextCompactor, ScriptEstimator};
use cave_core::prompt as prompts;
use cave_core::{
    AgentBuilder, Compactor, Event, Message, ModelError, ModelErrorKind, ModelInfo,
    PersistedOutput, StopReason, TokenEstimator, persisted_marker,
};
use cave_testing::{EchoRuntime, Reply, ScriptedModel};
use futures_util::StreamExt;
use std::sync::Arc;

fn summary(text: &str) -> Reply {
    Reply::text(format!(
        "<analysis>thinking it over</analysis>\n<summary>{text}</summary>"
    ))
}

/// A compactor whose summaries come from `summaries`, counting with the heuristic.
fn compactor(summaries: ScriptedModel) -> (ContextCompactor, Arc<ScriptedModel>) {
    let model = Arc::new(summaries);
    (ContextCompactor::new(model.clone()), model)
}

/// System, a user prompt, then `pairs` code/result pairs with `output` as each result.
fn history(pairs: usize, output: &str) -> Vec<Message> {
    let mut h = vec![Message::system("sys"), Message::user("Analyse the data.")];
    for i in 0..pairs {
        h.push(Message::code(format!("```python\nstep_{i} = {i}\n```")));
        h.push(Message::execution_result(format!("{output} #{i}")));
    }
    h
}

#[test]
fn the_threshold_leaves_room_for_the_answer() {
    let (c, _) = compactor(ScriptedModel::new([]));
    assert_eq!(c.threshold(), 128_000 - 16_000 - 13_000);
    let c = c.with_output_reserve(8_000);
    assert_eq!(
        c.threshold(),
        128_000 - 8_000 - 13_000,
        "the agent's model's cap, when given"
    );
    let (c, _) = compactor(
        ScriptedModel::new([]).with_info(ModelInfo::new("m").with_max_output_tokens(Some(2_000))),
    );
    assert_eq!(c.threshold(), 128_000 - 2_000 - 13_000);
    let c = c.with_output_reserve(0).with_context_window(20_000);
    assert_eq!(c.threshold(), 7_000);
    let c = c.with_context_window(10_000);
    assert_eq!(
        c.threshold(),
        5_000,
        "when reserve and buffer eat the window: half of it"
    );
}

#[test]
fn microcompaction_clears_all_but_the_recent_results() {
    let (c, _) = compactor(ScriptedModel::new([]));
    let mut h = history(10, &"x".repeat(400));
    let big = "y".repeat(9000);
    h[3] = Message::execution_result(prompts::summary_message("not a marker"));
    h[5] = Message::persisted_result(
        format!(
            "wrapped {} tail",
            persisted_marker(&big, 9000, "_output_1", 2000)
        ),
        PersistedOutput::new("_output", 1, 9000),
    );
    // A marker in text without its data (the model's code printed one) is plain output.
    h[7] = Message::execution_result(persisted_marker(&big, 9000, "_output_2", 10));
    let cleared = c
        .microcompact(&h, &ScriptEstimator)
        .expect("something to clear");
    assert_eq!(cleared.len(), h.len());
    let results: Vec<&str> = cleared
        .iter()
        .filter(|m| matches!(m, Message::ExecutionResult { .. }))
        .map(Message::content)
        .collect();
    assert_eq!(results[0], prompts::CLEARED_RESULT);
    assert!(
        results[1].contains("`_output_1`")
            && !results[1].contains("Preview")
            && results[1].ends_with("</persisted-output> tail")
    );
    assert!(results[2..4].iter().all(|r| *r == prompts::CLEARED_RESULT));
    assert!(
        results[4..].iter().all(|r| r.starts_with("xxxx")),
        "the 6 most recent are whole"
    );
    assert_eq!(
        cleared
            .iter()
            .filter(|m| matches!(m, Message::Code { .. }))
            .count(),
        10,
        "code is untouched"
    );
    assert!(
        c.microcompact(&cleared, &ScriptEstimator).is_none(),
        "a second pass changes nothing"
    );
}

/// An old result's images are cleared with its text, as a large output is: also a cleared
/// result or a marker at its floor that still carried images; the recent ones keep theirs.
#[test]
fn microcompaction_clears_old_images_with_their_text() {
    let (c, _) = compactor(ScriptedModel::new([]));
    let image = || vec![cave_core::ImagePart::new("image/png", b"png", 640, 480)];
    let mut h = history(8, "a chart");
    for m in h.iter_mut() {
        if matches!(m, Message::ExecutionResult { .. }) {
            *m = m.clone().with_images(image());
        }
    }
    // Already cleared text, but still an image: cleared too.
    h[3] = Message::execution_result(prompts::CLEARED_RESULT).with_images(image());
    let cleared = c
        .microcompact(&h, &ScriptEstimator)
        .expect("something to clear");
    let images: Vec<usize> = cleared
        .iter()
        .filter(|m| matches!(m, Message::ExecutionResult { .. }))
        .map(|m| m.images().len())
        .collect();
    assert_eq!(
        images,
        [0, 0, 1, 1, 1, 1, 1, 1],
        "the 6 most recent keep theirs"
    );
    assert!(c.microcompact(&cleared, &ScriptEstimator).is_none());
}

#[test]
fn prepare_clears_first_and_asks_for_a_summary_only_if_needed() {
    let (c, _) = compactor(ScriptedModel::new([]));
    let c = c.with_context_window(4_000).with_output_reserve(0);
    // Under the threshold (…/2 = 2 000 tokens): nothing.
    let small = history(3, "ok");
    let p = c.prepare(&small, None, &ScriptEstimator);
    assert!(p.history.is_none() && !p.needs_summary);
    // Ten results of ~250 tokens (2 500 in all): clearing the 4 oldest is enough.
    let h = history(10, &"x".repeat(1_000));
    let p = c.prepare(&h, None, &ScriptEstimator);
    assert!(p.history.is_some() && !p.needs_summary);
    // Even the recent ones are too big: a summary is needed.
    let h = history(10, &"x".repeat(8_000));
    assert!(c.prepare(&h, None, &ScriptEstimator).needs_summary);
}

#[tokio::test]
async fn a_summary_replaces_the_older_half_and_keeps_pairs_together() {
    let (c, model) = compactor(ScriptedModel::new([summary(
        "S1: steps 0-4 done; step_i holds i.",
    )]));
    let h = history(10, "out");
    let summarized = c.summarize(h.clone(), &ScriptEstimator).await;
    assert!(summarized.error.is_none());
    assert!(
        summarized.usage.total_tokens > 0,
        "the summary's tokens are reported"
    );
    let compacted = summarized.history;
    assert!(matches!(compacted[0], Message::System { .. }));
    match &compacted[1] {
        Message::Summary { content, body } => {
            assert_eq!(body, "S1: steps 0-4 done; step_i holds i.");
            assert!(content.contains("<conversation-summary>\nS1:"));
        }
        other => panic!("expected a summary, got {other:?}"),
    }
    // The kept part starts with code (an assistant turn), so no acknowledgement is needed,
    // and never with a result cut off from its code.
    assert!(
        matches!(compacted[2], Message::Code { .. }),
        "{:?}",
        compacted[2]
    );
    assert!(compacted.len() < h.len());
    let request = &model.requests()[0];
    let transcript = &request.messages[1].content;
    assert!(transcript.contains("[User]\nAnalyse the data.") && transcript.contains("step_0 = 0"));
    assert!(
        !transcript.contains("step_9 = 9"),
        "recent turns are kept, not summarized"
    );
}

#[tokio::test]
async fn re_summaries_build_on_the_last_one_and_skip_when_nothing_is_new() {
    let (c, model) = compactor(ScriptedModel::new([summary("S1"), summary("S2")]));
    let first = c
        .summarize(history(10, "out"), &ScriptEstimator)
        .await
        .history;
    let mut longer = first.clone();
    for i in 10..20 {
        longer.push(Message::code(format!("step_{i} = {i}")));
        longer.push(Message::execution_result(format!("out #{i}")));
    }
    let second = c.summarize(longer, &ScriptEstimator).await.history;
    let request = &model.requests()[1].messages[1].content;
    assert!(
        request.contains("<previous-summary>\nS1\n</previous-summary>"),
        "{request}"
    );
    assert!(
        !request.contains("[Earlier summary]"),
        "the summary is not summarized again"
    );
    assert!(matches!(&second[1], Message::Summary { body, .. } if body == "S2"));
    // Nothing happened since the last summary: no call.
    let quiet = vec![
        Message::system("sys"),
        Message::Summary {
            content: "s".into(),
            body: "S".into(),
        },
        Message::SummaryAcknowledgement {
            content: "ok".into(),
        },
        Message::user("a"),
        Message::assistant("b"),
        Message::user("c"),
        Message::assistant("d"),
    ];
    let calls = model.calls();
    assert_eq!(
        c.summarize(quiet.clone(), &ScriptEstimator).await.history,
        quiet
    );
    assert_eq!(model.calls(), calls);
}

#[tokio::test]
async fn failed_summaries_keep_history_and_trip_the_breaker() {
    let broken = ScriptedModel::repeating(
        Reply::text("no tags and cut").finish(cave_core::FinishReason::Length),
    );
    let (c, model) = compactor(broken);
    let h = history(10, "out");
    for _ in 0..3 {
        let failed = c.summarize(h.clone(), &ScriptEstimator).await;
        assert_eq!(failed.history, h, "nothing is dropped");
        assert!(
            failed
                .error
                .is_some_and(|e| matches!(&e, cave_core::SummaryError::Unusable(why) if why.contains("did not finish normally"))),
            "and the failure is said"
        );
        assert!(
            failed.usage.total_tokens > 0,
            "a failed call still cost tokens"
        );
    }
    assert!(c.breaker_open());
    for _ in 0..10 {
        let skipped = c.summarize(h.clone(), &ScriptEstimator).await;
        assert_eq!(skipped.error, Some(cave_core::SummaryError::Paused));
    }
    assert_eq!(model.calls(), 3, "ten attempts skipped");
    c.summarize(h.clone(), &ScriptEstimator).await;
    assert_eq!(model.calls(), 4, "then the model is tried again");
}

#[tokio::test]
async fn oversized_requests_are_folded() {
    let too_long = ModelError::new(ModelErrorKind::PromptTooLong, "context length exceeded");
    let model = ScriptedModel::new([Reply::fails(too_long)]).with_fallback(summary("part"));
    let (c, model) = compactor(model);
    let folded = c
        .summarize(history(12, "out"), &ScriptEstimator)
        .await
        .history;
    assert!(matches!(&folded[1], Message::Summary { .. }));
    let requests = model.requests();
    assert!(
        requests.len() >= 3,
        "refused once, then halves: {}",
        requests.len()
    );
    assert!(
        requests.last().unwrap().messages[1]
            .content
            .contains("<previous-summary>\npart"),
        "the second half builds on the first"
    );
}

#[tokio::test]
async fn the_agent_recovers_from_a_prompt_that_is_too_long() {
    let too_long = ModelError::new(ModelErrorKind::PromptTooLong, "context length exceeded");
    let agent_model = ScriptedModel::new([Reply::fails(too_long), Reply::text("Fits now.")]);
    let (c, summarizer) = compactor(ScriptedModel::new([summary("earlier work")]));
    let mut agent = AgentBuilder::new(agent_model, EchoRuntime::new())
        .history(history(12, "out"))
        .compactor(c)
        .build()
        .unwrap();
    let events: Vec<Event> = agent.stream("Continue.").collect().await;
    assert!(matches!(
        events.last(),
        Some(Event::Stopped {
            stop_reason: StopReason::Completed,
            ..
        })
    ));
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::Status(cave_core::Status::Compacted { .. })))
    );
    assert_eq!(summarizer.calls(), 1);
    assert!(
        agent
            .history()
            .iter()
            .any(|m| matches!(m, Message::Summary { .. }))
    );
}

#[tokio::test]
async fn a_long_session_stays_inside_a_small_window() {
    let window = 6_000;
    let step = Reply::text(format!(
        "```python\nresult = 1  # {}\n```",
        "data ".repeat(120)
    ));
    let agent_model = Arc::new(ScriptedModel::repeating(step));
    let (c, summarizer) = compactor(ScriptedModel::repeating(summary(
        "Steps so far: result = 1 each time.",
    )));
    let c = c.with_context_window(window).with_output_reserve(500);
    let runtime = Arc::new(EchoRuntime::new());
    let mut agent = AgentBuilder::new(agent_model.clone(), runtime.clone())
        .max_steps(200)
        .compactor(c)
        .estimator(ScriptEstimator)
        .build()
        .unwrap();
    let response = agent.run("Keep going.").await;
    assert_eq!(
        (response.stop_reason, response.steps),
        (StopReason::MaxSteps, 200)
    );
    assert_eq!(
        runtime.executed().len(),
        200,
        "the runtime served every step"
    );
    let largest = agent_model
        .requests()
        .iter()
        .map(|r| {
            r.messages
                .iter()
                .map(|m| ScriptEstimator.estimate(&m.content))
                .sum::<u64>()
        })
        .max()
        .unwrap();
    assert!(
        largest <= window,
        "largest request {largest} tokens > window {window}"
    );
    assert!(summarizer.calls() > 0, "summaries were needed");
}
