//! The registry: one namespace for every kind, all-or-nothing batches, and the prompt text.

use cave_core::{
    Args, Field, Function, HostError, HostObject, Method, NameProblem, ObjectBinding, Param,
    Registry, Resources, RuntimeError, Signature, TypeSchema, Value, Variable,
};
use std::sync::Arc;

fn add() -> Function {
    let sig = Signature::new([
        Param::new("a").annotated("int"),
        Param::new("b")
            .annotated("int")
            .default_value(Value::Int(2)),
    ])
    .returns("int");
    Function::host("add", sig, |args: Args| async move {
        Ok(Value::Int(args.get::<i128>("a")? + args.get::<i128>("b")?))
    })
    .with_description("adds")
    .with_doc("Add two numbers.\n\n    Returns the sum.")
}

struct Light;

#[async_trait::async_trait]
impl HostObject for Light {
    fn type_name(&self) -> &str {
        "Light"
    }
    fn doc(&self) -> Option<String> {
        Some("A smart light.".into())
    }
    fn methods(&self) -> Vec<Method> {
        let sig = Signature::new([Param::new("level")
            .annotated("int")
            .default_value(Value::Int(100))])
        .returns("str");
        vec![Method::new("turn_on", sig).with_doc("Turn it on.")]
    }
    async fn call(&self, _method: &str, _args: Args) -> Result<Value, HostError> {
        Ok(Value::None)
    }
}

#[test]
fn the_prompt_shows_each_kind() {
    let mut registry = Registry::new();
    let point = TypeSchema::record(
        "Point",
        [
            Field::new("x", "float"),
            Field::new("y", "float").default_value(Value::Float(0.0)),
            Field::new("label", "str")
                .default_value(Value::Str("origin".into()))
                .with_description("shown on maps"),
        ],
    )
    .with_doc("A point.");
    let color = TypeSchema::enumeration(
        "Color",
        [
            ("RED".to_owned(), Value::Str("r".into())),
            ("GREEN".to_owned(), Value::Int(2)),
        ],
    );
    let batch = Resources::new()
        .function(add())
        .variable(Variable::new("result", Value::None).with_description("store here"))
        .variable(Variable::new("nums", Value::List(vec![])))
        .object(ObjectBinding::new("light", Arc::new(Light)).with_description("the light"))
        .type_(point)
        .type_(color)
        .type_(TypeSchema::record("Hidden", []).hidden());
    registry.claim(batch).unwrap();
    let d = registry.describe();
    assert_eq!(
        d.functions,
        "- function: add(a: int, b: int = 2) -> int\n  description: adds\n  doc:\n    Add two numbers.\n    \n        Returns the sum."
    );
    assert_eq!(
        d.variables,
        "- name: light\n  type: Light\n  description: the light\n- name: result\n  type: NoneType\n  description: store here\n- name: nums\n  type: list"
    );
    assert_eq!(
        d.types,
        "Point:\n  doc: A point.\n  fields:\n    - x: float\n    - y: float = 0.0\n    - label: str = 'origin'  # shown on maps\n\
Color (Enum):\n  - RED = 'r'\n  - GREEN = 2\n\
Light:\n  doc: A smart light.\n  methods:\n    - turn_on(level: int = 100) -> str\n        Turn it on."
    );
    let empty = Registry::new().describe();
    assert_eq!(
        (
            empty.functions.as_str(),
            empty.variables.as_str(),
            empty.types.as_str()
        ),
        (
            "No functions available",
            "No variables available",
            "No types available"
        )
    );
}

#[test]
fn batches_are_all_or_nothing_across_kinds() {
    let mut registry = Registry::new();
    registry
        .claim(Resources::new().variable(Variable::new("x", Value::Int(1))))
        .unwrap();
    let err = registry
        .claim(
            Resources::new()
                .variable(Variable::new("y", Value::Int(1)))
                .function(Function::python("x", Signature::default(), "def x(): pass")),
        )
        .unwrap_err();
    assert!(
        matches!(&err, RuntimeError::Name(e) if e.problem == NameProblem::Exists),
        "{err}"
    );
    assert!(
        registry.variable("y").is_none(),
        "nothing of a failed batch is kept"
    );
    // Two spellings of one name after NFKC.
    registry
        .claim(Resources::new().variable(Variable::new("K", Value::Int(1))))
        .unwrap();
    let err = registry
        .claim(Resources::new().binding("\u{212a}", Value::None))
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("collides with the existing name 'K' after NFKC normalization"),
        "{err}"
    );
    // Within one batch too.
    assert!(
        registry
            .claim(
                Resources::new()
                    .binding("z", Value::None)
                    .binding("z", Value::None)
            )
            .is_err()
    );
    assert!(!registry.is_bound("z"));
}

#[test]
fn resources_must_fit_python() {
    let mut registry = Registry::new();
    let bad_field_order = TypeSchema::record(
        "P",
        [
            Field::new("a", "int").default_value(Value::Int(1)),
            Field::new("b", "int"),
        ],
    );
    let err = registry
        .claim(Resources::new().type_(bad_field_order))
        .unwrap_err();
    assert!(
        err.to_string().contains("put required fields first"),
        "{err}"
    );
    let bad_param = Function::python("f", Signature::new([Param::new("class")]), "");
    assert!(
        registry
            .claim(Resources::new().function(bad_param))
            .unwrap_err()
            .to_string()
            .contains("parameter 'class'")
    );
    let twice = Function::python("g", Signature::new([Param::new("a"), Param::new("a")]), "");
    assert!(registry.claim(Resources::new().function(twice)).is_err());
}

#[test]
fn updates_keep_the_declared_type() {
    let mut registry = Registry::new();
    registry
        .claim(
            Resources::new()
                .variable(Variable::new("n", Value::Int(1)))
                .variable(Variable::new("later", Value::None)),
        )
        .unwrap();
    registry.update_variable("n", Value::Bool(true)).unwrap();
    registry.update_variable("n", Value::None).unwrap();
    registry.update_variable("n", Value::Int(5)).unwrap();
    let err = registry
        .update_variable("n", Value::Str("x".into()))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "cannot update variable 'n': expected int, got str"
    );
    registry
        .update_variable("later", Value::Str("anything".into()))
        .unwrap();
    let err = registry
        .update_variable("missing", Value::None)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("registered variables: [\"n\", \"later\"]"),
        "{err}"
    );
}

/// `registered` is `register` in an expression: the runtime back with the batch bound, or the
/// registration's own typed error.
#[tokio::test]
async fn a_runtime_is_built_with_its_resources_in_one_expression() {
    use cave_core::RuntimeExt;
    let runtime = cave_testing::EchoRuntime::new()
        .registered(Resources::new().variable(Variable::new("limit", Value::Int(3))))
        .await
        .unwrap();
    assert_eq!(runtime.retrieve("limit").await.unwrap(), Value::Int(3));
    let refused = cave_testing::EchoRuntime::new()
        .registered(Resources::new().variable(Variable::new("class", Value::Int(1))))
        .await
        .unwrap_err();
    assert!(matches!(refused, RuntimeError::Name(_)), "{refused:?}");
}
