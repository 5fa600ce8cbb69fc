//! What the host injects, what the model's code does with it, and what the host gets back.

use crate::execution::run;
use cave_core::{
    Args, Field, Function, HostError, HostObject, Method, ObjectBinding, Param, ParamKind,
    Resources, Runtime, RuntimeError, RuntimeExt, Signature, TypeSchema, Value, Variable,
};
use cave_runtime_inproc::InProcRuntime;
use cave_runtime_inproc::pyo3::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

fn reverse() -> Function {
    let sig = Signature::new([Param::new("text").annotated("str")]).returns("str");
    Function::host("reverse", sig, |args: Args| async move {
        let text: String = args.get("text")?;
        Ok(Value::Str(text.chars().rev().collect()))
    })
    .with_doc("Reverse a string.")
}

#[tokio::test]
async fn values_round_trip_through_python() {
    let rt = InProcRuntime::new().unwrap();
    let nested: BTreeMap<i64, Vec<(String, f64)>> =
        [(1, vec![("a".to_owned(), 1.5)]), (-7, vec![])].into();
    let big = i128::from(u64::MAX) * 1000;
    let resources = Resources::new()
        .variable(Variable::new("small", Value::Int(42)))
        .variable(Variable::new("big", Value::Int(big)))
        .variable(Variable::new("nan", Value::Float(f64::NAN)))
        .variable(Variable::new("raw", Value::Bytes(vec![0, 255])))
        .variable(Variable::new(
            "pair",
            Value::Tuple(vec![Value::Int(1), "x".into()]),
        ))
        .variable(Variable::from_serialize("nested", &nested).unwrap())
        .variable(Variable::new("nothing", Value::None));
    rt.register(resources).await.unwrap();
    let out = run(&rt, "print(type(big).__name__, big % 1000, type(pair).__name__, sorted(nested), raw[1], nan != nan)").await;
    assert_eq!(out.output, "int 0 tuple [-7, 1] 255 True\n");
    assert_eq!(rt.retrieve_as::<i128>("big").await.unwrap(), big);
    assert!(rt.retrieve_as::<f64>("nan").await.unwrap().is_nan());
    assert_eq!(rt.retrieve_as::<Vec<u8>>("raw").await.unwrap(), [0, 255]);
    assert_eq!(
        rt.retrieve_as::<(i64, String)>("pair").await.unwrap(),
        (1, "x".to_owned())
    );
    assert_eq!(
        rt.retrieve_as::<BTreeMap<i64, Vec<(String, f64)>>>("nested")
            .await
            .unwrap(),
        nested
    );
    // None is a value, not absence.
    assert_eq!(rt.retrieve("nothing").await.unwrap(), Value::None);
    // The model changes them; the host sees the change.
    run(
        &rt,
        "nested[2] = [('b', 2)]\nsmall += 1\nsets = {1, 2}\nhuge = 2 ** 200",
    )
    .await;
    assert_eq!(rt.retrieve_as::<i64>("small").await.unwrap(), 43);
    assert_eq!(
        rt.retrieve_as::<BTreeMap<i64, Vec<(String, f64)>>>("nested")
            .await
            .unwrap()
            .len(),
        3
    );
    assert_eq!(
        rt.get("sets").await.unwrap(),
        Value::Set(vec![Value::Int(1), Value::Int(2)])
    );
    let err = rt.get("huge").await.unwrap_err();
    assert!(
        err.to_string().contains("int larger than 128 bits"),
        "{err}"
    );
    let err = rt.retrieve("sets").await.unwrap_err();
    assert!(
        matches!(err, RuntimeError::UnknownVariable { .. }),
        "only registered variables are retrieved: {err}"
    );
    assert!(matches!(
        rt.get("missing").await.unwrap_err(),
        RuntimeError::Unbound { .. }
    ));
}

#[tokio::test]
async fn host_functions_have_real_signatures() {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let seen = calls.clone();
    let sig = Signature::new([
        Param::new("a").annotated("int"),
        Param::new("b")
            .annotated("int")
            .default_value(Value::Int(2)),
        Param::new("rest").kind(ParamKind::VarPositional),
        Param::new("scale")
            .default_value(Value::Int(1))
            .kind(ParamKind::KeywordOnly),
    ])
    .returns("int");
    let add = Function::host("add", sig, move |args: Args| {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push(args.values().to_vec());
            let (a, b, scale): (i64, i64, i64) =
                (args.get("a")?, args.get("b")?, args.get("scale")?);
            let rest: Vec<i64> = args.get("rest")?;
            Ok(Value::Int(
                ((a + b + rest.iter().sum::<i64>()) * scale).into(),
            ))
        }
    });
    let fail = Function::host("fail", Signature::default(), |_args: Args| async move {
        Err(HostError::new("ValueError", "the host says no"))
    });
    let rt = InProcRuntime::new().unwrap();
    rt.register(
        Resources::new()
            .function(add)
            .function(fail)
            .function(reverse()),
    )
    .await
    .unwrap();
    assert_eq!(run(&rt, "add(1)").await.output, "3\n");
    assert_eq!(run(&rt, "add(1, 2, 3, 4, scale=10)").await.output, "100\n");
    assert_eq!(run(&rt, "reverse(text='abc')").await.output, "'cba'\n");
    let out = run(&rt, "add()").await;
    assert!(
        out.output
            .ends_with("TypeError: add() missing 1 required positional argument: 'a'\n"),
        "{}",
        out.output
    );
    let out = run(&rt, "add(1, nope=2)").await;
    assert!(
        out.output
            .ends_with("TypeError: add() got an unexpected keyword argument 'nope'\n"),
        "{}",
        out.output
    );
    let out = run(
        &rt,
        "try:\n    fail()\nexcept ValueError as e:\n    print('caught', e)",
    )
    .await;
    assert_eq!(out.output, "caught the host says no\n");
    let out = run(&rt, "add('x')").await;
    assert!(
        out.output.contains("TypeError: argument 'a'"),
        "a Rust conversion error is a Python exception: {}",
        out.output
    );
    let out = run(&rt, "import inspect\nprint(inspect.signature(add))").await;
    assert_eq!(out.output, "(a, b=2, *rest, scale=1)\n");
    assert_eq!(calls.lock().unwrap().len(), 3);
    let prompt = rt.describe().functions;
    assert!(
        prompt.contains("- function: add(a: int, b: int = 2, *rest, scale=1) -> int"),
        "{prompt}"
    );
    assert!(
        prompt.contains("- function: reverse(text: str) -> str\n  doc:\n    Reverse a string."),
        "{prompt}"
    );
}

#[tokio::test]
async fn python_source_functions_are_bound_as_written() {
    let rt = InProcRuntime::new().unwrap();
    let sig = Signature::new([Param::new("n").annotated("int")]).returns("int");
    rt.register(
        Resources::new().function(
            Function::python("square", sig, "def square(n):\n    return n * n\n")
                .with_doc("Square it."),
        ),
    )
    .await
    .unwrap();
    assert_eq!(run(&rt, "square(7)").await.output, "49\n");
    // A batch with one bad entry binds nothing, and says why from `register` itself.
    let bad = Function::python("cube", Signature::default(), "def other(): pass");
    let err = rt
        .register(
            Resources::new()
                .variable(Variable::new("ok_before", Value::Int(1)))
                .function(bad)
                .variable(Variable::new("ok_after", Value::Int(2))),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, RuntimeError::InvalidResource { name, .. } if name == "cube")
            && err.to_string().contains("does not define 'cube'"),
        "{err}"
    );
    let names = run(
        &rt,
        "print([n for n in ('ok_before', 'ok_after', 'cube', 'other') if n in globals()])",
    )
    .await;
    assert_eq!(names.output, "[]\n", "nothing of the failed batch is bound");
    assert!(!rt.describe().variables.contains("ok_before"));
    // The runtime goes on, and a corrected batch can take the names.
    assert_eq!(run(&rt, "square(2)").await.output, "4\n");
    let fixed = Function::python(
        "cube",
        Signature::default(),
        "def cube(n):\n    return n ** 3",
    );
    rt.register(
        Resources::new()
            .function(fixed)
            .variable(Variable::new("ok_before", Value::Int(1))),
    )
    .await
    .unwrap();
    assert_eq!(run(&rt, "cube(2), ok_before").await.output, "(8, 1)\n");
    rt.reset().await.unwrap();
    assert_eq!(run(&rt, "cube(2), square(3)").await.output, "(8, 9)\n");
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Point {
    x: f64,
    y: f64,
    tags: Vec<String>,
}

#[tokio::test]
async fn generated_types_reach_host_functions_as_structs() {
    let point = TypeSchema::record(
        "Point",
        [
            Field::new("x", "float"),
            Field::new("y", "float").default_value(Value::Float(0.0)),
            Field::new("tags", "list[str]").default_value(Value::List(vec![])),
        ],
    )
    .with_doc("A point.");
    let color = TypeSchema::enumeration(
        "Color",
        [
            ("RED".to_owned(), "r".into()),
            ("GREEN".to_owned(), Value::Int(2)),
        ],
    );
    let received = Arc::new(Mutex::new(None));
    let sink = received.clone();
    let sig = Signature::new([Param::new("p").annotated("Point")]).returns("float");
    let norm = Function::host("norm", sig, move |args: Args| {
        let sink = sink.clone();
        async move {
            let p: Point = args.get("p")?;
            let n = (p.x * p.x + p.y * p.y).sqrt();
            *sink.lock().unwrap() = Some(p);
            Ok(Value::Float(n))
        }
    });
    let origin = Variable::from_serialize(
        "origin",
        &Point {
            x: 0.0,
            y: 0.0,
            tags: vec!["o".into()],
        },
    )
    .unwrap()
    .with_type_name("Point");
    let rt = InProcRuntime::new().unwrap();
    rt.register(
        Resources::new()
            .type_(point)
            .type_(color)
            .function(norm)
            .variable(origin),
    )
    .await
    .unwrap();
    assert_eq!(
        run(&rt, "norm(Point(3.0, 4.0, tags=['a']))").await.output,
        "5.0\n"
    );
    assert_eq!(
        *received.lock().unwrap(),
        Some(Point {
            x: 3.0,
            y: 4.0,
            tags: vec!["a".into()]
        })
    );
    assert_eq!(
        run(
            &rt,
            "type(origin).__name__, Color.RED.value, Point(1.0).tags"
        )
        .await
        .output,
        "('Point', 'r', [])\n"
    );
    run(&rt, "origin.x = 9.5").await;
    assert_eq!(
        rt.retrieve_as::<Point>("origin").await.unwrap(),
        Point {
            x: 9.5,
            y: 0.0,
            tags: vec!["o".into()]
        }
    );
    let types = rt.describe().types;
    assert!(types.starts_with("Point:\n  doc: A point.\n  fields:\n    - x: float\n    - y: float = 0.0\n    - tags: list[str] = []"), "{types}");
    assert!(
        types.contains("Color (Enum):\n  - RED = 'r'\n  - GREEN = 2"),
        "{types}"
    );
}

/// A Rust object the model operates.
#[derive(Default)]
struct Light {
    level: Mutex<i64>,
    log: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl HostObject for Light {
    fn type_name(&self) -> &str {
        "Light"
    }
    fn doc(&self) -> Option<String> {
        Some("A smart light.".into())
    }
    fn methods(&self) -> Vec<Method> {
        vec![
            Method::new(
                "dim",
                Signature::new([Param::new("level")
                    .annotated("int")
                    .default_value(Value::Int(10))])
                .returns("int"),
            )
            .with_doc("Set the brightness."),
            Method::new("level", Signature::default().returns("int")),
        ]
    }
    async fn call(&self, method: &str, args: Args) -> Result<Value, HostError> {
        self.log.lock().unwrap().push(method.to_owned());
        match method {
            "dim" => {
                let level: i64 = args.get("level")?;
                if !(0..=100).contains(&level) {
                    return Err(HostError::new(
                        "ValueError",
                        format!("level {level} is outside 0..=100"),
                    ));
                }
                *self.level.lock().unwrap() = level;
                Ok(Value::Int(level.into()))
            }
            "level" => Ok(Value::Int((*self.level.lock().unwrap()).into())),
            other => Err(HostError::new(
                "AttributeError",
                format!("no method {other}"),
            )),
        }
    }
}

#[tokio::test]
async fn host_objects_keep_their_identity() {
    let light = Arc::new(Light::default());
    let rt = InProcRuntime::new().unwrap();
    rt.register(
        Resources::new()
            .object(ObjectBinding::new("light", light.clone()).with_description("the desk light")),
    )
    .await
    .unwrap();
    assert_eq!(
        run(&rt, "light.dim(40)\nlight.level()").await.output,
        "40\n"
    );
    let out = run(&rt, "light.dim(400)").await;
    assert!(
        out.output
            .ends_with("ValueError: level 400 is outside 0..=100\n"),
        "{}",
        out.output
    );
    assert_eq!(
        run(&rt, "isinstance(light, Light), light").await.output,
        "(True, <Light object (host)>)\n"
    );
    // The host holds the very object the model changed.
    assert_eq!(*light.level.lock().unwrap(), 40);
    let back: Arc<Light> = rt.retrieve_object("light").await.unwrap();
    assert!(Arc::ptr_eq(&back, &light));
    assert_eq!(back.log.lock().unwrap().as_slice(), ["dim", "level", "dim"]);
    let d = rt.describe();
    assert!(
        d.variables
            .contains("- name: light\n  type: Light\n  description: the desk light"),
        "{}",
        d.variables
    );
    assert!(d.types.contains("Light:\n  doc: A smart light.\n  methods:\n    - dim(level: int = 10) -> int\n        Set the brightness.\n    - level() -> int"), "{}", d.types);
    // Rebinding the name means the host object is no longer there.
    run(&rt, "light = 'gone'").await;
    assert!(rt.retrieve_object::<Light>("light").await.is_err());
}

#[tokio::test]
async fn reset_restores_what_was_registered() {
    let rt = InProcRuntime::new().unwrap();
    rt.register(
        Resources::new()
            .variable(Variable::new("count", Value::Int(1)))
            .function(reverse()),
    )
    .await
    .unwrap();
    run(&rt, "count = 5\nmine = 1").await;
    rt.update("count", Value::Int(7)).await.unwrap();
    let persisted = rt
        .bind_unique("_output", Value::Str("big".into()), 1)
        .await
        .unwrap();
    rt.reset().await.unwrap();
    assert_eq!(
        run(&rt, "'mine' in globals(), count, reverse('ab'), _output_1")
            .await
            .output,
        "(False, 7, 'ba', 'big')\n"
    );
    assert_eq!(persisted, "_output_1");
    let err = rt
        .update("count", Value::Str("x".into()))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "cannot update variable 'count': expected int, got str"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bind_unique_hands_out_distinct_names_under_concurrency() {
    let rt = Arc::new(InProcRuntime::new().unwrap());
    run(&rt, "_output_2 = 'made by the model'").await;
    rt.register(Resources::new().variable(Variable::new("_output_4", Value::None)))
        .await
        .unwrap();
    let tasks: Vec<_> = (0..25)
        .map(|i| {
            let rt = rt.clone();
            tokio::spawn(async move { rt.bind_unique("_output", Value::Int(i), 1).await.unwrap() })
        })
        .collect();
    let mut names = Vec::new();
    for task in tasks {
        names.push(task.await.unwrap());
    }
    let distinct: std::collections::BTreeSet<_> = names.iter().cloned().collect();
    assert_eq!(distinct.len(), 25);
    assert!(!distinct.contains("_output_2") && !distinct.contains("_output_4"));
    assert_eq!(run(&rt, "_output_2").await.output, "'made by the model'\n");
    // NFKC: the prefix is normalized as Python would.
    assert_eq!(
        rt.bind_unique("\u{212a}", Value::None, 1).await.unwrap(),
        "K_1"
    );
    assert!(rt.bind_unique("bad-name", Value::None, 1).await.is_err());
    assert!(matches!(
        rt.bind_unique("p", Value::None, 0).await.unwrap_err(),
        RuntimeError::InvalidStart
    ));
}

#[tokio::test]
async fn a_pandas_dataframe_is_shared_not_copied() {
    let rt = InProcRuntime::new().unwrap();
    let df = Python::attach(|py| -> PyResult<Py<PyAny>> {
        let pandas = py.import("pandas")?;
        let data = pyo3::types::PyDict::new(py);
        data.set_item("a", vec![1, 2, 3])?;
        data.set_item("b", vec![10, 20, 30])?;
        Ok(pandas.call_method1("DataFrame", (data,))?.unbind())
    })
    .expect("pandas is installed in the selected environment (see README)");
    rt.register_py("df", df, Some("sales by month"))
        .await
        .unwrap();
    assert!(
        rt.describe()
            .variables
            .contains("- name: df\n  type: DataFrame\n  description: sales by month")
    );
    let out = run(
        &rt,
        "df['c'] = df['a'] + df['b']\nprint(int(df['c'].sum()))",
    )
    .await;
    assert_eq!(out.output, "66\n", "{}", out.output);
    let live = rt.retrieve_py("df").await.unwrap();
    let (columns, sum): (Vec<String>, i64) = Python::attach(|py| -> PyResult<_> {
        let df = live.bind(py);
        Ok((
            df.getattr("columns")?.call_method0("tolist")?.extract()?,
            df.get_item("c")?.call_method0("sum")?.extract()?,
        ))
    })
    .unwrap();
    assert_eq!(
        (columns, sum),
        (vec!["a".to_owned(), "b".to_owned(), "c".to_owned()], 66)
    );
    // As data, through serde: a DataFrame is not a value, but its dict is.
    let err = rt.retrieve("df").await.unwrap_err();
    assert!(
        err.to_string().contains("holds a Python DataFrame"),
        "{err}"
    );
    run(&rt, "summary = df.to_dict('list')").await;
    let summary: BTreeMap<String, Vec<i64>> =
        cave_core::from_value(rt.get("summary").await.unwrap()).unwrap();
    assert_eq!(summary["c"], [11, 22, 33]);
}

fn python_file(name: &str, source: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("cave-py-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.py"));
    std::fs::write(&path, source).unwrap();
    path
}

#[tokio::test]
async fn a_caveagent_injection_module_registers_its_exports() {
    let path = python_file(
        "injection",
        r#"
from __future__ import annotations
from dataclasses import dataclass
from cave_agent.runtime import Function, Variable, Type

@dataclass
class Order:
    """An order."""
    item: str
    qty: int = 1

def total(orders: list[Order], tax: float = 0.2) -> float:
    """Sum the quantities, with tax."""
    return sum(o.qty for o in orders) * (1 + tax)

def helper():
    return "not exported"

__exports__ = [Function(total, description="totals orders"), Type(Order), Variable("orders", [Order("a", 2), Order("b")], "pending orders")]
"#,
    );
    let rt = InProcRuntime::new().unwrap();
    let names = rt.register_python_file(&path).await.unwrap();
    assert_eq!(names, ["Order", "total", "orders"]);
    assert_eq!(
        run(
            &rt,
            "round(total(orders), 2), total(orders + [Order('c', 3)], tax=0)"
        )
        .await
        .output,
        "(3.6, 6)\n"
    );
    assert_eq!(run(&rt, "'helper' in globals()").await.output, "False\n");
    let d = rt.describe();
    assert!(d.functions.contains("- function: total(orders: list[Order], tax: float = 0.2) -> float\n  description: totals orders\n  doc:\n    Sum the quantities, with tax."), "{}", d.functions);
    assert!(
        d.types
            .contains("Order:\n  doc: An order.\n  fields:\n    - item: str\n    - qty: int = 1"),
        "{}",
        d.types
    );
    assert!(
        d.variables
            .contains("- name: orders\n  type: list\n  description: pending orders"),
        "{}",
        d.variables
    );
    // The exports survive a reset; what the model made does not.
    run(&rt, "orders.append(Order('z'))\nmine = 1").await;
    rt.reset().await.unwrap();
    assert_eq!(
        run(&rt, "len(orders), 'mine' in globals(), total([])")
            .await
            .output,
        "(3, False, 0.0)\n"
    );
}

#[tokio::test]
async fn a_plain_module_exports_its_public_functions_and_classes() {
    let path = python_file(
        "plain",
        "import math\n\nclass Shape:\n    \"\"\"A shape.\"\"\"\n    def area(self, scale: float = 1.0) -> float:\n        \"\"\"The area.\"\"\"\n        return 1.0 * scale\n\ndef circle(r):\n    return math.pi * r * r\n\ndef _private():\n    pass\n",
    );
    let rt = InProcRuntime::new().unwrap();
    assert_eq!(
        rt.register_python_file(&path).await.unwrap(),
        ["Shape", "circle"]
    );
    assert_eq!(
        run(&rt, "round(circle(1), 3), Shape().area(2)")
            .await
            .output,
        "(3.142, 2.0)\n"
    );
    let d = rt.describe();
    assert!(
        d.functions.contains("- function: circle(r)"),
        "{}",
        d.functions
    );
    assert!(d.types.contains("Shape:\n  doc: A shape.\n  methods:\n    - area(scale: float = 1.0) -> float\n        The area."), "{}", d.types);
}

#[tokio::test]
async fn a_broken_module_is_refused_with_its_error() {
    let rt = InProcRuntime::new().unwrap();
    let path = python_file("broken", "def f(:\n    pass\n");
    let err = rt.register_python_file(&path).await.unwrap_err();
    assert!(err.to_string().contains("SyntaxError"), "{err}");
    let err = rt
        .register_python_file("/nonexistent/module.py")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("No such file"), "{err}");
    assert_eq!(run(&rt, "1").await.output, "1\n", "the runtime goes on");
}

#[tokio::test]
async fn a_host_function_calling_back_into_its_runtime_gets_an_error_not_a_hang() {
    let rt = InProcRuntime::new().unwrap();
    let inner = rt.clone();
    let callback = Function::host("peek", Signature::default(), move |_args: Args| {
        let rt = inner.clone();
        async move { rt.get("x").await.map_err(HostError::runtime) }
    });
    rt.register(Resources::new().function(callback))
        .await
        .unwrap();
    let out = run(
        &rt,
        "x = 1\ntry:\n    peek()\nexcept RuntimeError as e:\n    print('refused:', e)",
    )
    .await;
    assert!(
        out.output
            .starts_with("refused: the runtime failed during get: a host function called back"),
        "{}",
        out.output
    );
}

#[tokio::test]
async fn classes_used_by_exports_are_bound_without_being_shown() {
    let path = python_file(
        "autotypes",
        r#"
from dataclasses import dataclass
from typing import Optional
from cave_agent.runtime import Function, Variable

@dataclass
class Item:
    name: str
    qty: int = 1

@dataclass
class Config:
    verbose: bool = False

class Widget:
    pass

def count(items: list[Item], config: Optional[Config] = None) -> int:
    return sum(i.qty for i in items)

__exports__ = [Function(count), Variable("Widget", Widget(), "a widget instance keeps its name"), Variable("cfg", Config())]
"#,
    );
    let rt = InProcRuntime::new().unwrap();
    let names = rt.register_python_file(&path).await.unwrap();
    assert!(
        names.contains(&"Item".to_owned()) && names.contains(&"Config".to_owned()),
        "{names:?}"
    );
    assert_eq!(
        run(
            &rt,
            "count([Item('a', 2), Item('b')], Config(verbose=True))"
        )
        .await
        .output,
        "3\n"
    );
    assert_eq!(
        run(&rt, "type(Widget).__name__").await.output,
        "'Widget'\n",
        "an export is never displaced"
    );
    let types = rt.describe().types;
    assert!(
        !types.contains("Item") && !types.contains("Config"),
        "hidden from the prompt: {types}"
    );
}

/// `register_py` from several threads while cells run: every registration binds, and nothing
/// waits forever (it used to hold the runtime's state lock while attaching to the interpreter,
/// the reverse of the runtime thread's order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_objects_register_while_cells_run_without_deadlock() {
    let rt = InProcRuntime::new().unwrap();
    let cells = {
        let rt = rt.clone();
        tokio::spawn(async move {
            for i in 0..200 {
                let out = run(&rt, &format!("sum(range({i}))")).await;
                assert!(out.success(), "{}", out.output);
            }
        })
    };
    let mut registrations = Vec::new();
    for t in 0..4 {
        let rt = rt.clone();
        registrations.push(tokio::task::spawn_blocking(move || {
            let handle = tokio::runtime::Handle::current();
            for i in 0..25 {
                let object = Python::attach(|py| {
                    pyo3::types::PyList::new(py, [t, i])
                        .unwrap()
                        .into_any()
                        .unbind()
                });
                handle
                    .block_on(rt.register_py(&format!("obj_{t}_{i}"), object, None))
                    .unwrap();
            }
        }));
    }
    let all = async {
        cells.await.unwrap();
        for r in registrations {
            r.await.unwrap();
        }
    };
    // Generous: the work takes well under a second; only a deadlock takes this long.
    tokio::time::timeout(std::time::Duration::from_secs(120), all)
        .await
        .expect("registration and execution deadlocked");
    assert_eq!(run(&rt, "obj_3_24").await.output, "[3, 24]\n");
}

/// Nesting as deep as code can make it: a clear error both ways, never a crash.
#[tokio::test]
async fn deeply_nested_values_are_refused_both_ways() {
    let rt = InProcRuntime::new().unwrap();
    let out = run(
        &rt,
        "deep = []\nfor _ in range(100_000):\n    deep = [deep]\ndeep",
    )
    .await;
    assert!(
        out.output.contains("RecursionError"),
        "Python's own repr gives up cleanly: {}",
        out.output
    );
    let err = rt.get("deep").await.unwrap_err();
    assert!(
        matches!(&err, RuntimeError::Unsupported { python_type, .. } if python_type.contains("nested deeper")),
        "{err}"
    );
    let mut value = Value::Int(0);
    for _ in 0..600 {
        value = Value::List(vec![value]);
    }
    let err = rt
        .register(Resources::new().variable(Variable::new("from_host", value)))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("nested deeper than"), "{err}");
    assert_eq!(run(&rt, "'from_host' in globals()").await.output, "False\n");
}

/// A function Python defined is described parameter by parameter, like a host function:
/// one signature representation, with defaults that exist only in Python kept as their repr.
#[tokio::test]
async fn python_signatures_are_described_parameter_by_parameter() {
    let path = python_file(
        "signatures",
        r#"
import datetime
from dataclasses import dataclass

def since(day: datetime.date = datetime.date(2020, 1, 1), /, *names: str, scale=2.5, **extra) -> int:
    return 1

@dataclass
class Period:
    start: datetime.date = datetime.date(2020, 1, 1)
    days: int = 7
"#,
    );
    let rt = InProcRuntime::new().unwrap();
    rt.register_python_file(&path).await.unwrap();
    let types = rt.describe().types;
    assert!(
        types.contains("start: date = datetime.date(2020, 1, 1)")
            && types.contains("days: int = 7"),
        "a field default with no value form is kept as Python shows it: {types}"
    );
    let functions = rt.describe().functions;
    assert!(
        functions.contains(
            "since(day: date = datetime.date(2020, 1, 1), /, *names: str, scale=2.5, **extra) -> int"
        ),
        "{functions}"
    );
    let registry_signature = cave_core::Signature::unknown().to_string();
    assert_eq!(registry_signature, "(*args, **kwargs)");
}
