use cave_core::{AgentBuilder, CodePolicy, Event, Message, StopReason};
use cave_security::SecurityPolicy;
use cave_testing::{EchoRuntime, Reply, ScriptedModel};
use futures_util::StreamExt;
use proptest::prelude::*;
use std::sync::Arc;

fn messages(policy: &SecurityPolicy, code: &str) -> Vec<String> {
    policy.check(code).into_iter().map(|v| v.message).collect()
}

fn blocked(policy: &SecurityPolicy, code: &str) -> bool {
    !policy.check(code).is_empty()
}

#[test]
fn imports_match_modules_and_their_submodules() {
    let policy = SecurityPolicy::new().deny_imports(["os", "subprocess"], None);
    for code in [
        "import os",
        "import os.path",
        "import os.path as p",
        "from os.path import join",
        "from os import system",
        "import json, subprocess",
        "import  os . path",
    ] {
        assert!(blocked(&policy, code), "{code}");
    }
    for code in [
        "import posixpath",
        "import math",
        "from . import os",
        "from .os import path",
        "from ..os import x",
        "import osmosis",
        "x = 'import os'",
    ] {
        assert!(!blocked(&policy, code), "{code}");
    }
    assert_eq!(
        messages(&policy, "x = 1\nimport os.path as p"),
        ["Forbidden import 'os.path' at line 2"]
    );
    let described = SecurityPolicy::new().deny_imports(["os"], Some("no system access"));
    assert_eq!(
        messages(&described, "from os import path"),
        ["Forbidden import 'os' at line 1: no system access"]
    );
}

#[test]
fn calls_are_caught_by_name_attribute_and_reference() {
    let policy = SecurityPolicy::new().deny_calls(["eval", "open"], None);
    assert_eq!(
        messages(&policy, "eval('1')"),
        ["Forbidden call to 'eval' at line 1"]
    );
    assert_eq!(
        messages(&policy, "fs.open('x')"),
        ["Forbidden call to 'open' at line 1"]
    );
    assert_eq!(
        messages(&policy, "f = open"),
        ["Forbidden reference to 'open' at line 1"]
    );
    assert_eq!(
        messages(&policy, "sorted(x, key=eval)"),
        ["Forbidden reference to 'eval' at line 1"]
    );
    assert_eq!(
        messages(&policy, "print(eval)"),
        ["Forbidden reference to 'eval' at line 1"]
    );
    assert_eq!(messages(&policy, "open(open('x'))").len(), 2);
    // A default value is a use; the parameter's name is not.
    assert_eq!(
        messages(&policy, "def f(x=eval):\n    pass"),
        ["Forbidden reference to 'eval' at line 1"]
    );
    assert_eq!(
        messages(&policy, "g = lambda f=open: f"),
        ["Forbidden reference to 'open' at line 1"]
    );
    assert_eq!(
        messages(&policy, "def f(x: int = eval):\n    pass"),
        ["Forbidden reference to 'eval' at line 1"]
    );
    // Taken from a module by its name, perhaps under another one.
    assert_eq!(
        messages(&policy, "from builtins import eval as run\nrun('1')"),
        ["Forbidden function 'eval' imported at line 1"]
    );
    assert_eq!(
        messages(&policy, "from io import (\n    BytesIO,\n    open,\n)"),
        ["Forbidden function 'open' imported at line 3"]
    );
    for code in [
        "x.eval = 1",
        "f(eval=1)",
        "def f(open=None): pass",
        "eval_result = 3",
        "# eval(x)",
        "print('eval')",
        "class open: pass",
        "from evaluation import open_set",
        "from eval import x",
    ] {
        assert!(
            !blocked(&policy, code),
            "{code}: {:?}",
            messages(&policy, code)
        );
    }
}

#[test]
fn attributes_and_patterns() {
    let policy = SecurityPolicy::new().deny_attributes(["__globals__", "__code__"], None);
    assert_eq!(
        messages(&policy, "f.__globals__"),
        ["Forbidden attribute '__globals__' at line 1"]
    );
    assert!(blocked(&policy, "g = f.__code__.co_code"));
    assert!(!blocked(&policy, "s = '__globals__'"));
    let policy = SecurityPolicy::new()
        .deny_regex(r"rm\s+-rf", Some("destructive shell"))
        .unwrap();
    assert_eq!(
        messages(&policy, "a = 'rm -rf /'\nb = 'rm  -rf x'"),
        ["Forbidden pattern at line 1: destructive shell"]
    );
    let err = SecurityPolicy::new()
        .deny_regex("(unclosed", None)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("invalid regex pattern \"(unclosed\""),
        "{err}"
    );
    // A very long expression does not defeat the rules.
    let long = format!("x = {}\nimport os", vec!["1"; 2000].join(" + "));
    assert!(blocked(
        &SecurityPolicy::new().deny_imports(["os"], None),
        &long
    ));
}

#[test]
fn the_documented_bypasses_of_the_peer_are_closed() {
    let policy = SecurityPolicy::strict();
    let bypasses = [
        "__import__('os').system('ls')",
        "m = __import__('o' + 's')",
        "import importlib\nimportlib.import_module('subprocess')",
        "lib.import_module('os.path')",
        "getattr(f, '__globals__')",
        "getattr(__builtins__, 'eval')('1')",
        "getattr(x, '__glo' 'bals__')",
        "vars()['open']",
        "globals()['eval']",
        "__builtins__['exec']('x')",
        "builtins_dict = math.__dict__['eval']",
        "().__class__.__bases__[0].__subclasses__()",
        "x.__class__.__mro__",
        "frame.f_globals",
        "breakpoint()",
        "compile('1', 'x', 'eval')",
        // Python folds identifiers with NFKC: these are `eval` and `os`.
        "ｅｖａｌ('1')",
        "import ｏｓ",
        "f.__ｇｌｏｂａｌｓ__",
    ];
    for code in bypasses {
        assert!(blocked(&policy, code), "not blocked: {code}");
    }
}

#[test]
fn the_fast_path_sees_whole_words_only() {
    let policy = SecurityPolicy::new()
        .deny_imports(["os"], None)
        .deny_calls(["open"], None);
    // `os` inside `most` or `posixpath` is no trigger; a real one is found.
    assert!(!blocked(
        &policy,
        "most = [p for p in posts]\nimport posixpath"
    ));
    assert!(blocked(&policy, "x = 1\nimport os"));
    assert!(blocked(&policy, "reopen = open"));
}

#[test]
fn a_syntax_error_does_not_hide_other_findings() {
    let policy = SecurityPolicy::new().deny_imports(["os"], None);
    let found = messages(&policy, "import os\ndef f(:\n    pass\n");
    assert_eq!(found[0], "Syntax error at line 2: the code does not parse");
    assert!(
        found.contains(&"Forbidden import 'os' at line 1".to_owned()),
        "{found:?}"
    );
    assert_eq!(
        messages(&SecurityPolicy::new(), "   \n"),
        ["The code is empty"]
    );
    assert!(SecurityPolicy::new().check("x = 1").is_empty());
}

/// Ordinary data-analysis code, mentioning forbidden names only in strings and comments.
const CORPUS: &[&str] = &[
    "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2]})\ndf.describe()",
    "import numpy as np\nx = np.linspace(0, 1, 50)\nprint(x.mean())",
    "total = sum(prices)\nprint(f'total: {total:.2f}')",
    "rows = [r for r in data if r['open'] > r['close']]",
    "df['open'] = df['open'].astype(float)",
    "df.open.mean()",
    "# eval is not needed here\nresult = 2 + 2",
    "print('never call eval or exec on user input')",
    "note = \"os.system is forbidden in this notebook\"",
    "import math\nprint(math.sqrt(2))",
    "from collections import Counter\nCounter('hello')",
    "import json\njson.dumps({'a': 1})",
    "import statistics as st\nst.median([1, 3, 2])",
    "from datetime import datetime, timedelta\nnow = datetime(2024, 1, 1) + timedelta(days=3)",
    "import re\nre.findall(r'\\d+', 'a1b22')",
    "values = sorted(values, key=lambda v: v['score'], reverse=True)",
    "grouped = df.groupby('region')['sales'].sum().sort_values()",
    "pivot = df.pivot_table(index='month', columns='product', values='qty', aggfunc='sum')",
    "import itertools\nlist(itertools.combinations([1, 2, 3], 2))",
    "def mean(xs):\n    return sum(xs) / len(xs)\nmean([1, 2, 3])",
    "class Account:\n    def __init__(self, owner):\n        self.owner = owner\n    def __repr__(self):\n        return f'Account({self.owner!r})'",
    "from dataclasses import dataclass\n@dataclass\nclass P:\n    x: float\n    y: float = 0.0",
    "try:\n    value = int(text)\nexcept ValueError:\n    value = None",
    "with_tax = [p * 1.2 for p in prices]",
    "for i, row in enumerate(rows):\n    print(i, row)",
    "import random\nrandom.seed(0)\nrandom.sample(range(10), 3)",
    "df = df.dropna(subset=['price'])\ndf.head()",
    "top = df.nlargest(5, 'revenue')[['name', 'revenue']]",
    "corr = df[['a', 'b']].corr()",
    "import csv, io\nreader = csv.reader(io.StringIO('a,b\\n1,2'))\nlist(reader)",
    "text = 'compile the report'\nwords = text.split()",
    "settings = {'open': True, 'exec_mode': 'fast'}",
    "input_size = len(data)\nprint(input_size)",
    "def evaluate(model, X):\n    return model.predict(X)",
    "opened = [f for f in files if f.endswith('.csv')]",
    "import decimal\ndecimal.Decimal('1.10') + decimal.Decimal('2.20')",
    "from fractions import Fraction\nFraction(3, 4) + Fraction(1, 4)",
    "matrix = [[1, 2], [3, 4]]\n[list(r) for r in zip(*matrix)]",
    "s = df['city'].str.upper().value_counts()",
    "df['date'] = pd.to_datetime(df['date'])\ndf.set_index('date').resample('M').sum()",
    "import heapq\nheapq.nsmallest(3, [5, 1, 4, 2])",
    "import bisect\nbisect.bisect_left([1, 3, 5], 4)",
    "msg = 'the __globals__ attribute is off limits'",
    "import textwrap\ntextwrap.dedent('  a\\n  b')",
    "from typing import Optional\ndef f(x: Optional[int] = None) -> int:\n    return x or 0",
    "async def fetch_all(urls):\n    return [u.upper() for u in urls]\nawait fetch_all(['a'])",
    "squares = {n: n * n for n in range(10)}",
    "import uuid\nstr(uuid.uuid4())[:8]",
    "import hashlib\nhashlib.sha256(b'data').hexdigest()",
    "report = '\\n'.join(f'{k}: {v}' for k, v in totals.items())\nprint(report)",
];

#[test]
fn ordinary_code_is_not_blocked() {
    assert!(CORPUS.len() >= 50);
    let policy = SecurityPolicy::strict();
    for code in CORPUS {
        assert!(
            policy.check(code).is_empty(),
            "false positive on {code:?}: {:?}",
            messages(&policy, code)
        );
    }
}

#[tokio::test]
async fn a_refused_cell_never_runs_and_the_model_is_told_why() {
    let model = ScriptedModel::new([
        Reply::text("```python\nimport os\nos.remove('data.csv')\n```"),
        Reply::text("I will not do that."),
    ]);
    let runtime = Arc::new(EchoRuntime::new());
    let mut agent = AgentBuilder::new(model, runtime.clone())
        .policy(SecurityPolicy::strict())
        .build()
        .unwrap();
    let events: Vec<Event> = agent.stream("Clean up.").collect().await;
    assert!(runtime.executed().is_empty(), "nothing ran");
    let (message, violations) = events
        .iter()
        .find_map(|e| {
            if let Event::SecurityError {
                message,
                violations,
            } = e
            {
                Some((message.clone(), violations.clone()))
            } else {
                None
            }
        })
        .expect("a security error event");
    // For programs: the rule that fired, typed.
    let first = violations.first().expect("the violations");
    assert_eq!(first.kind, cave_core::ViolationKind::Import);
    assert_eq!(first.rule.as_deref(), Some("os"));
    assert_eq!(first.line, Some(1));
    assert!(
        message.contains("Forbidden import 'os' at line 1: system access is not allowed"),
        "{message}"
    );
    let told = agent.history().iter().any(|m| matches!(m, Message::ExecutionResult { content, .. } if content.contains("Forbidden import 'os'")));
    assert!(told, "the model receives the violations");
    assert!(matches!(
        events.last(),
        Some(Event::Stopped {
            stop_reason: StopReason::Completed,
            ..
        })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, .. ProptestConfig::default() })]

    #[test]
    fn no_input_makes_a_policy_panic(code in "\\PC{0,200}") {
        let _ = SecurityPolicy::strict().check(&code);
    }

    #[test]
    fn python_shaped_noise_does_not_panic(parts in prop::collection::vec(prop::sample::select(vec![
        "import ", "os", ".", "(", ")", "[", "]", "'", "\"", "getattr", "__import__", "eval", ",", "=", "\n",
        "    ", "def ", ":", "from ", " import ", "globals()", "+", "#", "lambda", "\\", "f'", "{", "}",
    ]), 0..60)) {
        let _ = SecurityPolicy::strict().check(&parts.concat());
    }
}

/// `CAVE_POLICY_SOAK=N` checks N random Python-shaped cells (default 2 000): no panic.
#[test]
fn soak_random_cells() {
    let cases: u64 = std::env::var("CAVE_POLICY_SOAK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let atoms = [
        "import ",
        "from ",
        "os",
        "sys",
        ".",
        "(",
        ")",
        "[",
        "]",
        "{",
        "}",
        "'",
        "\"",
        "'''",
        "getattr",
        "__import__",
        "eval",
        "open",
        ",",
        "=",
        "\n",
        "    ",
        "def ",
        "class ",
        ":",
        " as ",
        "globals()",
        "vars()",
        "+",
        "#",
        "lambda",
        "\\",
        "f'",
        "b'",
        "x",
        "1",
        "__globals__",
        "await ",
        "async ",
        "@",
        "*",
        "**",
        "->",
        "yield",
        "é",
        "\t",
    ];
    let policy = SecurityPolicy::strict();
    let mut state: u64 = 0x5EC0_5EC0;
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    for _ in 0..cases {
        let len = (next() % 80) as usize;
        let code: String = (0..len)
            .map(|_| atoms[(next() % atoms.len() as u64) as usize])
            .collect();
        let _ = policy.check(&code);
    }
}

/// The cells of a corpus file: blocks separated by `# ---` lines.
fn corpus(text: &str) -> Vec<String> {
    text.split("\n# ---\n")
        .map(|cell| cell.trim_matches('\n').to_owned())
        .filter(|cell| !cell.is_empty())
        .collect()
}

#[test]
fn strict_refuses_every_escape_in_the_corpus() {
    let policy = SecurityPolicy::strict();
    let cells = corpus(include_str!("corpus/refused.py"));
    assert!(cells.len() >= 40, "{} cells", cells.len());
    for cell in &cells {
        assert!(blocked(&policy, cell), "let through:\n{cell}");
    }
}

#[test]
fn strict_lets_ordinary_analysis_through() {
    let policy = SecurityPolicy::strict();
    let cells = corpus(include_str!("corpus/allowed.py"));
    assert!(cells.len() >= 20, "{} cells", cells.len());
    for cell in &cells {
        assert!(
            !blocked(&policy, cell),
            "false positive on:\n{cell}\n{:?}",
            messages(&policy, cell)
        );
    }
}

#[test]
fn user_rules_compare_decoded_names_too() {
    let policy = SecurityPolicy::new()
        .deny_calls(["eval"], None)
        .deny_imports(["os"], None);
    assert!(blocked(&policy, "getattr(m, '\\x65val')"));
    assert!(blocked(&policy, "__import__('\\N{LATIN SMALL LETTER O}s')"));
    // Without the computed-names rule, what cannot be read is not refused.
    assert!(!blocked(&policy, "getattr(m, name)"));
}

/// Input as long or as deep as a model can make it: a finding or a refusal, never a crash.
#[test]
fn huge_and_deep_cells_end_in_a_finding() {
    let terms = vec!["'a'"; 300_000].join("+");
    let deep = format!(
        "getattr(x, {}'eval'{})",
        "(".repeat(100_000),
        ")".repeat(100_000)
    );
    let policies = [
        SecurityPolicy::new().deny_calls(["eval"], None),
        SecurityPolicy::strict(),
    ];
    for policy in &policies {
        for cell in [
            format!("getattr(x, {terms})"),
            format!("eval({terms})"),
            format!("print({terms})\neval"),
            deep.clone(),
            format!("{}eval{}", "[".repeat(100_000), "]".repeat(100_000)),
        ] {
            let found = messages(policy, &cell);
            assert!(
                !found.is_empty(),
                "no finding for a {}-byte cell",
                cell.len()
            );
        }
    }
    // Nesting too deep to walk, with a word at its bottom (`+` groups to the left: the first
    // operand is the deepest); nesting that holds no word is not walked, and needs not be.
    let shorter = vec!["'a'"; 200_000].join("+");
    let deep_found = messages(
        &SecurityPolicy::strict(),
        &format!("print(x.__globals__+{shorter})"),
    );
    assert!(
        deep_found.iter().any(|m| m.contains("nests deeper than")),
        "{deep_found:?}"
    );
    let big = format!("eval\n{}", "x = 1\n".repeat(200_000));
    assert!(
        messages(&SecurityPolicy::strict(), &big)
            .iter()
            .any(|m| m.contains("more than the code policy analyses")),
        "a cell too large to analyse is refused"
    );
}

/// The policy's decoding of literals against Python's own: each literal, read by a real
/// `python3`, names an attribute that a rule forbids; the policy must see that name.
#[test]
fn literals_decode_exactly_as_python_decodes_them() {
    const PIECES: &[&str] = &[
        "a",
        "Z",
        "_",
        "\\x41",
        "\\x7a",
        "\\101",
        "\\7",
        "\\060",
        "\\u00e9",
        "\\U0001F600",
        "\\N{LATIN SMALL LETTER E}",
        "\\N{latin capital letter a}",
        "\\\\",
        "\\q",
        "\\'",
        "\\\"",
        "\\t",
        "\\\n",
        "{{",
        "}}",
        "é",
    ];
    const PREFIXES: &[&str] = &["", "r", "b", "rb", "f", "u", "Rb", "F"];
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    let mut literals = Vec::new();
    while literals.len() < 600 {
        let prefix = PREFIXES[next(PREFIXES.len())];
        let body: String = (0..1 + next(6))
            .map(|_| PIECES[next(PIECES.len())])
            .collect();
        let non_ascii = body.contains('é')
            || body.contains("\\u")
            || body.contains("\\U")
            || body.contains("\\N");
        if prefix.to_ascii_lowercase().contains('b') && non_ascii {
            continue; // not a valid bytes literal
        }
        literals.push(format!("{prefix}'{body}'"));
    }
    let script = "import ast, json, sys\n\
        out = []\n\
        for lit in json.load(sys.stdin):\n\
        \x20   v = ast.literal_eval(lit) if not lit.lower().startswith(('f', 'rf')) else eval(lit)\n\
        \x20   out.append(v.decode('latin-1') if isinstance(v, bytes) else v)\n\
        json.dump(out, sys.stdout)\n";
    let values: Vec<String> = cave_testing::python::ask(script, &literals);
    for (literal, value) in literals.iter().zip(&values) {
        let policy = SecurityPolicy::new().deny_attributes([value.as_str()], None);
        let cell = format!("getattr(x, {literal})");
        assert!(
            blocked(&policy, &cell),
            "{literal} is {value:?} to Python; the policy read it otherwise"
        );
    }
}

#[test]
fn violations_say_which_rule_fired() {
    use cave_core::ViolationKind;
    let policy = SecurityPolicy::strict()
        .deny_regex(r"rm\s+-rf", Some("no deletions"))
        .unwrap();
    let found =
        policy.check("import os.path\nf = eval\nx.__globals__\ngetattr(x, name)\ns = 'rm -rf /'");
    let kinds: Vec<(ViolationKind, Option<&str>)> =
        found.iter().map(|v| (v.kind, v.rule.as_deref())).collect();
    for expected in [
        (ViolationKind::Pattern, Some(r"rm\s+-rf")),
        (ViolationKind::Import, Some("os")),
        (ViolationKind::Call, Some("eval")),
        (ViolationKind::Attribute, Some("__globals__")),
        (ViolationKind::ComputedName, None),
    ] {
        assert!(kinds.contains(&expected), "{expected:?} in {kinds:?}");
    }
    let broken = policy.check("eval(");
    assert_eq!(broken[0].kind, ViolationKind::Syntax);
    let deep = policy.check(&format!("print(eval+{})", vec!["'a'"; 5000].join("+")));
    assert!(deep.iter().any(|v| v.kind == ViolationKind::TooComplex));
}

/// Cells that import a forbidden module or reach a forbidden name by string (a door, a
/// namespace indexed, a dynamic import, `attrgetter`, `methodcaller`), written with every spacing Python allows between
/// tokens (joined lines, comments, form feeds, a lone `\r`) and every literal form: each one a
/// real `python3` compiles and finds reaching a forbidden name in its own tree, the policy
/// must refuse, under a policy that lets computed names be (where a misread argument is not
/// caught as computed).
#[test]
fn every_name_python_reaches_is_refused() {
    const SPACES: &[&str] = &["", " ", "\t", "\x0c", "\\\n", "\n", "#c\n", "\r", "\\\r\n"];
    const FIRST: &[&str] = &[
        "a",
        "a.b",
        "a[0]",
        "a(1)",
        "a[b(c[1], d)][-1]",
        "a(*b)",
        "(a)",
        "a . b",
        "a['k']",
    ];
    const DOORS: &[&str] = &[
        "getattr",
        "hasattr",
        "delattr",
        "x.getattr",
        "inspect.getattr_static",
    ];
    const NAMESPACES: &[&str] = &[
        "globals()",
        "vars()",
        "__builtins__",
        "x.__dict__",
        "vars(x)",
    ];
    const MODULES: &[&str] = &["os", "os{W}.{W}path", "os.path{W}.{W}sep"];
    // `{S}` is a literal that reaches the template's name, `{W}` a spacing.
    const TEMPLATES: &[(&str, &str)] = &[
        ("{D}({W}{A}{W},{W}{S}{W})", "__globals__"),
        ("v = {D}({A},{S}, None).sum() / len(y)", "__globals__"),
        (
            "if 1:\n    w = [{D}({A}, {S}{W}) for q in r]",
            "__globals__",
        ),
        ("{N}[{W}{S}{W}]", "eval"),
        ("v = {N}[{S}](1)", "eval"),
        ("__import__({W}{S}{W})", "os"),
        ("importlib.import_module({W}{S})", "os"),
        ("operator.attrgetter('a', {W}{S}{W})", "__globals__"),
        ("methodcaller({W}{S}{W}, 1)", "eval"),
        // Imports: `{M}` is a module, its parts spaced.
        ("import {M}", ""),
        ("import a,{W}{M} as b", ""),
        ("from {M} import (x,{W}y)", ""),
    ];
    let forms = |word: &str| -> Vec<String> {
        let (a, b) = word.split_at(word.len() / 2);
        vec![
            format!("'{word}'"),
            format!("\"{word}\""),
            format!("'{a}' '{b}'"),
            format!("'{a}' + '{b}'"),
            format!("r'{word}'"),
            format!("f'{word}'"),
            format!("('{word}')"),
            format!("'{a}'\\\n'{b}'"),
            format!("'{a}' f'{b}'"),
            format!("'''{word}'''"),
            format!("'{a}'{{W}}+{{W}}'{b}'"),
            format!("({{W}}'{a}'{{W}}'{b}'{{W}})"),
        ]
    };
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    let mut cells = std::collections::BTreeSet::new();
    while cells.len() < 4000 {
        let (template, word) = TEMPLATES[next(TEMPLATES.len())];
        let literals = forms(word);
        let mut cell = template.replace("{S}", &literals[next(literals.len())]);
        for (hole, pool) in [
            ("{D}", DOORS),
            ("{A}", FIRST),
            ("{N}", NAMESPACES),
            ("{M}", MODULES),
            ("{W}", SPACES),
        ] {
            while let Some(at) = cell.find(hole) {
                cell.replace_range(at..at + hole.len(), pool[next(pool.len())]);
            }
        }
        cells.insert(cell);
    }
    let cells: Vec<String> = cells.into_iter().collect();
    // Python's verdict: the cell compiles, and its tree reaches a forbidden name by a string
    // Python folds from literals.
    let script = r#"
import ast, json, sys
def fold(n):
    if isinstance(n, ast.Constant) and isinstance(n.value, str): return n.value
    if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add):
        l, r = fold(n.left), fold(n.right)
        return None if l is None or r is None else l + r
    if isinstance(n, ast.JoinedStr):
        parts = [fold(v) for v in n.values]
        return None if None in parts else "".join(parts)
def name(f):
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
def reaches(tree):
    for n in ast.walk(tree):
        if isinstance(n, ast.Import) and any(a.name.split(".")[0] == "os" for a in n.names): return True
        if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module.split(".")[0] == "os": return True
        if isinstance(n, ast.Subscript):
            v = n.value
            if ((isinstance(v, ast.Call) and name(v.func) in ("globals", "vars"))
                    or (isinstance(v, ast.Name) and v.id == "__builtins__")
                    or (isinstance(v, ast.Attribute) and v.attr == "__dict__")) and fold(n.slice) == "eval":
                return True
        if isinstance(n, ast.Call):
            f, args = name(n.func), [fold(a) for a in n.args]
            if f in ("getattr", "hasattr", "delattr", "getattr_static") and args[1:2] == ["__globals__"]: return True
            if f in ("__import__", "import_module") and args[:1] == ["os"]: return True
            if f == "attrgetter" and "__globals__" in args: return True
            if f == "methodcaller" and args[:1] == ["eval"]: return True
    return False
out = []
for cell in json.load(sys.stdin):
    try:
        out.append(reaches(compile(cell, "<cell>", "exec", ast.PyCF_ONLY_AST)))
    except (SyntaxError, ValueError):
        out.append(None)
json.dump(out, sys.stdout)
"#;
    let verdicts: Vec<Option<bool>> = cave_testing::python::ask(script, &cells);
    let policy = SecurityPolicy::new()
        .deny_imports(["os"], None)
        .deny_calls(["eval"], None)
        .deny_attributes(["__globals__"], None);
    let reaching: Vec<&String> = cells
        .iter()
        .zip(&verdicts)
        .filter(|(_, verdict)| **verdict == Some(true))
        .map(|(cell, _)| cell)
        .collect();
    // The generator must keep producing what it tests.
    assert!(
        reaching.len() > 1500,
        "{} cells reach a name",
        reaching.len()
    );
    let missed: Vec<&&String> = reaching
        .iter()
        .filter(|cell| !blocked(&policy, cell))
        .collect();
    assert!(
        missed.is_empty(),
        "{} let through, such as {:?}",
        missed.len(),
        &missed[..missed.len().min(5)]
    );
}
