//! Values across the runtime seam, names, and signatures as Python shows them.

use cave_core::{
    NameKind, NameProblem, Param, ParamKind, Signature, Value, from_value, is_identifier, to_value,
    validate_name,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Point {
    x: f64,
    y: f64,
    tags: Vec<String>,
    label: Option<String>,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
enum Shape {
    Empty,
    Circle(f64),
    Rect { w: u32, h: u32 },
    Pair(i8, i8),
}

fn round_trip<T: Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug>(
    value: T,
) -> Value {
    let v = to_value(&value).unwrap();
    assert_eq!(from_value::<T>(v.clone()).unwrap(), value);
    v
}

#[test]
fn rust_values_round_trip() {
    assert_eq!(round_trip(42i64), Value::Int(42));
    assert_eq!(round_trip(u64::MAX), Value::Int(u64::MAX.into()));
    assert_eq!(round_trip(i128::MIN), Value::Int(i128::MIN));
    assert_eq!(
        round_trip((1u8, "a".to_owned())),
        Value::Tuple(vec![Value::Int(1), "a".into()])
    );
    assert_eq!(round_trip(Some(3u8)), Value::Int(3));
    assert_eq!(round_trip(None::<u8>), Value::None);
    assert_eq!(
        round_trip(serde_bytes_like()),
        Value::List((0..3).map(Value::Int).collect())
    );
    let nan = to_value(&f64::NAN).unwrap();
    assert!(matches!(nan, Value::Float(x) if x.is_nan()));
    assert!(from_value::<f64>(nan).unwrap().is_nan());
    assert_eq!(round_trip(f64::INFINITY), Value::Float(f64::INFINITY));
    let map: BTreeMap<i32, Vec<bool>> = [(1, vec![true]), (-2, vec![])].into();
    let v = round_trip(map);
    assert!(
        matches!(&v, Value::Dict(e) if e[0].0 == Value::Int(-2)),
        "int keys stay ints: {v:?}"
    );
    let p = Point {
        x: 1.0,
        y: -2.5,
        tags: vec!["a".into()],
        label: None,
    };
    let v = round_trip(p);
    assert_eq!(v.get("label"), Some(&Value::None));
    assert_eq!(round_trip(Shape::Empty), Value::Str("Empty".into()));
    assert_eq!(
        round_trip(Shape::Circle(1.5)),
        Value::Dict(vec![("Circle".into(), Value::Float(1.5))])
    );
    round_trip(Shape::Rect { w: 2, h: 3 });
    round_trip(Shape::Pair(-1, 1));
}

fn serde_bytes_like() -> Vec<i128> {
    vec![0, 1, 2]
}

#[test]
fn python_values_convert_where_rust_can_hold_them() {
    // Python code writes ints where floats are declared.
    assert_eq!(from_value::<f64>(Value::Int(3)).unwrap(), 3.0);
    assert_eq!(
        from_value::<Vec<u8>>(Value::Bytes(vec![1, 2])).unwrap(),
        [1, 2]
    );
    assert_eq!(
        from_value::<Vec<i32>>(Value::Set(vec![Value::Int(5)])).unwrap(),
        [5]
    );
    let nested = Value::Dict(vec![(
        Value::Int(1),
        Value::Dict(vec![("k".into(), Value::Tuple(vec![Value::Bool(true)]))]),
    )]);
    let back: BTreeMap<i64, BTreeMap<String, (bool,)>> = from_value(nested).unwrap();
    assert_eq!(back[&1]["k"], (true,));
    // Any self-describing format deserializes into a Value.
    let v: Value = serde_json::from_str(r#"{"a":[1,2.5,null,"s"]}"#).unwrap();
    assert_eq!(
        v.get("a"),
        Some(&Value::List(vec![
            Value::Int(1),
            Value::Float(2.5),
            Value::None,
            "s".into()
        ]))
    );
}

#[test]
fn mismatches_name_what_was_found() {
    let err = from_value::<u8>(Value::Int(300)).unwrap_err().to_string();
    assert!(err.contains("300"), "{err}");
    let err = from_value::<Point>(Value::List(vec![]))
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "expected a dict of the fields of Point, found a Python list: []"
    );
    let err = from_value::<String>(Value::Float(1.5))
        .unwrap_err()
        .to_string();
    assert_eq!(err, "expected a str, found a Python float: 1.5");
    let err = from_value::<Shape>(Value::Int(1)).unwrap_err().to_string();
    assert!(err.contains("Python int"), "{err}");
    assert!(
        to_value(&u128::MAX)
            .unwrap_err()
            .to_string()
            .contains("does not fit")
    );
}

#[test]
fn values_print_as_python_reprs() {
    let cases = [
        (Value::None, "None"),
        (Value::Bool(true), "True"),
        (Value::Float(2.0), "2.0"),
        (Value::Float(0.1), "0.1"),
        (Value::Float(f64::NAN), "nan"),
        (Value::Float(f64::NEG_INFINITY), "-inf"),
        (Value::Str("it's".into()), "\"it's\""),
        (Value::Str("a'b\"c\n".into()), "'a\\'b\"c\\n'"),
        (Value::Bytes(b"a\x00'".to_vec()), "b'a\\x00\\''"),
        (Value::Tuple(vec![Value::Int(1)]), "(1,)"),
        (Value::Set(vec![]), "set()"),
        (
            Value::Dict(vec![(Value::Int(1), Value::List(vec![]))]),
            "{1: []}",
        ),
    ];
    for (value, repr) in cases {
        assert_eq!(value.to_string(), repr);
    }
}

#[test]
fn names_follow_python() {
    assert_eq!(validate_name(NameKind::Variable, "\u{212a}").unwrap(), "K");
    assert_eq!(validate_name(NameKind::Variable, "ｆｏｏ").unwrap(), "foo");
    for soft in ["match", "case", "type", "_", "数据"] {
        assert!(validate_name(NameKind::Variable, soft).is_ok(), "{soft}");
    }
    for (bad, problem) in [
        ("for", NameProblem::Keyword),
        ("None", NameProblem::Keyword),
    ] {
        assert_eq!(
            validate_name(NameKind::Function, bad).unwrap_err().problem,
            problem
        );
    }
    let err = validate_name(NameKind::Variable, "bad-name").unwrap_err();
    assert_eq!(
        err.to_string().split(':').next().unwrap(),
        "Variable 'bad-name' is not a Python identifier"
    );
    let err = validate_name(NameKind::Variable, "ﬁ-x").unwrap_err();
    assert!(
        err.to_string().contains("(it normalizes to 'fi-x')"),
        "{err}"
    );
    assert!(!is_identifier("1x") && !is_identifier("") && is_identifier("_1"));
}

#[test]
fn signatures_print_as_python_does() {
    let sig = Signature::new([
        Param::new("a").annotated("int"),
        Param::new("b")
            .annotated("int")
            .default_value(Value::Int(2)),
        Param::new("key")
            .default_value(Value::None)
            .kind(ParamKind::KeywordOnly),
    ])
    .returns("int");
    assert_eq!(sig.to_string(), "(a: int, b: int = 2, *, key=None) -> int");
    let sig = Signature::new([
        Param::new("obj").kind(ParamKind::PositionalOnly),
        Param::new("args").kind(ParamKind::VarPositional),
        Param::new("flag").kind(ParamKind::KeywordOnly),
        Param::new("kw").kind(ParamKind::VarKeyword),
    ]);
    assert_eq!(sig.to_string(), "(obj, /, *args, flag, **kw)");
    assert_eq!(Signature::default().to_string(), "()");
}
