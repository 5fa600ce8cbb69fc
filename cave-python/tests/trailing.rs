//! The reading of a cell's trailing expression (`cave_python::trailing`) against Python's own
//! `ast`, in a real `python3`: on the code-policy corpus and on thousands of cells built from
//! pieces that are hard to read (strings holding `=`, `#`, quotes and newlines, continuations,
//! brackets across lines, blocks, decorators, comments), wherever the reading is sure it must
//! say what the parse says: whether the last statement is an expression statement, and where
//! it starts.

use cave_python::{Trailing, trailing};

/// What Python says of each cell: `"error"`, `"statement"`, or `[line, column]` of a trailing
/// expression statement.
const VERDICTS: &str = r#"
import ast, json, sys
out = []
for cell in json.load(sys.stdin):
    try:
        tree = ast.parse(cell)
    except (SyntaxError, ValueError):
        out.append("error")
        continue
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        out.append([tree.body[-1].lineno, tree.body[-1].col_offset])
    else:
        out.append("statement")
json.dump(out, sys.stdout)
"#;

/// Pieces cells are made of: statements, expressions and the tricky in between.
const PIECES: &[&str] = &[
    "x = 1",
    "x",
    "x == 1",
    "d['a=b'] = 2",
    "d['a=b']",
    "s = 'it''s # not = a comment'",
    "'a = b'",
    "\"#\" + 'x'",
    "t = '''one\nx = 2\n'''",
    "'''doc\n = string'''",
    "r'\\'=' ",
    "b'\\x00=' ",
    "f'plain = text'",
    "f'{x} = {y}'",
    "y = (1,\n     2)",
    "(1,\n 2)",
    "[a for a in\n range(3)]",
    "total = 1 + \\\n    2",
    "1 + \\\n    2",
    "# a comment = here",
    "x  # trailing = comment",
    "",
    "   ",
    "for i in range(2):\n    i\n",
    "if x:\n    y = 1\nelif z:\n    z\nelse:\n    w",
    "while False:\n    pass",
    "try:\n    x\nexcept Exception:\n    y\nfinally:\n    z",
    "with open('f') as f:\n    f.read()",
    "def f(a=1):\n    return a",
    "@dec\ndef g():\n    pass",
    "class C:\n    x: int = 1",
    "async def h():\n    await g()",
    "await f()",
    "x: int",
    "x: int = 2",
    "x += 1",
    "x //= 2",
    "x ** 2",
    "x <= y",
    "x != y",
    "(y := 3)",
    "y := 3",
    "lambda a=1: a",
    "f(a=1)",
    "f(a=1)[0]",
    "a, b = b, a",
    "a.b.c",
    "not x",
    "-x",
    "x if y else z",
    "print('done')",
    "import os",
    "from os import path",
    "del x",
    "assert x, 'msg = x'",
    "raise ValueError('x = 1')",
    "global g",
    "x; y",
    "x;",
    "match x:\n    case 1:\n        pass",
    "match(x)",
    "type(x)",
    "type X = int",
    "...",
    "1e-5",
    "0x1F",
    "1_000",
    "2j",
    "[\n# comment in brackets = x\n1]",
    "x = {\n  'k': 'v',\n}",
    "{'k': 1}",
    "{1: 2}[1]",
    "yield x",
    "\tx",
    "x = $",
    "(",
    ")",
    "'unterminated",
    "'''unterminated",
    "é = 1",
    "é",
    "x\r",
];

/// A deterministic stream of numbers (the same cells every run).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) as usize) % below
    }
}

fn corpus() -> Vec<String> {
    let mut cells = Vec::new();
    for file in ["allowed.py", "refused.py"] {
        let path = format!(
            "{}/../cave-security/tests/corpus/{file}",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).expect("the policy's corpus");
        cells.extend(text.split("\n# ---\n").map(str::to_owned));
    }
    cells
}

fn generated(count: usize) -> Vec<String> {
    let mut random = Lcg(47);
    let mut cells: Vec<String> = PIECES.iter().map(|p| (*p).to_owned()).collect();
    for _ in 0..count {
        let pieces = 1 + random.next(4);
        let mut cell = String::new();
        for i in 0..pieces {
            if i > 0 {
                cell.push_str(["\n", "\n\n", "\n# between\n", "\n\\\n"][random.next(4)]);
            }
            cell.push_str(PIECES[random.next(PIECES.len())]);
        }
        if random.next(3) == 0 {
            cell.push('\n');
        }
        cells.push(cell);
    }
    cells
}

/// Python's verdict on each cell.
fn verdicts(cells: &[String]) -> Vec<serde_json::Value> {
    cave_testing::python::ask(VERDICTS, cells)
}

#[test]
fn where_the_reading_is_sure_it_says_what_python_says() {
    let mut cells = corpus();
    cells.extend(generated(5000));
    let verdicts = verdicts(&cells);
    assert_eq!(verdicts.len(), cells.len());
    let (mut sure, mut expressions) = (0, 0);
    for (cell, verdict) in cells.iter().zip(&verdicts) {
        let read = trailing(cell);
        match (read, verdict.as_str()) {
            // Not sure, or a cell that does not compile: the executor parses it.
            (Trailing::Unknown, _) | (_, Some("error")) => continue,
            (Trailing::Statement, Some("statement")) => {}
            (Trailing::Expression(at), None) => {
                let line = cell[..at].matches('\n').count() as u64 + 1;
                assert_eq!(
                    verdict,
                    &serde_json::json!([line, 0]),
                    "{cell:?}: read at byte {at}"
                );
                expressions += 1;
            }
            _ => panic!("{cell:?}: read as {read:?}, Python says {verdict}"),
        }
        sure += 1;
    }
    // The reading must be sure of most cells, or it saves nothing.
    let compiling = verdicts.iter().filter(|v| *v != "error").count();
    assert!(
        sure * 10 >= compiling * 6,
        "sure of {sure} of {compiling} cells that compile"
    );
    assert!(expressions > 100, "{expressions} trailing expressions");
}
