//! Benchmarks: the agent loop's own overhead per step, and the fence parser's throughput.
//!
//! Run with `cargo xtask bench` (or `cargo bench -p cave-core --features testing`).

use cave_core::FenceParser;
use cave_core::{AgentBuilder, StopReason};
use cave_testing::{EchoRuntime, Reply, ScriptedModel};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;

const STEPS: u32 = 10;

/// Steps whose model and runtime cost next to nothing, so the time is the framework's:
/// streaming deltas, parsing, events, history, prompt assembly, execution bookkeeping.
fn loop_overhead(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let reply =
        Reply::text("I will compute it.\n```python\nresult = add(5, 3)\nprint(result)\n```")
            .chunk_size(16);
    let mut group = c.benchmark_group("agent_loop");
    group.throughput(Throughput::Elements(u64::from(STEPS)));
    group.bench_function("10_code_steps", |b| {
        b.iter_batched(
            || {
                let model = ScriptedModel::repeating(reply.clone());
                AgentBuilder::new(model, EchoRuntime::new())
                    .max_steps(STEPS)
                    .build()
                    .unwrap()
            },
            |mut agent| {
                let response = rt.block_on(agent.run("Add five and three."));
                assert_eq!(response.stop_reason, StopReason::MaxSteps);
                black_box(response)
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

/// About 64 KiB of prose with inline code, then one block full of strings and fake fences
/// (the parser stops at the first closed block, so that block closes at the very end).
fn response() -> String {
    let mut text = String::new();
    while text.len() < 48 * 1024 {
        text.push_str(
            "Here is the plan: call `load()` first, then ``inline double`` spans; done.\n",
        );
    }
    text.push_str("```python\n");
    while text.len() < 64 * 1024 {
        text.push_str("payload = \"\"\"\n```\nnot a fence\"\"\"\nx = {'a': [1, 2]}  # it's fine\n");
    }
    text.push_str("```\n");
    text
}

fn parser_throughput(c: &mut Criterion) {
    let input = response();
    let mut group = c.benchmark_group("fence_parser");
    group.throughput(Throughput::Bytes(input.len() as u64));
    for chunk_chars in [1usize, 64] {
        let boundaries: Vec<usize> = input
            .char_indices()
            .map(|(i, _)| i)
            .step_by(chunk_chars)
            .chain(std::iter::once(input.len()))
            .collect();
        let chunks: Vec<&str> = boundaries.windows(2).map(|w| &input[w[0]..w[1]]).collect();
        group.bench_function(format!("chunks_of_{chunk_chars}"), |b| {
            b.iter(|| {
                let mut parser = FenceParser::new("python");
                let mut text = 0;
                for chunk in &chunks {
                    text += parser.push(chunk).text.len();
                }
                assert!(parser.is_complete());
                black_box(text)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, loop_overhead, parser_throughput);
criterion_main!(benches);
