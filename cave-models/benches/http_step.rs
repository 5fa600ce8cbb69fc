//! The cost of agent steps through the real HTTP stack: request encoding, a local SSE server
//! on 127.0.0.1, chunk parsing, the agent loop. The reply is about 60 characters streamed in
//! 8-character chunks, with a code block so that every step runs again.
//!
//! Run with `cargo xtask bench` (or `cargo bench -p cave-models`).

#[path = "../tests/support/mod.rs"]
#[allow(dead_code)]
mod support;

use cave_core::{AgentBuilder, StopReason};
use cave_models::{ModelConfig, OpenAiModel};
use cave_testing::EchoRuntime;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};

const STEPS: u32 = 10;

fn http_steps(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let reply = "Computing.\n```python\nresult = add(5, 3)\nprint(result)\n```";
    let server = rt.block_on(support::TestServer::repeating(support::answer(
        reply, 8, "stop",
    )));
    let model = OpenAiModel::new(ModelConfig::new("bench").base_url(server.base_url())).unwrap();
    let mut group = c.benchmark_group("http_agent_steps");
    group.throughput(Throughput::Elements(u64::from(STEPS)));
    group.bench_function("10_steps_60_chars_in_8_char_chunks", |b| {
        b.iter_batched(
            || {
                AgentBuilder::new(model.clone(), EchoRuntime::new())
                    .max_steps(STEPS)
                    .build()
                    .unwrap()
            },
            |mut agent| {
                let response = rt.block_on(agent.run("Add five and three."));
                assert_eq!(
                    (response.stop_reason, response.steps),
                    (StopReason::MaxSteps, STEPS),
                    "{:?}",
                    response.error
                );
                response
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, http_steps);
criterion_main!(benches);
