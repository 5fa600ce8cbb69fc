//! The ledger against runs whose costs are known (scripted usage and cost, a cell that burns a
//! known processor time, a known number of host calls), and each budget stopping a run, on
//! the in-process runtime and on the kernel runtime.

use cave_agent::testing::{Reply, ScriptedModel};
use cave_agent::{
    Agent, AgentExt, Args, Event, Function, InProcRuntime, KernelRuntime, Ledger, Param, Price,
    Resources, Runtime, RuntimeExt, Signature, StopErrorKind, StopReason, Usage, Value,
};
use futures_util::StreamExt;
use std::sync::Arc;
use std::time::Duration;

/// The two local runtimes, each with `add(a, b)`.
async fn runtimes() -> Vec<(&'static str, Arc<dyn Runtime>)> {
    let runtimes: Vec<(&'static str, Arc<dyn Runtime>)> = vec![
        (
            "inproc",
            Arc::new(InProcRuntime::new().expect("embeds Python")),
        ),
        (
            "kernel",
            Arc::new(KernelRuntime::new().expect("a Python interpreter")),
        ),
    ];
    for (_, runtime) in &runtimes {
        runtime
            .register(Resources::new().function(add()))
            .await
            .expect("registers add");
    }
    runtimes
}

fn add() -> Function {
    Function::host(
        "add",
        Signature::new([
            Param::new("a").annotated("int"),
            Param::new("b").annotated("int"),
        ])
        .returns("int"),
        |args: Args| async move { Ok(Value::Int(args.get::<i128>("a")? + args.get::<i128>("b")?)) },
    )
}

fn code(code: &str) -> Reply {
    Reply::text(format!("```python\n{code}\n```"))
}

/// A cell that keeps the processor busy for `seconds` of its thread's time (the process's
/// would count the test's other threads in-process).
fn burn(seconds: f64) -> String {
    format!(
        "import time\nt = time.thread_time()\nwhile time.thread_time() - t < {seconds}:\n    pass\nprint('burnt')"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_figure_of_the_ledger_is_what_the_run_cost() {
    for (name, runtime) in runtimes().await {
        let model = ScriptedModel::new([
            code("print(add(1, 2), add(3, 4), add(5, 6))")
                .usage(Usage::new(1000, 200).with_cached(600).with_reasoning(50)),
            code(&burn(0.4)).usage(Usage::new(1500, 100)).cost(0.25),
            Reply::text("Done.").usage(Usage::new(2000, 10)),
        ]);
        let mut builder = Agent::builder(model, runtime.clone());
        builder.price(
            Price::per_million(2.0, 10.0)
                .and_then(|p| p.with_cached_input(0.5))
                .expect("a price"),
        );
        let mut agent = builder.build().expect("builds");
        let response = agent.run("Add, then burn.").await;
        assert_eq!(
            response.stop_reason,
            StopReason::Completed,
            "{name}: {response:?}"
        );
        let ledger = &response.ledger;
        assert_eq!(ledger, agent.ledger(), "{name}");
        assert_eq!(
            (
                ledger.tokens.prompt_tokens,
                ledger.tokens.completion_tokens,
                ledger.tokens.cached_tokens,
                ledger.tokens.reasoning_tokens,
            ),
            (4500, 310, 600, 50),
            "{name}"
        );
        assert_eq!(ledger.model_calls, 3, "{name}");
        // Computed: the first call (400 at 2, 600 cached at 0.5, 200 at 10) and the last
        // (2000 at 2, 10 at 10); reported: the second.
        let computed =
            (400.0 * 2.0 + 600.0 * 0.5 + 200.0 * 10.0 + 2000.0 * 2.0 + 10.0 * 10.0) / 1e6;
        assert!(
            (ledger.cost.computed - computed).abs() < 1e-12,
            "{name}: {ledger:?}"
        );
        assert_eq!(ledger.cost.reported, 0.25, "{name}");
        assert!(
            (ledger.cost.usd - (0.25 + computed)).abs() < 1e-12,
            "{name}"
        );
        assert_eq!(ledger.cost.unpriced_calls, 0, "{name}");
        assert_eq!(ledger.cells, 2, "{name}");
        assert!(ledger.cell_seconds >= 0.4, "{name}: {ledger:?}");
        let cpu = ledger.cpu_seconds.expect("measured");
        // The burn's 0.4 s, and what the interpreter does around it (a kernel worker's start
        // included): generous above, exact below.
        assert!(
            (0.4..3.0).contains(&cpu),
            "{name}: {cpu} s of processor time"
        );
        assert!(
            ledger.peak_memory.is_some_and(|p| p > 5 << 20),
            "{name}: {ledger:?}"
        );
        assert_eq!(ledger.host_calls.get("add"), Some(&3), "{name}: {ledger:?}");
        assert!(ledger.mcp_calls.is_empty(), "{name}");
        // The stopped event carries the same account.
        let events: Vec<Event> = agent.stream("Again.").collect().await;
        let Some(Event::Stopped { ledger: said, .. }) = events.last() else {
            panic!("{name}: no stopped event");
        };
        assert_eq!(said.model_calls, ledger.model_calls + 1, "{name}: {said:?}");
        assert_eq!(said.cells, 2, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_calls_past_the_budget_raise_and_stop_the_run() {
    for (name, runtime) in runtimes().await {
        let model = ScriptedModel::new([
            code(
                "total = 0\nfor i in range(5):\n    try:\n        total = add(total, i)\n    except PermissionError as e:\n        print('refused:', e)\n        break\nprint(total)",
            ),
            code("print('never runs')"),
        ]);
        let mut builder = Agent::builder(model, runtime.clone());
        builder.max_host_calls(3);
        let mut agent = builder.build().expect("builds");
        let response = agent.run("Add.").await;
        assert_eq!(
            response.stop_reason,
            StopReason::BudgetExhausted,
            "{name}: {response:?}"
        );
        let error = response.error.expect("says which budget");
        assert_eq!(error.kind, StopErrorKind::MaxHostCalls, "{name}");
        assert!(error.message.contains("3 host calls"), "{name}: {error}");
        assert_eq!(response.ledger.host_calls.get("add"), Some(&3), "{name}");
        assert_eq!(response.ledger.refused_host_calls, 1, "{name}");
        assert_eq!(
            response.code_snippets.len(),
            1,
            "{name}: the second cell never ran"
        );
        let out = agent
            .history()
            .iter()
            .map(|m| format!("{m:?}"))
            .collect::<String>();
        assert!(
            out.contains(
                "refused: the session's budget of 3 host calls is spent: add was not called"
            ),
            "{name}: {out}"
        );
        assert_eq!(
            runtime.get_as::<i64>("total").await.expect("bound"),
            3,
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_is_stopped_when_the_processor_budget_runs_out() {
    for (name, runtime) in runtimes().await {
        let model = ScriptedModel::new([
            code("x = 1\nwhile True:\n    x += 1"),
            code("print('never runs')"),
        ]);
        let mut builder = Agent::builder(model, runtime.clone());
        builder.max_cpu_time(Duration::from_millis(500));
        let mut agent = builder.build().expect("builds");
        let response = agent.run("Spin.").await;
        assert_eq!(
            response.stop_reason,
            StopReason::BudgetExhausted,
            "{name}: {response:?}"
        );
        let error = response.error.expect("says which budget");
        assert_eq!(error.kind, StopErrorKind::MaxCpuTime, "{name}");
        let cpu = response.ledger.cpu_seconds.expect("measured");
        assert!((0.5..3.0).contains(&cpu), "{name}: {cpu}");
        assert_eq!(response.code_snippets.len(), 1, "{name}");
        // The runtime goes on: the loop was interrupted, not the runtime ended.
        assert!(
            runtime.get_as::<i64>("x").await.expect("bound") > 1,
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cost_budget_stops_the_run_before_its_next_step() {
    for (name, runtime) in runtimes().await {
        let model = ScriptedModel::new([
            code("print(1)").cost(0.30),
            code("print(2)").cost(0.30),
            code("print(3)"),
        ]);
        let mut builder = Agent::builder(model, runtime.clone());
        builder.max_cost(0.5);
        let mut agent = builder.build().expect("builds");
        let response = agent.run("Count.").await;
        assert_eq!(
            response.stop_reason,
            StopReason::BudgetExhausted,
            "{name}: {response:?}"
        );
        let error = response.error.expect("says which budget");
        assert_eq!(error.kind, StopErrorKind::MaxCost, "{name}");
        assert_eq!(
            error.message, "the cost budget of $0.50 is spent ($0.60 used)",
            "{name}"
        );
        // A call's cost is known once its answer has ended, after its block: the second cell
        // ran, and no third step was asked for.
        assert_eq!(response.steps, 2, "{name}");
        assert_eq!(response.ledger.cells, 2, "{name}: {:?}", response.ledger);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_goes_on_from_the_ledger_it_is_given() {
    let runtime = InProcRuntime::new().expect("embeds Python");
    runtime
        .register(Resources::new().function(add()))
        .await
        .expect("registers");
    let mut earlier = Ledger::new();
    earlier.charge_call(Usage::new(100, 10), Some(0.4), None);
    earlier.count_call("add", false, 2);
    earlier.cells = 4;
    earlier.model_calls = 1;
    // Through JSON, as a session file keeps it.
    let earlier: Ledger = serde_json::from_str(&serde_json::to_string(&earlier).unwrap()).unwrap();
    let model = ScriptedModel::new([
        code("print(add(1, 1))").cost(0.05),
        Reply::text("2"),
        code("print(add(2, 2))"),
        code("print('never runs')"),
    ]);
    let mut builder = Agent::builder(model, runtime);
    builder.ledger(earlier).max_cost(0.5).max_host_calls(3);
    let mut agent = builder.build().expect("builds");
    let response = agent.run("Add.").await;
    assert_eq!(response.stop_reason, StopReason::Completed, "{response:?}");
    let ledger = agent.ledger();
    assert_eq!(ledger.cells, 5);
    assert_eq!(ledger.host_calls.get("add"), Some(&3));
    assert!((ledger.cost.usd - 0.45).abs() < 1e-12, "{ledger:?}");
    assert_eq!(ledger.model_calls, 3);
    // The three calls are made: the next one is refused, and the run stops.
    let response = agent.run("Again.").await;
    assert_eq!(response.stop_reason, StopReason::BudgetExhausted);
    assert_eq!(response.steps, 1);
    assert_eq!(response.ledger.refused_host_calls, 1);
    assert_eq!(
        response.error.map(|e| e.kind),
        Some(StopErrorKind::MaxHostCalls)
    );
}

#[test]
fn a_budget_that_is_not_a_number_is_refused_at_build() {
    let runtime = InProcRuntime::new().expect("embeds Python");
    let mut builder = Agent::builder(ScriptedModel::new([]), runtime);
    builder.max_cost(f64::NAN);
    let error = builder.build().expect_err("refused");
    assert_eq!(
        error.to_string(),
        "max_cost must be a number of zero or more, not NaN"
    );
}

/// A call whose cost is known before its cell runs (the answer ended inside its block, so the
/// usage came first) and spends the budget: the cell is refused, unasked and unrun.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_a_spent_budget_would_start_is_refused() {
    let runtime = Arc::new(InProcRuntime::new().expect("embeds Python"));
    let model = ScriptedModel::new([Reply::text("```python\nran = 1\n").cost(0.6)]);
    let mut builder = Agent::builder(model, runtime.clone());
    builder.max_cost(0.5);
    let mut agent = builder.build().expect("builds");
    let events: Vec<Event> = agent.stream("Run it.").collect().await;
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::ExecutionRefused { reason: Some(r) }
            if r.contains("cost budget of $0.50 is spent"))),
        "{events:?}"
    );
    let Some(Event::Stopped { error, ledger, .. }) = events.last() else {
        panic!("no stopped event");
    };
    assert_eq!(error.as_ref().map(|e| e.kind), Some(StopErrorKind::MaxCost));
    assert_eq!(ledger.cells, 0);
    assert!(
        !runtime.is_bound("ran").await.expect("asks"),
        "the cell ran"
    );
}
