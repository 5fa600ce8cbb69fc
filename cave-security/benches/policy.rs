//! A 300-line cell checked by four rules.
//!
//! Run with `cargo xtask bench` (or `cargo bench -p cave-security`).

use cave_core::CodePolicy;
use cave_security::SecurityPolicy;
use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;

fn cell() -> String {
    let block = "import pandas as pd\nfrom collections import Counter\n\ndef summarize(df, column='sales'):\n    \"\"\"Totals by region.\"\"\"\n    grouped = df.groupby('region')[column].sum()\n    top = grouped.sort_values(ascending=False).head(5)\n    counts = Counter(df['region'])\n    return {'top': top.to_dict(), 'counts': dict(counts)}\n\nresult = summarize(data)\nprint(result['top'])\n";
    let mut code = String::new();
    while code.lines().count() < 300 {
        code.push_str(block);
    }
    code
}

fn four_rules(c: &mut Criterion) {
    let policy = SecurityPolicy::new()
        .deny_imports(["os", "subprocess", "sys"], None)
        .deny_calls(["eval", "exec", "open"], None)
        .deny_attributes(["__globals__", "__code__"], None)
        .deny_regex(r"rm\s+-rf", None)
        .unwrap();
    let code = cell();
    assert!(policy.check(&code).is_empty());
    c.bench_function("check_300_lines_4_rules", |b| {
        b.iter(|| black_box(policy.check(black_box(&code))))
    });
    // The same cell with a door to names by string in its last statement: that statement
    // parsed and walked.
    let one_door = format!("{code}getattr(result, 'items')\n");
    assert!(policy.check(&one_door).is_empty());
    c.bench_function("check_300_lines_4_rules_one_door", |b| {
        b.iter(|| black_box(policy.check(black_box(&one_door))))
    });
    // A door in every function and every call of it: most of the cell parsed and walked.
    let every = code
        .replace("df.groupby(", "getattr(df, 'groupby')(")
        .replace("result = ", "result = getattr(data, 'copy')() or ");
    assert!(policy.check(&every).is_empty());
    c.bench_function("check_300_lines_4_rules_door_in_every_block", |b| {
        b.iter(|| black_box(policy.check(black_box(&every))))
    });
    // A door's name on every line, in a comment: text, so nothing is parsed.
    let every_line: String = code
        .lines()
        .map(|line| format!("{line}  # getattr\n"))
        .collect();
    assert!(policy.check(&every_line).is_empty());
    c.bench_function("check_300_lines_4_rules_door_on_every_line", |b| {
        b.iter(|| black_box(policy.check(black_box(&every_line))))
    });
    // A door in the code of every statement, each called with a plain literal: read from its
    // tokens, nothing parsed.
    let every_statement = door_in_every_statement();
    assert!(policy.check(&every_statement).is_empty());
    c.bench_function("check_300_lines_4_rules_door_in_every_statement", |b| {
        b.iter(|| black_box(policy.check(black_box(&every_statement))))
    });
    // A door with a computed name in every statement (`prefix + '7'`): no string to reach,
    // read from its tokens, nothing parsed.
    let computed = computed_door_in_every_statement();
    assert!(policy.check(&computed).is_empty());
    c.bench_function(
        "check_300_lines_4_rules_computed_door_in_every_statement",
        |b| b.iter(|| black_box(policy.check(black_box(&computed)))),
    );
    // A door on an item of a list in every statement (`frames[7]`): read from its tokens.
    let on_an_item = door_on_an_item_in_every_statement();
    assert!(policy.check(&on_an_item).is_empty());
    c.bench_function(
        "check_300_lines_4_rules_door_on_an_item_in_every_statement",
        |b| b.iter(|| black_box(policy.check(black_box(&on_an_item)))),
    );
    // The worst case: an object's namespace read in every statement (`vars(frame)`), which
    // only the tree tells from an index into it, so the whole cell is parsed and walked.
    let namespaces = namespace_in_every_statement();
    assert!(policy.check(&namespaces).is_empty());
    c.bench_function(
        "check_300_lines_4_rules_namespace_in_every_statement",
        |b| b.iter(|| black_box(policy.check(black_box(&namespaces)))),
    );
}

/// 300 statements, each reaching a column by string (`xtask/compare/caveagent.py` builds the
/// same cell).
fn door_in_every_statement() -> String {
    (0..300)
        .map(|i| format!("total_{i} = getattr(frame, 'column_{i}').sum() / len(frame)\n"))
        .collect()
}

/// 300 statements, each reaching a column by a computed string (`xtask/compare/caveagent.py`
/// builds the same cell).
fn computed_door_in_every_statement() -> String {
    (0..300)
        .map(|i| format!("total_{i} = getattr(frame, prefix + '{i}').sum() / len(frame)\n"))
        .collect()
}

/// 300 statements, each reaching a column of an item by string (`xtask/compare/caveagent.py`
/// builds the same cell).
fn door_on_an_item_in_every_statement() -> String {
    (0..300)
        .map(|i| format!("total_{i} = getattr(frames[{i}], 'total').sum() / len(frames)\n"))
        .collect()
}

/// 300 statements, each listing an object's namespace (`xtask/compare/caveagent.py` builds the
/// same cell).
fn namespace_in_every_statement() -> String {
    (0..300)
        .map(|i| format!("names_{i} = sorted(vars(frames[{i}]))[:3] + columns\n"))
        .collect()
}

criterion_group!(benches, four_rules);
criterion_main!(benches, parse);

fn parse_only(c: &mut Criterion) {
    let code = cell();
    c.bench_function("parse_300_lines", |b| {
        b.iter(|| {
            let mut parser = tree_sitter::Parser::new();
            parser
                .set_language(&tree_sitter_python::LANGUAGE.into())
                .unwrap();
            black_box(parser.parse(black_box(&code), None))
        })
    });
}
fn parse_reusing_the_parser(c: &mut Criterion) {
    let code = cell();
    let mut parser = tree_sitter::Parser::new();
    parser
        .set_language(&tree_sitter_python::LANGUAGE.into())
        .unwrap();
    c.bench_function("parse_300_lines_reused_parser", |b| {
        b.iter(|| black_box(parser.parse(black_box(&code), None)))
    });
    // The worst case's cell: what parsing alone takes of its check.
    let namespaces = namespace_in_every_statement();
    c.bench_function("parse_namespace_in_every_statement_reused_parser", |b| {
        b.iter(|| black_box(parser.parse(black_box(&namespaces), None)))
    });
}
criterion_group!(parse, parse_only, parse_reusing_the_parser);
