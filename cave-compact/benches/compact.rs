//! Estimation throughput and microcompaction.
//!
//! Run with `cargo xtask bench` (or `cargo bench -p cave-compact`).

use cave_compact::{ContextCompactor, Encoding, ScriptEstimator, TiktokenEstimator};
use cave_core::{Message, TokenEstimator};
use cave_testing::ScriptedModel;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;
use std::sync::Arc;

/// About 1 MB of mixed Latin and CJK text.
fn mixed() -> String {
    let mut text = String::new();
    while text.len() < 1_000_000 {
        text.push_str("The quarterly report shows revenue up 12% year over year. ");
        text.push_str("季度报告显示收入同比增长百分之十二。");
    }
    text
}

/// About 1 MB of what a history mostly holds: code, its output and English, with a non-ASCII
/// character now and then.
fn ascii_heavy() -> String {
    let mut text = String::new();
    while text.len() < 1_000_000 {
        text.push_str(
            "df = pd.read_csv('sales.csv')\nprint(df.groupby('region')['revenue'].sum())\n",
        );
        text.push_str("region\nnorth    1204.50\nsouth     998.25\n");
        text.push_str("The north region leads — revenue is up 12% on last year's café sales.\n");
    }
    text
}

fn estimation(c: &mut Criterion) {
    let text = ascii_heavy();
    let mut group = c.benchmark_group("estimate_1mb_ascii_heavy");
    group.throughput(Throughput::Bytes(text.len() as u64));
    group.bench_function("script_heuristic", |b| {
        b.iter(|| black_box(ScriptEstimator.estimate(black_box(&text))))
    });
    group.finish();

    let text = mixed();
    let mut group = c.benchmark_group("estimate_1mb_mixed");
    group.throughput(Throughput::Bytes(text.len() as u64));
    group.bench_function("script_heuristic", |b| {
        b.iter(|| black_box(ScriptEstimator.estimate(black_box(&text))))
    });
    let exact = TiktokenEstimator::new(Encoding::O200k);
    exact.estimate("warm up: build the tables once");
    group.sample_size(10);
    group.bench_function("tiktoken_o200k", |b| {
        b.iter(|| black_box(exact.estimate(black_box(&text))))
    });
    group.finish();
}

fn microcompaction(c: &mut Criterion) {
    let compactor = ContextCompactor::new(Arc::new(ScriptedModel::new([])));
    let mut history = vec![Message::system("sys")];
    for i in 0..500 {
        history.push(Message::code(format!(
            "```python\nstep_{i} = load({i})\n```"
        )));
        history.push(Message::execution_result("row,value\n".repeat(40)));
    }
    assert_eq!(history.len(), 1_001);
    c.bench_function("microcompact_1000_messages", |b| {
        b.iter(|| black_box(compactor.microcompact(black_box(&history), &ScriptEstimator)))
    });
}

criterion_group!(benches, estimation, microcompaction);
criterion_main!(benches);
