"""The measurements of `cargo xtask bench`, taken through CaveAgent (the Python peer).

Run by `cargo xtask bench --compare-python` with an interpreter that can import `cave_agent`
(Python >= 3.12). Prints one JSON object per line: {"id", "median_ns", "samples", "note"}; the
ids are the criterion benchmark ids they stand beside. Inputs are built the same way as in the
Rust benches. Timings are medians of wall time (time.perf_counter_ns) after a warm-up.
"""

import asyncio
import json
import statistics
import sys
import time

QUICK = "--quick" in sys.argv


def emit(id, samples, note=""):
    print(
        json.dumps(
            {
                "id": id,
                "median_ns": statistics.median(samples),
                "samples": len(samples),
                "note": note,
            }
        ),
        flush=True,
    )


def timed(fn, n, warmup=1):
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(n):
        start = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - start)
    return samples


def n(full, quick):
    return quick if QUICK else full


# --- agent loop: ten code steps, a scripted model, a runtime that does nothing -------------

REPLY = "I will compute it.\n```python\nresult = add(5, 3)\nprint(result)\n```"


def agent_loop(loop):
    from cave_agent import CaveAgent, TokenUsage
    from cave_agent.models.base import StreamDelta
    from cave_agent.runtime.executor import ExecutionResult

    class Stream:
        def __init__(self):
            self.usage = TokenUsage()
            self.finish_reason = None
            self.thinking = ""
            self.refusal = ""
            self.on_backoff = None
            self._chunks = [REPLY[i : i + 16] for i in range(0, len(REPLY), 16)]

        def __aiter__(self):
            return self

        async def __anext__(self):
            if not self._chunks:
                self.finish_reason = "stop"
                self.usage = TokenUsage(10, 10, 20)
                raise StopAsyncIteration
            return StreamDelta(content=self._chunks.pop(0))

        async def aclose(self):
            pass

    class Scripted:
        max_output_tokens = None
        filters_asynchronously = False

        def stream(self, wire):
            return Stream()

    class Echo:
        def describe_functions(self):
            return ""

        def describe_variables(self):
            return ""

        def describe_types(self):
            return ""

        async def execute(self, code):
            return ExecutionResult(stdout=code)

        async def retrieve(self, name):
            raise KeyError(name)

        async def reset(self):
            pass

        async def bind_unique(self, prefix, value, *, start=1):
            return f"{prefix}{start}"

    async def run():
        agent = CaveAgent(Scripted(), Echo(), max_steps=10)
        response = await agent.run("Add five and three.")
        assert response.steps == 10, response

    emit(
        "agent_loop/10_code_steps",
        timed(lambda: loop.run_until_complete(run()), n(200, 30)),
    )


# --- fence parser ---------------------------------------------------------------------------


def parser():
    from cave_agent.parsing.streaming import StreamingTextParser

    text = ""
    while len(text.encode()) < 48 * 1024:
        text += "Here is the plan: call `load()` first, then ``inline double`` spans; done.\n"
    text += "```python\n"
    while len(text.encode()) < 64 * 1024:
        text += "payload = \"\"\"\n```\nnot a fence\"\"\"\nx = {'a': [1, 2]}  # it's fine\n"
    text += "```\n"
    for size in (1, 64):
        chunks = [text[i : i + size] for i in range(0, len(text), size)]

        def run():
            p = StreamingTextParser("python")
            for chunk in chunks:
                p.process_chunk(chunk)
            p.flush()

        emit(f"fence_parser/chunks_of_{size}", timed(run, n(20, 5)))


# --- code policy ----------------------------------------------------------------------------


def policy():
    from cave_agent import AttributeRule, FunctionRule, ImportRule, RegexRule, SecurityChecker

    block = "import pandas as pd\nfrom collections import Counter\n\ndef summarize(df, column='sales'):\n    \"\"\"Totals by region.\"\"\"\n    grouped = df.groupby('region')[column].sum()\n    top = grouped.sort_values(ascending=False).head(5)\n    counts = Counter(df['region'])\n    return {'top': top.to_dict(), 'counts': dict(counts)}\n\nresult = summarize(data)\nprint(result['top'])\n"
    code = ""
    while len(code.splitlines()) < 300:
        code += block
    checker = SecurityChecker(
        [
            ImportRule({"os", "subprocess", "sys"}),
            FunctionRule({"eval", "exec", "open"}),
            AttributeRule({"__globals__", "__code__"}),
            RegexRule(r"rm\s+-rf"),
        ]
    )
    # CaveAgent parses and walks every cell whole: its figures for the cells our policy reads
    # in part or not at all (cave-security/benches/policy.rs builds the same cells).
    cells = {
        "check_300_lines_4_rules": code,
        "check_300_lines_4_rules_one_door": code + "getattr(result, 'items')\n",
        "check_300_lines_4_rules_door_in_every_block": code.replace(
            "df.groupby(", "getattr(df, 'groupby')("
        ).replace("result = ", "result = getattr(data, 'copy')() or "),
        "check_300_lines_4_rules_door_on_every_line": "".join(
            f"{line}  # getattr\n" for line in code.splitlines()
        ),
        "check_300_lines_4_rules_door_in_every_statement": "".join(
            f"total_{i} = getattr(frame, 'column_{i}').sum() / len(frame)\n" for i in range(300)
        ),
        "check_300_lines_4_rules_computed_door_in_every_statement": "".join(
            f"total_{i} = getattr(frame, prefix + '{i}').sum() / len(frame)\n" for i in range(300)
        ),
        "check_300_lines_4_rules_door_on_an_item_in_every_statement": "".join(
            f"total_{i} = getattr(frames[{i}], 'total').sum() / len(frames)\n" for i in range(300)
        ),
        "check_300_lines_4_rules_namespace_in_every_statement": "".join(
            f"names_{i} = sorted(vars(frames[{i}]))[:3] + columns\n" for i in range(300)
        ),
    }
    for id, cell in cells.items():
        assert not checker.check_code(cell), id
        emit(id, timed(lambda: checker.check_code(cell), n(200, 30)))


# --- token estimation -----------------------------------------------------------------------


def estimation():
    from cave_agent.compaction import default_token_estimate

    text = ""
    while len(text.encode()) < 1_000_000:
        text += "The quarterly report shows revenue up 12% year over year. "
        text += "季度报告显示收入同比增长百分之十二。"
    emit(
        "estimate_1mb_mixed/script_heuristic",
        timed(lambda: default_token_estimate(text), n(30, 5)),
    )
    # The same text as the Rust benchmark's `ascii_heavy`.
    heavy = ""
    while len(heavy.encode()) < 1_000_000:
        heavy += "df = pd.read_csv('sales.csv')\nprint(df.groupby('region')['revenue'].sum())\n"
        heavy += "region\nnorth    1204.50\nsouth     998.25\n"
        heavy += "The north region leads — revenue is up 12% on last year's café sales.\n"
    emit(
        "estimate_1mb_ascii_heavy/script_heuristic",
        timed(lambda: default_token_estimate(heavy), n(30, 5)),
    )


# --- runtimes -------------------------------------------------------------------------------


def in_process(loop):
    from cave_agent import IPythonRuntime, Variable

    runtime = IPythonRuntime(variables=[Variable("ints", [])])
    emit(
        "execute_x_equals_1",
        timed(lambda: loop.run_until_complete(runtime.execute("x = 1")), n(2000, 200), 10),
    )
    ints = list(range(1_000_000))

    def round_trip():
        runtime.update_variable("ints", ints)
        back = loop.run_until_complete(runtime.retrieve("ints"))
        assert len(back) == 1_000_000

    emit(
        "million_ints/inject_and_retrieve",
        timed(round_trip, n(10, 3)),
        "CaveAgent's host is Python: the list object itself goes in and comes back, nothing is converted",
    )


def kernel(loop):
    try:
        from cave_agent import IPyKernelRuntime, Variable
        import ipykernel  # noqa: F401
    except ImportError as e:
        print(f"compare: the kernel figures need cave_agent[ipykernel] ({e})", file=sys.stderr)
        return

    def cold():
        async def go():
            runtime = IPyKernelRuntime()
            result = await runtime.execute("print(1)")
            assert result.success, result.error
            await runtime.stop()

        loop.run_until_complete(go())

    cold_samples = timed(cold, n(10, 3))
    emit("kernel/cold_start_to_first_result", cold_samples)
    # Ours runs this row on this very interpreter too (CAVE_BENCH_PEER_PYTHON): like for like.
    emit("kernel/cold_start_to_first_result_on_the_peers_python", cold_samples)

    runtime = IPyKernelRuntime()
    loop.run_until_complete(runtime.start())
    emit(
        "kernel/execute_x_equals_1",
        timed(lambda: loop.run_until_complete(runtime.execute("x = 1")), n(200, 30), 5),
    )
    loop.run_until_complete(runtime.stop())

    ints = list(range(1_000_000))

    def million():
        async def go():
            runtime = IPyKernelRuntime(variables=[Variable("ints", ints)])
            await runtime.start()
            back = await runtime.retrieve("ints")
            assert len(back) == 1_000_000
            await runtime.stop()

        loop.run_until_complete(go())

    emit("kernel/inject_and_retrieve_million_ints_with_start", timed(million, n(5, 2)))


# --- resident memory ------------------------------------------------------------------------


def resident(pid="self"):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def children():
    import os

    mine = str(os.getpid())
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == mine:
                found.append(entry)
    return found


def memory(loop):
    """Each figure in a fresh interpreter (`--memory inproc|kernel`), as the Rust side does."""
    import subprocess

    for kind in ("inproc", "kernel"):
        out = subprocess.run(
            [sys.executable, __file__, "--memory", kind],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            print(f"compare: memory ({kind}) failed: {out.stderr.strip()[-500:]}", file=sys.stderr)
            continue
        for line in out.stdout.splitlines():
            print(line, flush=True)


def memory_of(kind):
    loop = asyncio.new_event_loop()
    if kind == "inproc":
        from cave_agent import IPythonRuntime

        runtime = IPythonRuntime()
        loop.run_until_complete(runtime.execute("x = 1"))
        figures = {"memory/inproc_runtime/host": resident()}
    else:
        from cave_agent import IPyKernelRuntime

        runtime = IPyKernelRuntime()
        loop.run_until_complete(runtime.execute("x = 1"))
        kids = children()
        figures = {
            "memory/kernel_runtime/host": resident(),
            "memory/kernel_runtime/child": sum(resident(k) for k in kids),
        }
        loop.run_until_complete(runtime.stop())
    for id, bytes in figures.items():
        print(json.dumps({"id": id, "bytes": bytes}), flush=True)


def main():
    import cave_agent

    version = getattr(cave_agent, "__version__", None)
    if version is None:
        from importlib.metadata import version as dist_version

        version = dist_version("cave-agent")
    print(json.dumps({"peer": "CaveAgent", "version": version, "python": sys.version.split()[0]}), flush=True)
    loop = asyncio.new_event_loop()
    agent_loop(loop)
    parser()
    policy()
    estimation()
    in_process(loop)
    kernel(loop)
    memory(loop)


if __name__ == "__main__":
    if "--memory" in sys.argv:
        memory_of(sys.argv[sys.argv.index("--memory") + 1])
    else:
        main()
