//! Tool search through the library: an agent whose runtime holds an MCP server of 500 tools
//! (`many_tools_server.py`, on the official Python SDK) lists none of them in its prompt, and
//! its code finds them with `search_tools`, calls them (a structured result's keys are in its
//! doc), and gathers ten slow calls, on both
//! local runtimes and in a Jupyter kernel; `search_tools` finds the tool each query of
//! `tool_queries.jsonl` was written for among its first five answers, nine times in ten.

#[path = "../../cave-runtime-kernel/tests/support/gateway.rs"]
mod gateway;
#[path = "../../cave-mcp/tests/support/scenario.rs"]
mod scenario;
#[path = "../../cave-mcp/tests/support/servers.rs"]
mod servers;

use cave_agent::kernel::JupyterConfig;
use cave_agent::mcp::McpTools;
use cave_agent::testing::{Reply, ScriptedModel};
use cave_agent::{
    Agent, AgentExt, Args, Function, InProcRuntime, KernelRuntime, Message, Param, Resources,
    Runtime, Signature, StopReason, ToolSearch, Value,
};
use std::sync::Arc;

/// The queries, one JSON object a line: `query`, the `tool` it was written for, and its `set`.
const QUERIES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../cave-mcp/tests/support/tool_queries.jsonl"
);

/// What the runs' cells printed, in order.
fn outputs(agent: &Agent) -> Vec<String> {
    agent
        .history()
        .iter()
        .filter_map(|m| match m {
            Message::ExecutionResult { content, .. } => Some(content.clone()),
            _ => None,
        })
        .collect()
}

/// Runs `code` as the model's one step on `runtime`, with the 500 tools; returns the agent
/// and the model (for the requests it was sent).
async fn run_code(
    runtime: impl Runtime + 'static,
    tools: &Arc<McpTools>,
    code: &str,
) -> (Agent, Arc<ScriptedModel>) {
    runtime
        .register(Resources::new().object(tools.binding()))
        .await
        .expect("registers");
    step(runtime, ToolSearch::Auto, code).await
}

/// An agent whose model runs `code`, then answers, with tool search `mode`.
async fn step(
    runtime: impl Runtime + 'static,
    mode: ToolSearch,
    code: &str,
) -> (Agent, Arc<ScriptedModel>) {
    let model = Arc::new(ScriptedModel::new([
        Reply::text(format!("```python\n{code}\n```")),
        Reply::text("Done."),
    ]));
    let mut builder = Agent::builder(model.clone(), runtime);
    builder.tool_search(mode);
    let mut agent = builder.build().expect("builds");
    let response = agent.run("Use the tools.").await;
    assert_eq!(response.stop_reason, StopReason::Completed, "{response:?}");
    (agent, model)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_are_found_and_called_on_every_runtime() {
    let Some(venv) = servers::venv() else { return };
    let tools = scenario::many(&venv).await;
    let code = "print(search_tools('degrees celsius into fahrenheit', limit=1))
print(many.fahrenheit(celsius=37.5))
print(search_tools('weather expected tomorrow in a city', limit=1))
f = many.forecast('Paris')
print(f['celsius'], f['summary'])
import asyncio
print(await asyncio.gather(*(many.slow.aio(i) for i in range(10))))";
    let mut runtimes: Vec<(&str, Box<dyn Runtime>)> = vec![
        (
            "inproc",
            Box::new(InProcRuntime::new().expect("embeds Python")),
        ),
        (
            "kernel",
            Box::new(KernelRuntime::new().expect("a Python interpreter")),
        ),
    ];
    if let Some(gateway) = gateway::gateway() {
        runtimes.push((
            "jupyter",
            Box::new(KernelRuntime::jupyter(
                JupyterConfig::new(gateway.url.clone())
                    .token(gateway.token.clone())
                    .spare(false),
            )),
        ));
    }
    for (name, runtime) in runtimes {
        eprintln!("on {name}");
        let (agent, model) = run_code(runtime, &tools, code).await;
        let out = outputs(&agent).join("\n");
        assert!(
            out.contains("many.fahrenheit(celsius: float) -> float\n    Converts a temperature"),
            "{name}: {out}"
        );
        assert!(
            out.contains("many.forecast(city: str) -> dict\n")
                && out.contains(
                    "Returns a dict: celsius: float, city: str, summary?: Optional[str]."
                ),
            "{name}: {out}"
        );
        assert!(out.contains("99.5\n"), "{name}: {out}");
        // The ledger counts the server's tools apart from the host's own functions.
        let ledger = agent.ledger();
        assert_eq!(
            (
                ledger.mcp_calls.get("many.fahrenheit"),
                ledger.mcp_calls.get("many.forecast"),
                ledger.mcp_calls.get("many.slow"),
            ),
            (Some(&1), Some(&1), Some(&10)),
            "{name}: {ledger:?}"
        );
        assert_eq!(
            ledger.host_calls.get("search_tools"),
            Some(&2),
            "{name}: {ledger:?}"
        );
        // A Jupyter kernel's processor time is the server's to know.
        assert_eq!(
            ledger.cpu_seconds.is_some(),
            name != "jupyter",
            "{name}: {ledger:?}"
        );
        assert!(
            out.contains("18.5 clouds\n[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]"),
            "{name}: {out}"
        );
        let requests = model.requests();
        let system = |i: usize| format!("{:?}", requests[i].messages[0]);
        assert!(
            system(0).contains("search_tools") && !system(0).contains("list_invoice"),
            "{name}: the prompt names the server, not its tools: {}",
            system(0)
        );
        assert_eq!(system(0), system(1), "{name}: the prompt is kept as it was");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paraphrased_queries_find_their_tool() {
    let Some(venv) = servers::venv() else { return };
    let tools = scenario::many(&venv).await;
    let code = format!(
        "import json
hits, total, missed = {{}}, {{}}, []
for line in open({QUERIES:?}):
    q = json.loads(line)
    found = [block.split('(')[0] for block in search_tools(q['query']).split('\\n\\n')]
    total[q['set']] = total.get(q['set'], 0) + 1
    if 'many.' + q['tool'] in found:
        hits[q['set']] = hits.get(q['set'], 0) + 1
    else:
        missed.append(q['query'])
for name in sorted(total):
    print(f'recall {{name}} {{hits.get(name, 0)}}/{{total[name]}}')
print('missed', missed)"
    );
    let runtime = InProcRuntime::new().expect("embeds Python");
    let (agent, _) = run_code(runtime, &tools, &code).await;
    let out = outputs(&agent).join("\n");
    let (mut hits, mut total) = (0, 0);
    for line in out.lines().filter(|l| l.starts_with("recall ")) {
        eprintln!("{line}");
        let (h, t) = line
            .rsplit(' ')
            .next()
            .and_then(|f| f.split_once('/'))
            .expect("hits/total");
        hits += h.parse::<u32>().unwrap();
        total += t.parse::<u32>().unwrap();
    }
    assert!(total >= 100, "at least 100 queries: {out}");
    assert!(
        hits * 10 >= total * 9,
        "top-5 recall under 90 %: {hits}/{total}\n{out}"
    );
}

/// A host function that converts a temperature, documented.
fn converter(name: &str, doc: &str) -> Function {
    Function::host(
        name,
        Signature::new([Param::new("degrees").annotated("float")]).returns("float"),
        |args: Args| async move { Ok(Value::Float(args.get::<f64>("degrees")? + 273.15)) },
    )
    .with_doc(doc)
}

/// An agent on a runtime another agent (gone now) bound `search_tools` in, and an agent on a
/// fork given a function of its own, each search the runtime they run on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_agent_searches_the_runtime_it_runs_on() {
    let runtime = KernelRuntime::new().expect("a Python interpreter");
    runtime
        .register(Resources::new().function(converter(
            "fahrenheit",
            "Converts degrees Celsius to Fahrenheit.",
        )))
        .await
        .expect("registers");
    let search = |query: &str| format!("print(search_tools({query:?}))");
    for _ in 0..2 {
        let (agent, _) = step(runtime.clone(), ToolSearch::Always, &search("fahrenheit")).await;
        let out = outputs(&agent).join("\n");
        assert!(out.contains("fahrenheit(degrees: float) -> float"), "{out}");
    }
    let fork = runtime.fork().await.expect("forks");
    fork.register(
        Resources::new().function(converter("kelvin", "Converts degrees Celsius to Kelvin.")),
    )
    .await
    .expect("registers");
    let (agent, _) = step(fork.clone(), ToolSearch::Always, &search("kelvin")).await;
    let out = outputs(&agent).join("\n");
    assert!(
        out.contains("kelvin(degrees: float) -> float"),
        "the fork's own: {out}"
    );
    let (agent, _) = step(runtime.clone(), ToolSearch::Always, &search("kelvin")).await;
    let out = outputs(&agent).join("\n");
    assert!(!out.contains("kelvin("), "not the parent's: {out}");
}
