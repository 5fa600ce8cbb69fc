//! Benchmarks of the in-process runtime: the round trip of a trivial cell, and moving a
//! million ints in and out.
//!
//! Run with `cargo xtask bench` (or `cargo bench -p cave-runtime-inproc`).

use cave_core::RuntimeExt;
use cave_core::{DiscardOutput, Resources, Runtime, Value, Variable};
use cave_runtime_inproc::InProcRuntime;
use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;

fn execute_round_trip(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let runtime = rt.block_on(async { InProcRuntime::new() }).unwrap();
    c.bench_function("execute_x_equals_1", |b| {
        b.iter(|| {
            let out = rt
                .block_on(runtime.execute("x = 1", &DiscardOutput))
                .unwrap();
            black_box(out)
        })
    });
}

fn million_ints(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let runtime = rt.block_on(async { InProcRuntime::new() }).unwrap();
    let ints = Value::List((0..1_000_000).map(Value::Int).collect());
    rt.block_on(
        runtime.register(Resources::new().variable(Variable::new("ints", Value::List(vec![])))),
    )
    .unwrap();
    let mut group = c.benchmark_group("million_ints");
    group.sample_size(10);
    group.bench_function("inject_and_retrieve", |b| {
        b.iter_batched(
            || ints.clone(),
            |value| {
                rt.block_on(runtime.update("ints", value)).unwrap();
                let back = rt.block_on(runtime.retrieve("ints")).unwrap();
                assert!(matches!(&back, Value::List(items) if items.len() == 1_000_000));
                black_box(back)
            },
            criterion::BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, execute_round_trip, million_ints);
criterion_main!(benches, hop);

fn thread_hop(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let runtime = rt.block_on(async { InProcRuntime::new() }).unwrap();
    c.bench_function("get_unbound_name", |b| {
        b.iter(|| black_box(rt.block_on(runtime.get("missing")).is_err()))
    });
}
criterion_group!(hop, thread_hop);
