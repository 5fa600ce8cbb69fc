//! `#[function]`, `#[object]` and `#[derive(PythonType)]` through both runtimes: the
//! signatures and docstrings the model reads, calls with defaults, records and enums both
//! ways, errors as Python exceptions, host objects whose state stays in the host.

use cave_agent::RuntimeExt;
use cave_agent::testing::contract::run;
use cave_agent::{
    HostError, InProcRuntime, KernelRuntime, ObjectBinding, PythonType, Resources, Runtime, Shared,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// A line of an order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, PythonType)]
struct Order {
    /// What is ordered.
    item: String,
    quantity: u32,
    /// Pence per unit, when known.
    unit_price: Option<i64>,
    colour: Colour,
}

/// A colour the shop sells.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, PythonType)]
enum Colour {
    Red,
    Blue,
}

/// The total of some orders, in pence.
///
/// # Arguments
/// * `orders` - the orders to add up
/// * `discount` - a percentage taken off the total
#[cave_agent::function]
fn total(orders: Vec<Order>, #[cave(default = 0)] discount: u8) -> i64 {
    let sum: i64 = orders
        .iter()
        .map(|o| i64::from(o.quantity) * o.unit_price.unwrap_or(0))
        .sum();
    sum * i64::from(100 - discount) / 100
}

/// Describes its arguments back.
#[cave_agent::function(name = "echo_shapes")]
async fn shapes(
    pair: (i64, String),
    weights: HashMap<String, f64>,
    tags: Option<Vec<String>>,
    by_colour: BTreeMap<String, Colour>,
    note: Option<String>,
) -> String {
    let mut weights: Vec<_> = weights.into_iter().collect();
    weights.sort_by(|a, b| a.0.cmp(&b.0));
    format!("{pair:?} {weights:?} {tags:?} {by_colour:?} {note:?}")
}

/// Makes an order.
#[cave_agent::function]
fn make_order(item: String, colour: Colour) -> Order {
    Order {
        item,
        quantity: 1,
        unit_price: None,
        colour,
    }
}

/// Fails with a plain Rust error.
#[cave_agent::function]
async fn fail(reason: String) -> Result<(), String> {
    Err(format!("could not: {reason}"))
}

/// Fails as a ValueError.
#[cave_agent::function]
fn check_level(level: i64) -> Result<i64, HostError> {
    if (0..=100).contains(&level) {
        Ok(level)
    } else {
        Err(HostError::new(
            "ValueError",
            format!("{level} is not a percentage"),
        ))
    }
}

/// A thermostat in the host.
#[cave_agent::object]
#[derive(Debug, Default)]
struct Thermostat {
    /// The target temperature, in °C.
    #[cave(get)]
    target: f64,
    #[cave(get)]
    mode: Option<Colour>,
    history: Vec<f64>,
}

#[cave_agent::object]
impl Thermostat {
    /// Sets the target.
    ///
    /// # Arguments
    /// * `degrees` - the new target, in °C
    pub fn set(&mut self, #[cave(default = 20.0)] degrees: f64) -> Result<f64, String> {
        if !(5.0..=30.0).contains(&degrees) {
            return Err(format!("{degrees} °C is outside 5..=30"));
        }
        self.history.push(self.target);
        self.target = degrees;
        Ok(degrees)
    }

    /// The targets set before this one.
    pub async fn history(&self) -> Vec<f64> {
        tokio::task::yield_now().await;
        self.history.clone()
    }

    /// Puts the thermostat in a colour mode.
    pub fn paint(&mut self, colour: Option<Colour>) {
        self.mode = colour;
    }

    /// Not for the model: no receiver.
    pub fn new() -> Self {
        Self::default()
    }

    fn internal(&self) -> usize {
        self.history.len()
    }
}

async fn register_all(rt: &dyn Runtime, thermostat: Arc<Shared<Thermostat>>) {
    rt.register(
        Resources::new()
            .function(total::function())
            .function(shapes::function())
            .function(make_order::function())
            .function(fail::function())
            .function(check_level::function())
            .object(ObjectBinding::new("thermostat", thermostat).with_description("the hall")),
    )
    .await
    .expect("registers");
}

/// Everything the model reads and does, on one runtime.
async fn check(rt: &dyn Runtime) {
    let thermostat = Shared::new(Thermostat::new());
    assert_eq!(thermostat.read().await.internal(), 0);
    register_all(rt, thermostat.clone()).await;

    // The prompt: signatures from the Rust parameters, docstrings from the doc comments.
    let description = rt.describe();
    let functions = description.functions.clone();
    assert!(
        functions.contains("total(orders: list[Order], discount: int = 0) -> int"),
        "{functions}"
    );
    assert!(
        functions.contains("Args:")
            && functions.contains("discount: a percentage taken off the total"),
        "{functions}"
    );
    assert!(
        functions.contains("echo_shapes(pair: tuple[int, str], weights: dict[str, float], tags: list[str] | None, by_colour: dict[str, Colour], note: str | None = None) -> str"),
        "{functions}"
    );
    assert!(
        functions.contains("fail(reason: str) -> None"),
        "{functions}"
    );
    let types = description.types.clone();
    assert!(types.contains("Thermostat"), "{types}");
    assert!(
        types.contains("target: float"),
        "properties are listed: {types}"
    );
    assert!(
        types.contains("set(degrees: float = 20.0) -> float"),
        "{types}"
    );
    assert!(
        !types.contains("internal") && !types.contains("new("),
        "{types}"
    );
    // Records and enums are bound for the code, not listed.
    assert!(!types.contains("unit_price"), "{types}");

    // Records and enums built in Python cross into Rust; defaults apply.
    let out = run(
        rt,
        "orders = [Order(item='tea', quantity=3, colour=Colour.Red, unit_price=250), Order('cup', 2, Colour.Blue)]\nprint(total(orders))\nprint(total(orders, discount=10))",
    )
    .await;
    assert_eq!(out.output, "750\n675\n", "{out:?}");
    // Plain dicts do too.
    let out = run(
        rt,
        "print(total([{'item': 'pot', 'quantity': 1, 'unit_price': 900, 'colour': 'Blue'}]))",
    )
    .await;
    assert_eq!(out.output, "900\n", "{out:?}");
    // A struct comes back as a dict; an enum as its member's name.
    let out = run(
        rt,
        "o = make_order('jug', Colour.Blue)\nprint(sorted(o.items()))",
    )
    .await;
    assert_eq!(
        out.output,
        "[('colour', 'Blue'), ('item', 'jug'), ('quantity', 1), ('unit_price', None)]\n",
        "{out:?}"
    );
    let out = run(
        rt,
        "print(echo_shapes((1, 'a'), {'y': 2.5, 'x': 1.0}, None, by_colour={'tea': Colour.Red}))",
    )
    .await;
    assert_eq!(
        out.output, "(1, \"a\") [(\"x\", 1.0), (\"y\", 2.5)] None {\"tea\": Red} None\n",
        "{out:?}"
    );
    // A wrong argument is a TypeError naming it.
    let out = run(rt, "total('not a list')").await;
    let error = out.error.expect("raises");
    assert_eq!(error.python_type, "TypeError", "{}", out.output);
    assert!(error.message.contains("orders"), "{}", error.message);

    // Errors: a Rust error is a RuntimeError with its message; a HostError keeps its type.
    let out = run(rt, "fail('fly')").await;
    let error = out.error.expect("raises");
    assert_eq!(
        (error.python_type.as_str(), error.message.as_str()),
        ("RuntimeError", "could not: fly")
    );
    let out = run(rt, "check_level(150)").await;
    let error = out.error.expect("raises");
    assert_eq!(
        (error.python_type.as_str(), error.message.as_str()),
        ("ValueError", "150 is not a percentage")
    );

    // The object: methods under the lock, properties read-only, state in the host.
    let out = run(
        rt,
        "print(thermostat.set(22.5))\nprint(thermostat.set())\nprint(thermostat.target)\nprint(thermostat.history())\nthermostat.paint(Colour.Red)\nprint(thermostat.mode)",
    )
    .await;
    assert_eq!(
        out.output, "22.5\n20.0\n20.0\n[0.0, 22.5]\nRed\n",
        "{out:?}"
    );
    let out = run(rt, "thermostat.set(99)").await;
    assert_eq!(
        out.error.map(|e| e.message),
        Some("99 °C is outside 5..=30".to_owned())
    );
    let out = run(rt, "thermostat.target = 3").await;
    assert_eq!(
        out.error.map(|e| e.python_type),
        Some("AttributeError".to_owned()),
        "a property cannot be set"
    );
    let out = run(
        rt,
        "print(thermostat.__doc__)\nprint(type(thermostat).set.__doc__)",
    )
    .await;
    assert!(
        out.output.starts_with("A thermostat in the host.\nSets the target.\n\nArgs:\n    degrees: the new target, in °C"),
        "{}",
        out.output
    );
    let state = thermostat.read().await;
    assert_eq!(state.target, 20.0);
    assert_eq!(state.history, vec![0.0, 22.5]);
    assert_eq!(state.mode, Some(Colour::Red));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn macros_on_the_in_process_runtime() {
    let rt = InProcRuntime::new().expect("embedded CPython");
    check(&rt).await;
    let again: Arc<Shared<Thermostat>> = rt.retrieve_object("thermostat").await.expect("bound");
    assert_eq!(again.read().await.target, 20.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn macros_on_the_kernel_runtime() {
    let rt = KernelRuntime::new().expect("a Python interpreter");
    check(&rt).await;
    let again: Arc<Shared<Thermostat>> = rt.retrieve_object("thermostat").await.expect("bound");
    assert_eq!(again.read().await.target, 20.0);
    rt.stop().await;
}

#[tokio::test]
async fn a_record_used_by_two_functions_registers_once() {
    let rt = InProcRuntime::new().expect("embedded CPython");
    rt.register(Resources::new().function(total::function()))
        .await
        .expect("first");
    // `make_order` brings `Order` and `Colour` again: the same types, so nothing to do.
    rt.register(Resources::new().function(make_order::function()))
        .await
        .expect("second");
    let out = run(&rt, "print(make_order('a', Colour.Red)['item'])").await;
    assert_eq!(out.output, "a\n");
    // Another resource called `Order` is still refused.
    let clash = rt
        .register(Resources::new().variable(cave_agent::Variable::new("Order", 1.into())))
        .await;
    assert!(clash.is_err());
}
