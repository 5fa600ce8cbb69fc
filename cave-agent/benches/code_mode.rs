//! Code mode at scale, measured with the MCP server of 500 tools
//! (`cave-mcp/tests/support/many_tools_server.py`, on the official Python SDK): the first
//! request's messages with and without tool search; `search_tools` as the model's code calls
//! it (p50, p95, the host call included) and its top-5 recall on the queries of
//! `tool_queries.jsonl`; ten and fifty calls of a 0.5 s tool gathered in one cell; and the
//! cost of one host call. On the in-process and kernel runtimes, and in a Jupyter kernel behind
//! a local Kernel Gateway. Not a criterion benchmark: percentiles and counts, printed and
//! written as a Markdown table to `target/tmp/code-mode-table.md` for `cargo xtask bench`.
//!
//! Needs the MCP test servers (`CAVE_MCP_TIME` or `target/mcp-venv`) and, for the Jupyter
//! rows, `CAVE_JUPYTER` or `target/jupyter-venv`; `cargo xtask bench` gives both. Without
//! them it says what it skipped.
//!
//! Run with `cargo xtask bench` (or `cargo bench -p cave-agent --bench code_mode --features
//! full`).

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
    Agent, AgentExt, Args, DiscardOutput, Function, InProcRuntime, KernelRuntime, Message,
    Resources, Runtime, Signature, ToolSearch, Value,
};
use serde_json::Value as Json;
use std::fmt::Write as _;
use std::sync::Arc;

/// The queries, one JSON object a line: `query`, the `tool` it was written for, its `set`.
const QUERIES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../cave-mcp/tests/support/tool_queries.jsonl"
);

fn quick() -> bool {
    std::env::args().any(|a| a == "--quick")
}

/// Runs `code` as an agent's one step (so that `search_tools` is bound) with `mode`; returns
/// what the cell printed and the first request's messages as JSON characters.
async fn agent_step(runtime: Arc<dyn Runtime>, mode: ToolSearch, code: &str) -> (String, usize) {
    let model = Arc::new(ScriptedModel::new([
        Reply::text(format!("```python\n{code}\n```")),
        Reply::text("Done."),
    ]));
    let mut builder = Agent::builder(model.clone(), runtime);
    builder.tool_search(mode);
    let mut agent = builder.build().expect("builds");
    let response = agent.run("Use the tools.").await;
    assert!(response.completed(), "{response:?}");
    let printed = agent
        .history()
        .iter()
        .find_map(|m| match m {
            Message::ExecutionResult { content, .. } => Some(content.clone()),
            _ => None,
        })
        .expect("the cell ran");
    let first = serde_json::to_string(&model.requests()[0].messages)
        .expect("JSON")
        .len();
    (printed, first)
}

/// The last line of `printed` that is a JSON object.
fn json_line(printed: &str) -> Json {
    printed
        .lines()
        .rev()
        .find_map(|l| {
            serde_json::from_str::<Json>(l.trim())
                .ok()
                .filter(Json::is_object)
        })
        .unwrap_or_else(|| panic!("no JSON line in {printed}"))
}

fn ms(seconds: f64) -> String {
    format!("{:.2} ms", seconds * 1000.0)
}

/// The search figures on `runtime`: latencies over `rounds` passes of every query, recall
/// per set on the first pass.
fn search_code(rounds: usize) -> String {
    // Given in the cell (a JSON string is a Python literal): a sandboxed worker cannot read
    // the repository.
    let queries = std::fs::read_to_string(QUERIES).expect("the queries");
    let queries = serde_json::to_string(&queries).expect("a JSON string");
    format!(
        "import json, time
queries = [json.loads(line) for line in {queries}.splitlines()]
start = time.perf_counter(); search_tools('warm up'); first = time.perf_counter() - start
times, hits, total = [], {{}}, {{}}
for round in range({rounds}):
    for q in queries:
        start = time.perf_counter()
        found = search_tools(q['query'])
        times.append(time.perf_counter() - start)
        if round == 0:
            total[q['set']] = total.get(q['set'], 0) + 1
            names = [block.split('(')[0] for block in found.split('\\n\\n')]
            hits[q['set']] = hits.get(q['set'], 0) + ('many.' + q['tool'] in names)
times.sort()
print(json.dumps({{'first': first, 'p50': times[len(times) // 2],
    'p95': times[int(len(times) * 0.95)], 'hits': hits, 'total': total}}))"
    )
}

/// Gathers `n` calls of the 0.5 s tool `reps` times, `.aio` and over `asyncio.to_thread`;
/// prints the sorted wall times of each.
fn gather_code(reps: usize) -> String {
    format!(
        "import asyncio, json, time
out = {{}}
for form, n in (('aio', 10), ('to_thread', 10), ('aio', 50)):
    times = []
    for _ in range({reps}):
        start = time.perf_counter()
        if form == 'aio':
            got = await asyncio.gather(*(many.slow.aio(i) for i in range(n)))
        else:
            got = await asyncio.gather(*(asyncio.to_thread(many.slow, i) for i in range(n)))
        times.append(time.perf_counter() - start)
        assert got == list(range(n)), got
    out[f'{{form}} {{n}}'] = sorted(times)
print(json.dumps(out))"
    )
}

/// One host call's cost: `calls` calls of a host function that returns at once, in one cell.
async fn call_cost(runtime: &dyn Runtime, calls: usize) -> f64 {
    let out = runtime
        .execute(
            &format!(
                "import time\nstart = time.perf_counter()\nfor _ in range({calls}):\n    noop()\nprint((time.perf_counter() - start) / {calls})"
            ),
            &DiscardOutput,
        )
        .await
        .expect("runs");
    out.output.trim().parse().expect("a number")
}

fn noop() -> Function {
    Function::host("noop", Signature::default(), |_args: Args| async move {
        Ok(Value::None)
    })
}

/// Every figure on one runtime, as table rows.
async fn figures_on(
    name: &str,
    runtime: Arc<dyn Runtime>,
    tools: &Arc<McpTools>,
    calls: usize,
    table: &mut String,
) {
    runtime
        .register(Resources::new().object(tools.binding()).function(noop()))
        .await
        .expect("registers");
    if name == "in-process" {
        for mode in [ToolSearch::Auto, ToolSearch::Never] {
            let (_, first) = agent_step(runtime.clone(), mode, "pass").await;
            let _ = writeln!(
                table,
                "| — | first request's messages, tool search `{mode}` | {first} characters |"
            );
        }
    }
    let rounds = if quick() { 1 } else { 3 };
    let (printed, _) = agent_step(runtime.clone(), ToolSearch::Auto, &search_code(rounds)).await;
    let search = json_line(&printed);
    let f = |k: &str| search[k].as_f64().unwrap_or(f64::NAN);
    let _ = writeln!(
        table,
        "| {name} | `search_tools` p50 / p95 ({} searches) | {} / {} |",
        rounds
            * search["total"]
                .as_object()
                .map_or(0, |t| t.values().filter_map(Json::as_u64).sum::<u64>()
                    as usize),
        ms(f("p50")),
        ms(f("p95"))
    );
    let _ = writeln!(
        table,
        "| {name} | first `search_tools` (builds the index) | {} |",
        ms(f("first"))
    );
    if name == "in-process" {
        for (set, total) in search["total"].as_object().into_iter().flatten() {
            let hits = search["hits"][set].as_u64().unwrap_or(0);
            let total = total.as_u64().unwrap_or(0);
            let _ = writeln!(
                table,
                "| — | top-5 recall, {set} queries | {hits}/{total} ({:.0} %) |",
                100.0 * hits as f64 / total.max(1) as f64
            );
        }
    }
    let reps = if quick() { 2 } else { 5 };
    let out = runtime
        .execute(&gather_code(reps), &DiscardOutput)
        .await
        .expect("runs");
    assert!(out.success(), "{out:?}");
    let gathered = json_line(&out.output);
    for (label, times) in gathered.as_object().into_iter().flatten() {
        let times: Vec<f64> = times
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Json::as_f64)
            .collect();
        let (form, n) = label.split_once(' ').unwrap_or((label, ""));
        let call = if form == "aio" {
            "`many.slow.aio(i)`"
        } else {
            "`asyncio.to_thread(many.slow, i)`"
        };
        let _ = writeln!(
            table,
            "| {name} | {n} calls of a 0.5 s tool, `gather` of {call}: median / worst of {reps} | {} / {} |",
            ms(times[times.len() / 2]),
            ms(*times.last().unwrap_or(&f64::NAN))
        );
    }
    let cost = call_cost(runtime.as_ref(), calls).await;
    let _ = writeln!(
        table,
        "| {name} | one host call from Python (over {calls}) | {:.1} µs |",
        cost * 1e6
    );
}

fn main() {
    let Some(venv) = servers::venv() else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio");
    let table = rt.block_on(async {
        let tools = scenario::many(&venv).await;
        let mut table = String::from("| runtime | figure | value |\n|---|---|---|\n");
        let inproc: Arc<dyn Runtime> = Arc::new(InProcRuntime::new().expect("embeds Python"));
        figures_on("in-process", inproc, &tools, 2000, &mut table).await;
        let kernel = KernelRuntime::new().expect("a Python interpreter");
        figures_on("kernel", Arc::new(kernel.clone()), &tools, 2000, &mut table).await;
        kernel.stop().await;
        match gateway::gateway() {
            Some(gateway) => {
                let jupyter = KernelRuntime::jupyter(
                    JupyterConfig::new(gateway.url.clone())
                        .token(gateway.token.clone())
                        .spare(false),
                );
                figures_on(
                    "Jupyter",
                    Arc::new(jupyter.clone()),
                    &tools,
                    200,
                    &mut table,
                )
                .await;
                jupyter.stop().await;
            }
            None => table.push_str("| Jupyter | skipped: no Kernel Gateway | — |\n"),
        }
        table
    });
    println!("{table}");
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/tmp");
    let _ = std::fs::create_dir_all(dir);
    std::fs::write(format!("{dir}/code-mode-table.md"), table).expect("writes the table");
}
