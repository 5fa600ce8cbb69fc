//! What the host injects, what the model's code does with it, and what the host gets back.

use crate::execution::run;
use cave_core::RuntimeExt;
use cave_core::{Args, Function, HostError, ObjectBinding, Resources, Runtime, Signature};
use cave_runtime_inproc::InProcRuntime;
use cave_runtime_inproc::pyo3::prelude::*;
use cave_testing::contract::Light;
use std::collections::BTreeMap;
use std::sync::Arc;

/// `retrieve_object` hands back the very object the model changed (the rest of host objects'
/// behaviour is in the contract).
#[tokio::test]
async fn host_objects_keep_their_identity() {
    let light = Arc::new(Light::default());
    let rt = InProcRuntime::new().unwrap();
    rt.register(Resources::new().object(ObjectBinding::new("light", light.clone())))
        .await
        .unwrap();
    assert_eq!(
        run(&rt, "light.dim(40)\nlight.level()").await.output,
        "40\n"
    );
    let back: Arc<Light> = rt.retrieve_object("light").await.unwrap();
    assert!(Arc::ptr_eq(&back, &light));
    assert_eq!(back.log.lock().unwrap().as_slice(), ["dim", "level"]);
    // Rebinding the name means the host object is no longer there.
    run(&rt, "light = 'gone'").await;
    assert!(rt.retrieve_object::<Light>("light").await.is_err());
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

/// `name.py` holding `source`, in a directory of its own removed when the result is dropped.
fn python_file(name: &str, source: &str) -> PythonFile {
    let dir = cave_testing::TestDir::new(&format!("py-{name}"));
    let path = dir.join(format!("{name}.py"));
    std::fs::write(&path, source).unwrap();
    PythonFile { path, _dir: dir }
}

/// A Python file of a test, and the directory that holds it.
struct PythonFile {
    path: std::path::PathBuf,
    _dir: cave_testing::TestDir,
}

impl std::ops::Deref for PythonFile {
    type Target = std::path::Path;

    fn deref(&self) -> &std::path::Path {
        &self.path
    }
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
    let registered = rt.register_python_file(&path, false).await.unwrap();
    let names = registered.names();
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
        rt.register_python_file(&path, false).await.unwrap().names(),
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
    let err = rt.register_python_file(&path, false).await.unwrap_err();
    assert!(err.to_string().contains("SyntaxError"), "{err}");
    let err = rt
        .register_python_file(std::path::Path::new("/nonexistent/module.py"), false)
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
    let registered = rt.register_python_file(&path, false).await.unwrap();
    let names = registered.names();
    assert!(
        names.contains(&"Item") && names.contains(&"Config"),
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
    rt.register_python_file(&path, false).await.unwrap().names();
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
