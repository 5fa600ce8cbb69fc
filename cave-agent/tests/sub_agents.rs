//! Sub-agents with scripted models: an orchestrator (in-process) drives a cleaner
//! (in-process) and an analyzer (kernel runtime); the host reads the analyzer's result; the
//! nested events arrive in order; cancelling the orchestrator cancels the sub-agent it waits on.

use cave_agent::AgentExt;
use cave_agent::testing::{Reply, ScriptedModel};
use cave_agent::{
    Agent, CancellationToken, Event, InProcRuntime, KernelRuntime, Resources, Runtime, StopReason,
    SubAgent, Value, Variable,
};
use futures_util::StreamExt;
use std::sync::Arc;
use std::time::Duration;

fn code(text: &str) -> Reply {
    Reply::text(format!("```python\n{text}\n```"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orchestrator_drives_two_sub_agents_and_the_host_reads_the_result() {
    let cleaner_model = Arc::new(ScriptedModel::new([
        code("cleaned = [x for x in data if x is not None]\nprint(len(cleaned))"),
        Reply::text("Cleaned: 4 values kept."),
    ]));
    let cleaner = SubAgent::new(
        "cleaner",
        "Cleans datasets: drops missing values.",
        Agent::builder(cleaner_model.clone(), InProcRuntime::new().expect("python"))
            .build()
            .expect("builds"),
    );
    let analyzer = SubAgent::new(
        "analyzer",
        "Computes statistics.",
        Agent::builder(
            ScriptedModel::new([
                code(
                    "result = {'mean': sum(values) / len(values), 'n': len(values)}\nprint(result)",
                ),
                Reply::text("The mean is 2.5."),
            ]),
            KernelRuntime::new().expect("python"),
        )
        .build()
        .expect("builds"),
    );

    let runtime = InProcRuntime::new().expect("python");
    runtime
        .register(Resources::new().variable(Variable::new(
            "data",
            Value::List(vec![
                1.into(),
                Value::None,
                2.into(),
                3.into(),
                Value::None,
                4.into(),
            ]),
        )))
        .await
        .expect("registers");
    let orchestrator_model = Arc::new(ScriptedModel::new([
        code(
            "cleaner.set('data', data)\nprint(cleaner.run('Drop the missing values of data into cleaned.'))\nanalyzer.set('values', cleaner.get('cleaned'))\nprint(analyzer.run('Compute the mean of values into result.'))",
        ),
        Reply::text("The cleaned data has a mean of 2.5."),
    ]));
    let mut orchestrator = Agent::builder(orchestrator_model.clone(), runtime.clone())
        .sub_agent(cleaner.clone())
        .sub_agent(analyzer.clone())
        .build()
        .expect("builds");

    let events: Vec<Event> = orchestrator
        .stream("Clean the data, then analyze it.")
        .collect()
        .await;
    let Some(Event::Stopped { stop_reason, .. }) = events.last() else {
        panic!("stopped last: {events:?}");
    };
    assert_eq!(*stop_reason, StopReason::Completed, "{events:#?}");

    // The sub-agents are in the orchestrator's prompt, with their descriptions.
    let prompt = &orchestrator_model.requests()[0].messages[0].content;
    assert!(
        prompt.contains("cleaner") && prompt.contains("Cleans datasets: drops missing values."),
        "{prompt}"
    );

    // Their events arrive nested, in order, while the orchestrator's code runs.
    let nested: Vec<(&str, &Event)> = events
        .iter()
        .filter_map(|e| match e {
            Event::SubAgent { agent, event } => Some((agent.as_str(), &**event)),
            _ => None,
        })
        .collect();
    let names: Vec<&str> = nested.iter().map(|(n, _)| *n).collect();
    let first_analyzer = names
        .iter()
        .position(|n| *n == "analyzer")
        .expect("analyzer events");
    assert!(
        names[..first_analyzer].iter().all(|n| *n == "cleaner"),
        "{names:?}"
    );
    assert!(
        matches!(nested[0].1, Event::UserPrompt { content, .. } if content.starts_with("Drop the missing"))
    );
    assert!(
        nested.iter().any(|(n, e)| *n == "analyzer"
            && matches!(e, Event::Code { code, .. } if code.contains("mean")))
    );
    assert!(matches!(
        nested.last(),
        Some((
            "analyzer",
            Event::Stopped {
                stop_reason: StopReason::Completed,
                ..
            }
        ))
    ));
    let result_at = events
        .iter()
        .position(|e| matches!(e, Event::ExecutionResult { .. }))
        .expect("the orchestrator's execution");
    let last_nested = events
        .iter()
        .rposition(|e| matches!(e, Event::SubAgent { .. }))
        .unwrap();
    assert!(
        last_nested < result_at,
        "nested events come before the execution's result"
    );
    let Event::ExecutionResult {
        output, success, ..
    } = &events[result_at]
    else {
        unreachable!()
    };
    assert!(*success, "{output}");
    assert_eq!(output, "Cleaned: 4 values kept.\nThe mean is 2.5.\n");

    // The host reads the analyzer's result from its runtime.
    let result = analyzer.runtime().get("result").await.expect("result");
    assert_eq!(
        result,
        Value::Dict(vec![
            (Value::Str("mean".into()), Value::Float(2.5)),
            (Value::Str("n".into()), Value::Int(4)),
        ])
    );
    // The cleaner saw its prompt only, never the orchestrator's conversation.
    let cleaner_request = &cleaner_model.requests()[0];
    let seen: String = cleaner_request
        .messages
        .iter()
        .map(|m| m.content.as_str())
        .collect();
    assert!(!seen.contains("Clean the data, then analyze it."), "{seen}");
    assert!(seen.contains("Drop the missing values of data into cleaned."));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_the_orchestrator_cancels_the_sub_agent() {
    let slow_model = Arc::new(ScriptedModel::new(
        [Reply::text("Let me think").then_hang()],
    ));
    let slow = SubAgent::new(
        "slow",
        "Thinks for a long time.",
        Agent::builder(slow_model.clone(), KernelRuntime::new().expect("python"))
            .build()
            .expect("builds"),
    );
    let mut orchestrator = Agent::builder(
        ScriptedModel::new([code("print(slow.run('Think hard.'))")]),
        InProcRuntime::new().expect("python"),
    )
    .sub_agent(slow.clone())
    .build()
    .expect("builds");

    let cancel = CancellationToken::new();
    let mut stream = orchestrator.stream_until("Ask the slow one.", cancel.clone());
    let mut events = Vec::new();
    while let Some(event) = stream.next().await {
        // The sub-agent is streaming: cancel the orchestrator.
        if matches!(&event, Event::SubAgent { event, .. } if matches!(**event, Event::Text { .. }))
        {
            cancel.cancel();
        }
        events.push(event);
    }
    drop(stream);
    assert!(
        matches!(
            events.last(),
            Some(Event::Stopped {
                stop_reason: StopReason::Cancelled,
                ..
            })
        ),
        "{events:#?}"
    );
    // The sub-agent's run ends too: its stream is closed and its history says it was cut.
    let agent = tokio::time::timeout(Duration::from_secs(30), slow.agent())
        .await
        .expect("the sub-agent's run ended");
    assert_eq!(
        slow_model.open_streams(),
        0,
        "the hanging stream was closed"
    );
    assert!(
        agent
            .history()
            .iter()
            .any(|m| m.content().contains("Think hard.")),
        "{:?}",
        agent.history()
    );
}

/// The in-process runtime cannot run a cell from its own host call: a sub-agent sharing the
/// orchestrator's runtime stops with that error, which the orchestrator's code sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_agent_sharing_the_in_process_runtime_fails_clearly() {
    let shared = InProcRuntime::new().expect("python");
    let helper = SubAgent::new(
        "helper",
        "Helps.",
        Agent::builder(
            ScriptedModel::new([
                code("shared_note = 'from the helper'\nprint('inner')"),
                Reply::text("ok"),
            ]),
            shared.clone(),
        )
        .build()
        .expect("builds"),
    );
    let mut orchestrator = Agent::builder(
        ScriptedModel::new([
            code("print(helper.run('go'))\nprint(shared_note)"),
            Reply::text("done"),
        ]),
        shared.clone(),
    )
    .sub_agent(helper)
    .build()
    .expect("builds");
    let events: Vec<Event> = tokio::time::timeout(
        Duration::from_secs(60),
        orchestrator.stream("Go.").collect::<Vec<_>>(),
    )
    .await
    .expect("the nested run does not wait on itself");
    let outer = events
        .iter()
        .find_map(|e| match e {
            Event::ExecutionResult { output, .. } => Some(output.as_str()),
            _ => None,
        })
        .expect("the orchestrator's execution");
    assert!(
        outer.contains("RuntimeError: sub-agent 'helper' stopped without an answer")
            && outer.contains("use another runtime"),
        "{outer}"
    );
}

/// The other way round: the orchestrator's code runs in a child process, the sub-agent's in
/// this one; the call crosses the process boundary and the events still arrive nested.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_orchestrator_drives_an_in_process_sub_agent() {
    let helper_runtime = InProcRuntime::new().expect("python");
    let helper = SubAgent::new(
        "helper",
        "Squares numbers.",
        Agent::builder(
            ScriptedModel::new([
                code("squares = [n * n for n in numbers]\nprint(squares)"),
                Reply::text("Squared them."),
            ]),
            helper_runtime.clone(),
        )
        .build()
        .expect("builds"),
    );
    let runtime = KernelRuntime::new().expect("python");
    let mut orchestrator = Agent::builder(
        ScriptedModel::new([
            code("helper.set('numbers', [1, 2, 3])\nprint(helper.run('Square the numbers.'), helper.get('squares'))"),
            Reply::text("Done."),
        ]),
        runtime.clone(),
    )
    .sub_agent(helper)
    .build()
    .expect("builds");
    let events: Vec<Event> = orchestrator.stream("Square 1, 2, 3.").collect().await;
    let output = events
        .iter()
        .find_map(|e| match e {
            Event::ExecutionResult { output, .. } => Some(output.as_str()),
            _ => None,
        })
        .expect("the orchestrator's execution");
    assert_eq!(output, "Squared them. [1, 4, 9]\n");
    assert!(events.iter().any(|e| matches!(e, Event::SubAgent { agent, event } if agent == "helper" && matches!(&**event, Event::Code { .. }))));
    assert_eq!(
        helper_runtime.get("squares").await.expect("bound"),
        Value::List(vec![1.into(), 4.into(), 9.into()])
    );
    runtime.stop().await;
}
