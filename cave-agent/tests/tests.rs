//! Agent runs on the real in-process runtime, with scripted models.

use cave_agent::AgentExt;
use cave_agent::testing::{Reply, ScriptedModel};
use cave_agent::{
    Agent, CancellationToken, Event, InProcRuntime, Message, Resources, Runtime, RuntimeExt,
    StopReason, Value, Variable, prompt,
};
use futures_util::StreamExt;
use std::time::{Duration, Instant};

fn block(code: &str) -> String {
    format!("```python\n{code}\n```")
}

fn results(history: &[Message]) -> Vec<&str> {
    history
        .iter()
        .filter_map(|m| {
            if let Message::ExecutionResult { content, .. } = m {
                Some(content.as_str())
            } else {
                None
            }
        })
        .collect()
}

#[tokio::test]
async fn state_builds_up_across_steps_and_runs() {
    let runtime = InProcRuntime::new().unwrap();
    runtime
        .register(
            Resources::new()
                .variable(Variable::new("total", Value::Int(0)).with_description("running total")),
        )
        .await
        .unwrap();
    let model = ScriptedModel::new([
        Reply::text(block("data = [3, 1, 2]\nprint(len(data))")),
        Reply::text(block("data.sort()\ntotal = sum(data)\ndata")),
        Reply::text("Sorted, and the total is 6."),
        Reply::text(block("total *= 10\ntotal")),
        Reply::text("Now 60."),
    ]);
    let mut agent = Agent::builder(model, runtime.clone()).build().unwrap();
    assert!(
        agent
            .system_prompt()
            .contains("- name: total\n  type: int\n  description: running total")
    );
    let first = agent.run("Sort and sum.").await;
    assert_eq!((first.stop_reason, first.steps), (StopReason::Completed, 3));
    assert_eq!(runtime.retrieve_as::<i64>("total").await.unwrap(), 6);
    let outputs = results(agent.history());
    assert_eq!(
        outputs[..2],
        [
            prompt::execution_output("3\n"),
            prompt::execution_output("[1, 2, 3]\n")
        ]
    );
    let second = agent.run("Scale it.").await;
    assert!(second.completed());
    assert_eq!(runtime.retrieve_as::<i64>("total").await.unwrap(), 60);
}

#[tokio::test]
async fn errors_go_back_to_the_model() {
    let runtime = InProcRuntime::new().unwrap();
    let model = ScriptedModel::new([
        Reply::text(block("values = {'a': 1}\nvalues['b']")),
        Reply::text(block("values.get('b', 0)")),
        Reply::text("There is no b; I used 0."),
    ]);
    let mut agent = Agent::builder(model, runtime).build().unwrap();
    let events: Vec<Event> = agent.stream("Read b.").collect().await;
    let failures: Vec<bool> = events
        .iter()
        .filter_map(|e| {
            if let Event::ExecutionResult { success, .. } = e {
                Some(*success)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(failures, [false, true]);
    let first = results(agent.history())[0];
    assert!(
        first.contains("Traceback (most recent call last):") && first.contains("KeyError: 'b'"),
        "{first}"
    );
}

#[tokio::test]
async fn large_output_is_kept_in_the_runtime_for_the_model() {
    let runtime = InProcRuntime::new().unwrap();
    let model = ScriptedModel::new([
        Reply::text(block("print('x' * 6000)")),
        Reply::text(block("print(len(_output_1), _output_1[:3])")),
        Reply::text("It printed 6001 characters."),
    ]);
    let mut agent = Agent::builder(model, runtime.clone()).build().unwrap();
    let response = agent.run("Print a lot.").await;
    assert!(response.completed());
    let outputs = results(agent.history());
    assert!(outputs[0].contains("`_output_1`") && outputs[0].contains("<persisted-output>"));
    assert_eq!(outputs[1], prompt::execution_output("6001 xxx\n"));
    assert_eq!(
        runtime.get("_output_1").await.unwrap(),
        Value::Str("x".repeat(6000) + "\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runaway_loop_is_stopped_at_the_time_limit() {
    let runtime = InProcRuntime::new().unwrap();
    let model = ScriptedModel::new([
        Reply::text(block("kept = 'yes'\nwhile True:\n    pass")),
        Reply::text(block("print(kept)")),
        Reply::text("Done."),
    ]);
    let mut agent = Agent::builder(model, runtime)
        .max_exec_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    assert!(agent.system_prompt().contains("stopped after 0.3 seconds"));
    let started = Instant::now();
    let events: Vec<Event> = agent.stream("Loop.").collect().await;
    assert!(events.contains(&Event::ExecutionTimeout {
        timeout: 0.3,
        state_lost: false
    }));
    let outputs = results(agent.history());
    assert_eq!(
        outputs[0],
        prompt::execution_timeout(0.3),
        "stopped, not pending"
    );
    assert_eq!(
        outputs[1],
        prompt::execution_output("yes\n"),
        "state survives the interrupt"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the loop was preempted ({:?})",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_printing_loop_is_stopped_in_process() {
    cave_agent::testing::contract::time_limits_stop_a_printing_loop(InProcRuntime::new().unwrap())
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_printing_loop_is_stopped_in_a_kernel() {
    cave_agent::testing::contract::time_limits_stop_a_printing_loop(
        cave_agent::KernelRuntime::new().unwrap(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_call_is_reported_as_still_running() {
    let runtime = InProcRuntime::new().unwrap();
    let model = ScriptedModel::new([
        Reply::text(block("import time\ntime.sleep(3)")),
        Reply::text("I will wait."),
    ]);
    let mut agent = Agent::builder(model, runtime.clone())
        .max_exec_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let response = agent.run("Sleep.").await;
    assert!(response.completed());
    let outputs = results(agent.history());
    assert!(
        outputs[0].contains(prompt::INTERRUPT_PENDING_NOTICE),
        "{}",
        outputs[0]
    );
    // Once the call returns, the interrupt lands and the runtime serves the next cell.
    let out = runtime
        .execute("print('after')", &cave_agent::DiscardOutput)
        .await
        .unwrap();
    assert_eq!(out.output, "after\n");
}

/// A host function whose future never finishes: the time limit drops the call, the model is told
/// the cell was stopped (not that a call cannot be interrupted), and the next cell runs at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_call_that_never_returns_is_stopped_at_the_time_limit() {
    use cave_agent::{Function, Signature};
    let runtime = InProcRuntime::new().unwrap();
    let hang = Function::host(
        "hang",
        Signature::default(),
        |_args: cave_agent::Args| async move {
            std::future::pending::<()>().await;
            Ok(Value::None)
        },
    );
    runtime
        .register(Resources::new().function(hang))
        .await
        .unwrap();
    let model = ScriptedModel::new([
        Reply::text(block("hang()")),
        Reply::text(block("print('next')")),
        Reply::text("Done."),
    ]);
    let mut agent = Agent::builder(model, runtime.clone())
        .max_exec_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(60), agent.run("Call it."))
        .await
        .expect("the run was not wedged by the call");
    assert!(response.completed(), "{:?}", response.stop_reason);
    let outputs = results(agent.history());
    assert_eq!(outputs.len(), 2, "{outputs:?}");
    assert!(
        outputs[0].starts_with(&prompt::execution_timeout(0.3)),
        "{}",
        outputs[0]
    );
    assert!(
        !outputs[0].contains(prompt::INTERRUPT_PENDING_NOTICE),
        "{}",
        outputs[0]
    );
    assert_eq!(outputs[1], prompt::execution_output("next\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_stops_the_cell_and_the_next_run_works() {
    let runtime = InProcRuntime::new().unwrap();
    let model = ScriptedModel::new([
        Reply::text(block("while True:\n    pass")),
        Reply::text(block("print('fresh')")),
        Reply::text("ok"),
    ]);
    let mut agent = Agent::builder(model, runtime).build().unwrap();
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        trigger.cancel();
    });
    let response = agent.run_until("Spin.", cancel).await;
    assert_eq!(response.stop_reason, StopReason::Cancelled);
    assert_eq!(
        results(agent.history()).last().copied(),
        Some(prompt::EXECUTION_CANCELLED)
    );
    let next = agent.run("Again.").await;
    assert!(next.completed(), "{next:?}");
    assert_eq!(
        results(agent.history()).last().copied(),
        Some(prompt::execution_output("fresh\n").as_str())
    );
}

/// An agent compacts by default; `NoCompaction` keeps every message.
#[tokio::test]
async fn an_agent_compacts_by_default() {
    // A resumed history larger than the default window allows (about 150 000 tokens of
    // varied text in 30 old results): the first step clears the old results.
    let mut history = vec![Message::system("sys"), Message::user("Analyse.")];
    for i in 0..30 {
        history.push(Message::code(block(&format!("step_{i} = {i}"))));
        let text: String = (0..4_000).map(|w| format!("w{w}x{i} ")).collect();
        history.push(Message::execution_result(text));
    }
    let model = || ScriptedModel::new([Reply::text("Done.")]);
    let runtime = InProcRuntime::new().unwrap();

    let mut plain = Agent::builder(model(), runtime.clone())
        .history(history.clone())
        .compactor(cave_agent::NoCompaction)
        .build()
        .unwrap();
    plain.run("go on").await;
    assert!(
        !results(plain.history()).contains(&prompt::CLEARED_RESULT),
        "NoCompaction keeps every result"
    );

    let mut batteries = Agent::builder(model(), runtime)
        .history(history)
        .build()
        .unwrap();
    let response = batteries.run("go on").await;
    assert_eq!(response.stop_reason, StopReason::Completed);
    let cleared = results(batteries.history())
        .iter()
        .filter(|r| **r == prompt::CLEARED_RESULT)
        .count();
    assert!(cleared >= 20, "old results were cleared: {cleared}");
}

/// Skills end to end on the real runtime: the prompt lists them (and only when there are
/// some); the model activates one, uses what it says, reads a file, and answers.
#[tokio::test]
async fn a_skill_is_activated_used_and_answered_from() {
    use cave_agent::skills::{SkillSet, discover};
    let dir = std::env::temp_dir().join(format!("cave-agent-skills-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("inches/references")).unwrap();
    std::fs::write(
        dir.join("inches/SKILL.md"),
        "---\nname: inches\ndescription: Converts centimetres to inches. Use for any length in cm.\n---\nDivide by the factor in references/factor.txt.\n",
    )
    .unwrap();
    std::fs::write(dir.join("inches/references/factor.txt"), "2.54").unwrap();
    let skills = SkillSet::from_discovery(discover(&dir)).unwrap();

    let model = std::sync::Arc::new(ScriptedModel::new([
        Reply::text(block("print(activate_skill('inches'))")),
        Reply::text(block(
            "factor = float(read_skill_file('inches', 'references/factor.txt'))\nprint(round(127 / factor, 1))",
        )),
        Reply::text("127 cm is 50.0 inches."),
    ]));
    let runtime = InProcRuntime::new().unwrap();
    let mut builder = Agent::builder(model.clone(), runtime.clone());
    skills.install(&runtime, &mut builder).await.unwrap();
    let mut agent = builder.build().unwrap();
    let prompt = agent.system_prompt();
    assert!(prompt.contains("<skills>\n- inches: Converts centimetres to inches. Use for any length in cm.\n</skills>"), "{prompt}");
    assert!(
        prompt.contains("activate_skill(\"name\")"),
        "the instructions say how"
    );
    assert!(
        prompt.contains("- function: activate_skill(name: str) -> str"),
        "{prompt}"
    );
    let response = agent.run("How many inches is 127 cm?").await;
    assert_eq!(response.stop_reason, StopReason::Completed);
    let outputs = results(agent.history());
    assert!(
        outputs[0].contains("Divide by the factor in references/factor.txt."),
        "{outputs:?}"
    );
    assert!(
        outputs[0].contains("- references/factor.txt"),
        "{outputs:?}"
    );
    assert!(outputs[1].contains("50.0"), "{outputs:?}");
    assert_eq!(response.content, "127 cm is 50.0 inches.");

    // Without skills: no listing, no instructions about them, no functions.
    let plain = Agent::builder(ScriptedModel::new([]), InProcRuntime::new().unwrap())
        .build()
        .unwrap()
        .system_prompt();
    assert!(plain.contains("<skills>\nNo skills available\n</skills>"));
    assert!(!plain.contains("activate_skill"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The CaveAgent-style example skill (`examples/skills/order-desk`, with an `injection.py`
/// using `from __future__ import annotations`), on both runtimes: its objects are in the
/// session but not in the prompt until the skill is activated; they survive a reset, and on
/// the kernel runtime a crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_skill_injects_on_both_runtimes() {
    use cave_agent::KernelRuntime;
    use cave_agent::skills::{SkillSet, discover};
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/skills");
    let skills = SkillSet::from_discovery(discover(path)).unwrap();
    let runtimes: Vec<(&str, std::sync::Arc<dyn Runtime>)> = vec![
        ("inproc", std::sync::Arc::new(InProcRuntime::new().unwrap())),
        ("kernel", std::sync::Arc::new(KernelRuntime::new().unwrap())),
    ];
    for (kind, runtime) in runtimes {
        let model = std::sync::Arc::new(ScriptedModel::new([
            Reply::text(block("print(activate_skill('order-desk'))")),
            Reply::text(block("print(total(pending), type(pending[0]).__name__)")),
            Reply::text("The pending orders are worth 989.70 EUR."),
        ]));
        let mut builder = Agent::builder(model.clone(), runtime.clone());
        skills
            .install(runtime.as_ref(), &mut builder)
            .await
            .unwrap();
        let mut agent = builder.build().unwrap();
        let prompt = agent.system_prompt();
        assert!(
            prompt.contains("- order-desk: Works with pending customer orders"),
            "{kind}"
        );
        assert!(
            !prompt.contains("total(") && !prompt.contains("name: pending"),
            "{kind}: hidden until activated\n{prompt}"
        );
        let response = agent.run("What are the pending orders worth?").await;
        assert_eq!(response.stop_reason, StopReason::Completed, "{kind}");
        let outputs = results(agent.history());
        assert!(
            outputs[0].contains("total(orders: list[Order]) -> int"),
            "{kind}: {}",
            outputs[0]
        );
        assert!(
            outputs[0].contains("name: pending"),
            "{kind}: {}",
            outputs[0]
        );
        assert!(
            outputs[0].contains("- references/shipping.md"),
            "{kind}: {}",
            outputs[0]
        );
        assert!(outputs[1].contains("98970 Order"), "{kind}: {outputs:?}");
        runtime.reset().await.unwrap();
        let after = runtime
            .execute("total(pending)", &cave_agent::DiscardOutput)
            .await
            .unwrap();
        assert_eq!(after.output, "98970\n", "{kind}: survives reset");
        if kind == "kernel" {
            runtime
                .execute("import os\nos._exit(1)", &cave_agent::DiscardOutput)
                .await
                .unwrap();
            let after = runtime
                .execute("total(pending)", &cave_agent::DiscardOutput)
                .await
                .unwrap();
            assert_eq!(after.output, "98970\n", "survives a new process");
        }
    }
}

/// A skill built in code gives the runtime resources, hidden until activation; a skill whose
/// export takes a registered name fails the install and binds nothing of it.
#[tokio::test]
async fn skills_in_code_and_collisions() {
    use cave_agent::skills::{Skill, SkillSet};
    use cave_agent::{Function, Signature};
    let double = Function::host(
        "double",
        Signature::default(),
        |args: cave_agent::Args| async move {
            let _ = args;
            Ok(Value::Int(2))
        },
    );
    let mut skills = SkillSet::new();
    skills
        .add(
            Skill::new("twice", "Doubles things.", "Call double().")
                .with_resources(Resources::new().function(double)),
        )
        .unwrap();
    let runtime = InProcRuntime::new().unwrap();
    let mut builder = Agent::builder(ScriptedModel::new([]), runtime.clone());
    skills.install(&runtime, &mut builder).await.unwrap();
    let agent = builder.build().unwrap();
    assert!(
        !agent.system_prompt().contains("double"),
        "hidden until activated"
    );
    let out = runtime
        .execute(
            "double(), activate_skill('twice')",
            &cave_agent::DiscardOutput,
        )
        .await
        .unwrap();
    assert!(
        out.output
            .starts_with("(2, 'Call double().\\n\\nThis skill put these in your Python session"),
        "{}",
        out.output
    );
    assert!(
        out.output.contains("- function: double()"),
        "{}",
        out.output
    );

    // The export `total` collides with a registered variable: the install fails, naming the
    // skill, and nothing of the skill's file is bound.
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/skills");
    let skills = SkillSet::from_discovery(cave_agent::skills::discover(path)).unwrap();
    let runtime = InProcRuntime::new().unwrap();
    runtime
        .register(Resources::new().variable(Variable::new("total", Value::Int(0))))
        .await
        .unwrap();
    let mut builder = Agent::builder(ScriptedModel::new([]), runtime.clone());
    let err = skills.install(&runtime, &mut builder).await.unwrap_err();
    assert!(
        err.to_string().contains("skill `order-desk`") && err.to_string().contains("total"),
        "{err}"
    );
    let bound = runtime
        .execute(
            "'pending' in globals(), 'Order' in globals()",
            &cave_agent::DiscardOutput,
        )
        .await
        .unwrap();
    assert_eq!(bound.output, "(False, False)\n");
}

/// A broken `injection.py` stops the install with Python's own error, naming the skill.
#[tokio::test]
async fn a_broken_injection_says_what_python_said() {
    use cave_agent::skills::{SkillSet, discover};
    let dir = std::env::temp_dir().join(format!("cave-agent-broken-skill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("broken")).unwrap();
    std::fs::write(
        dir.join("broken/SKILL.md"),
        "---\nname: broken\ndescription: Broken.\n---\nx\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("broken/injection.py"),
        "import no_such_module_here\n",
    )
    .unwrap();
    let skills = SkillSet::from_discovery(discover(&dir)).unwrap();
    let runtime = InProcRuntime::new().unwrap();
    let mut builder = Agent::builder(ScriptedModel::new([]), runtime.clone());
    let err = skills
        .install(&runtime, &mut builder)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("skill `broken`") && err.contains("No module named 'no_such_module_here'"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A provider that reports a transient failure mid-answer (an error event in the stream) is
/// asked again from the start: the half answer is neither continued nor spliced into the next,
/// and the provider's message is in the backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_reported_mid_answer_is_asked_again_from_the_start() {
    use cave_agent::{ModelError, ModelErrorKind};
    let overloaded = ModelError::new(
        ModelErrorKind::Transient {
            retry_after: Some(Duration::from_millis(10)),
        },
        "the provider failed mid-stream: Overloaded",
    );
    let model = ScriptedModel::new([
        Reply::text("Let me compute.\n```pytho").then_error(overloaded),
        Reply::text(block("print(6 * 7)")),
        Reply::text("The answer is 42."),
    ]);
    let mut agent = Agent::builder(model, InProcRuntime::new().unwrap())
        .build()
        .unwrap();
    let events: Vec<Event> = agent.stream("Compute.").collect().await;
    assert!(
        events.iter().any(|e| matches!(
            e,
            Event::Backoff { reason: Some(reason), .. } if reason.contains("Overloaded")
        )),
        "{events:?}"
    );
    let codes: Vec<&str> = agent
        .history()
        .iter()
        .filter_map(|m| match m {
            Message::Code { content, .. } => Some(content.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(codes, [block("print(6 * 7)")]);
    assert!(
        !agent
            .history()
            .iter()
            .any(|m| m.to_chat().content.contains("```pytho\n")
                || m.to_chat().content.contains("pytho```")),
        "nothing of the failed answer is kept"
    );
    assert_eq!(results(agent.history()), [prompt::execution_output("42\n")]);
    assert!(matches!(
        events.last(),
        Some(Event::Stopped {
            stop_reason: StopReason::Completed,
            ..
        })
    ));
}

/// A failure the provider reports mid-answer that is not worth retrying ends the run with the
/// provider's message, and the half answer is not the run's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_answer_ends_the_run_without_its_half() {
    use cave_agent::{ModelError, ModelErrorKind};
    let filtered = ModelError::new(
        ModelErrorKind::ContentFiltered,
        "the provider failed mid-stream: content_filter",
    );
    let model = ScriptedModel::new([Reply::text("Here is half").then_error(filtered)]);
    let mut agent = Agent::builder(model, InProcRuntime::new().unwrap())
        .build()
        .unwrap();
    let response = agent.run("Go.").await;
    assert!(!response.completed());
    assert_eq!(response.stop_reason, StopReason::ModelError);
    assert!(
        !response.content.contains("Here is half"),
        "{}",
        response.content
    );
    let error = response.error.expect("the provider's error");
    assert!(error.to_string().contains("content_filter"), "{error}");
    assert!(
        !agent
            .history()
            .iter()
            .any(|m| m.to_chat().content.contains("Here is half"))
    );
}

/// What a cell shows reaches the host and the model: a `display` event per item with the files
/// its rich forms were written to, the items in the response, and for the model the text form
/// in the output and a line per item naming its forms and files.
#[tokio::test]
async fn shown_items_reach_the_events_the_files_and_the_model() {
    let dir = std::env::temp_dir().join(format!("cave-agent-display-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let code = "class Chart:\n    def _repr_png_(self):\n        return b'\\x89PNG\\r\\n\\x1a\\n\\x00\\x00\\x00\\rIHDR\\x00\\x00\\x02\\x80\\x00\\x00\\x01\\xe0'\n    def _repr_html_(self): return '<table><tr><td>7</td></tr></table>'\n    def __repr__(self): return 'Chart()'\nprint('made it')\ndisplay(Chart())";
    let model = std::sync::Arc::new(ScriptedModel::new([
        Reply::text(block(code)),
        Reply::text("The chart is saved."),
    ]));
    let mut builder = Agent::builder(model.clone(), InProcRuntime::new().unwrap());
    builder.display_dir(&dir);
    let mut agent = builder.build().unwrap();
    let events: Vec<Event> = agent.stream("Chart it.").collect().await;
    let (mime_types, text, files) = events
        .iter()
        .find_map(|e| match e {
            Event::Display {
                mime_types,
                text,
                files,
                ..
            } => Some((mime_types.clone(), text.clone(), files.clone())),
            _ => None,
        })
        .expect("a display event");
    assert_eq!(mime_types, ["text/html", "image/png", "text/plain"]);
    assert_eq!(text, "Chart()");
    let png = std::path::PathBuf::from(&files["image/png"]);
    assert_eq!(png, dir.join("display-1.png"));
    assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG"));
    assert_eq!(
        std::fs::read_to_string(dir.join("display-1.html")).unwrap(),
        "<table><tr><td>7</td></tr></table>"
    );
    // The model's next request: the text form in place, then a line for the item.
    let requests = model.requests();
    let sent = &requests[1].messages.last().unwrap().content;
    assert!(sent.contains("made it\nChart()\n"), "{sent}");
    assert!(
        sent.contains(
            "[text/html saved as display-1.html; image/png 640×480 saved as display-1.png]"
        ),
        "{sent}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Without a display directory nothing is written, and the model still reads what was shown.
#[tokio::test]
async fn without_a_display_directory_items_are_in_the_response_only() {
    let model = std::sync::Arc::new(ScriptedModel::new([
        Reply::text(block(
            "display({'text/plain': 'tab', 'text/html': '<table></table>'}, raw=True)",
        )),
        Reply::text("Done."),
    ]));
    let mut agent = Agent::builder(model.clone(), InProcRuntime::new().unwrap())
        .build()
        .unwrap();
    let response = agent.run("Show it.").await;
    assert_eq!(response.displays.len(), 1);
    assert_eq!(
        response.displays[0].mime_types(),
        ["text/plain", "text/html"]
    );
    let requests = model.requests();
    let sent = &requests[1].messages.last().unwrap().content;
    assert!(
        sent.contains("tab\n") && sent.contains("[text/html]"),
        "{sent}"
    );
}

/// With vision, the images a cell shows go with its result as image parts, within the budget;
/// the rest are named; compaction clears an old result's images with its text.
#[tokio::test]
async fn with_vision_shown_images_go_to_the_model_within_a_budget() {
    // A 640×480 PNG header costs 425 tokens at high detail: two fit in 900, the third not.
    let png =
        "b'\\x89PNG\\r\\n\\x1a\\n\\x00\\x00\\x00\\rIHDR\\x00\\x00\\x02\\x80\\x00\\x00\\x01\\xe0'";
    let code = format!(
        "class Chart:\n    def _repr_png_(self): return {png}\nfor _ in range(3):\n    display(Chart())"
    );
    let model = std::sync::Arc::new(ScriptedModel::new([
        Reply::text(block(&code)),
        Reply::text("Three charts."),
    ]));
    let mut builder = Agent::builder(model.clone(), InProcRuntime::new().unwrap());
    builder.max_image_tokens(900);
    let mut agent = builder.build().unwrap();
    let response = agent.run("Chart it three times.").await;
    assert_eq!(response.displays.len(), 3);
    let requests = model.requests();
    let result = requests[1].messages.last().unwrap();
    assert_eq!(result.images.len(), 2, "{:?}", result.images);
    assert_eq!(
        (result.images[0].width, result.images[0].height),
        (640, 480)
    );
    assert!(
        result.images[0]
            .data_url()
            .starts_with("data:image/png;base64,iVBORw0KGgo")
    );
    assert!(
        result
            .content
            .contains("[1 more image not sent to you: over the 900 tokens"),
        "{}",
        result.content
    );
    // Without vision, nothing but text.
    let model = std::sync::Arc::new(ScriptedModel::new([
        Reply::text(block(&code)),
        Reply::text("Three charts."),
    ]));
    let mut agent = Agent::builder(model.clone(), InProcRuntime::new().unwrap())
        .build()
        .unwrap();
    agent.run("Chart it.").await;
    assert!(
        model.requests()[1]
            .messages
            .iter()
            .all(|m| m.images.is_empty())
    );
}

/// A cell that runs until it is interrupted.
const SPIN: &str = "while True:\n    pass";

/// The owned form: the agent in its own task, events read elsewhere, cancelled from a token,
/// and the agent back with a valid history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawned_run_streams_cancels_and_gives_the_agent_back() {
    let model = ScriptedModel::new([Reply::text(block(SPIN)), Reply::text("never")]);
    let agent = Agent::builder(model, InProcRuntime::new().unwrap())
        .build()
        .unwrap();
    let mut run = agent.spawn("go");
    let stop = run.cancel_token();
    // A "UI" task reads the events and presses stop when code starts.
    let reader = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some(event) = run.next().await {
            if matches!(event, Event::Code { .. }) {
                stop.cancel();
            }
            seen.push(event);
        }
        (seen, run)
    });
    let (seen, run) = reader.await.unwrap();
    assert!(matches!(seen.first(), Some(Event::UserPrompt { .. })));
    assert!(
        matches!(
            seen.last(),
            Some(Event::Stopped {
                stop_reason: StopReason::Cancelled,
                ..
            })
        ),
        "{seen:?}"
    );
    let agent = run.into_agent().await.expect("the agent comes back");
    let code_at = agent
        .history()
        .iter()
        .position(|m| matches!(m, Message::Code { .. }))
        .unwrap();
    assert!(matches!(
        agent.history()[code_at + 1],
        Message::ExecutionResult { .. }
    ));
    // It can run again.
    let mut again = agent.spawn("and now?");
    let mut last = None;
    while let Some(event) = again.next().await {
        last = Some(event);
    }
    assert!(matches!(last, Some(Event::Stopped { .. })));
}

/// Dropping the handle mid-run stops the run; `into_agent` on a fresh one stops it too.
#[tokio::test]
async fn a_spawned_run_stops_when_its_handle_stops_reading() {
    let model = ScriptedModel::new([Reply::text(block(SPIN))]);
    let agent = Agent::builder(model, InProcRuntime::new().unwrap())
        .build()
        .unwrap();
    let mut run = agent.spawn("go");
    while let Some(event) = run.next().await {
        if matches!(event, Event::Code { .. }) {
            break;
        }
    }
    let agent = run.into_agent().await.unwrap();
    assert!(matches!(
        agent.history().last(),
        Some(Message::ExecutionResult { .. } | Message::User { .. })
    ));
}

/// A forked agent carries the conversation and a copy of the namespace: both go on from the
/// fork on their own. An in-process agent cannot fork, and is told which runtime can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forked_agent_goes_on_from_the_same_state() {
    let model = ScriptedModel::new([
        Reply::text(block("seen = ['start']")),
        Reply::text("Started."),
        Reply::text(block("seen.append('branch')\nprint(seen)")),
        Reply::text("Branched."),
        Reply::text(block("seen.append('main')\nprint(seen)")),
        Reply::text("Main."),
    ]);
    let runtime = cave_agent::KernelRuntime::new().unwrap();
    let mut agent = Agent::builder(model, runtime).build().unwrap();
    assert!(agent.run("Start.").await.completed());
    let mut branch = agent.fork().await.expect("forks");
    assert_eq!(branch.history(), agent.history());
    let out = branch.run("Go on in the branch.").await;
    assert_eq!(
        results(branch.history()).last().copied(),
        Some(prompt::execution_output("['start', 'branch']\n").as_str()),
        "{out:?}"
    );
    assert!(agent.run("Go on here.").await.completed());
    assert_eq!(
        results(agent.history()).last().copied(),
        Some(prompt::execution_output("['start', 'main']\n").as_str())
    );
    assert_eq!(branch.history().len(), agent.history().len());

    let inproc = Agent::builder(ScriptedModel::new([]), InProcRuntime::new().unwrap())
        .build()
        .unwrap();
    let refused = inproc.fork().await.unwrap_err();
    assert!(
        matches!(&refused, cave_agent::RuntimeError::NotSupported { operation: "fork", reason } if reason.contains("kernel runtime")),
        "{refused}"
    );
}
