//! A Python file's exports, as the executor describes them (`describe_exports`: plain data),
//! turned into resources: one reading for both runtimes.

use cave_core::{
    Field, Function, Method, Param, ParamKind, Registry, Resources, Signature, TypeSchema,
    TypeShape, Value, Variable,
};

fn field<'a>(data: &'a Value, key: &str) -> Option<&'a Value> {
    data.get(key)
}

fn string(value: Option<&Value>) -> Option<String> {
    value.and_then(Value::as_str).map(str::to_owned)
}

fn items(value: Option<&Value>) -> &[Value] {
    match value {
        Some(Value::List(items) | Value::Tuple(items)) => items,
        _ => &[],
    }
}

/// A signature the executor described (`(params, returns)`, each parameter
/// `(name, kind, annotation, default repr)`); `(*args, **kwargs)` when Python could not.
fn signature(described: Option<&Value>) -> Signature {
    let Some(Value::Tuple(parts)) = described else {
        return Signature::unknown();
    };
    let mut signature = Signature::new(items(parts.first()).iter().filter_map(|p| {
        let p = items(Some(p));
        let name = string(p.first())?;
        let kind = string(p.get(1))
            .and_then(|k| ParamKind::from_name(&k))
            .unwrap_or_default();
        let mut param = Param::new(name).kind(kind);
        param.annotation = string(p.get(2));
        if let Some(repr) = string(p.get(3)) {
            param = param.default_repr(repr);
        }
        Some(param)
    }));
    signature.returns = string(parts.get(1));
    signature
}

/// What `load` described (a Python file's exports) as resources, with the name of each.
/// Classes needed but not exported (`hidden_type`) are skipped when the name is taken.
pub fn exports_to_resources(described: &Value, registry: &Registry) -> Resources {
    let mut resources = Resources::new();
    for export in items(Some(described)) {
        let parts = items(Some(export));
        let (Some(kind), Some(name)) = (string(parts.first()), string(parts.get(1))) else {
            continue;
        };
        let description = string(parts.get(2));
        let data = parts.get(3).cloned().unwrap_or_default();
        let doc = string(field(&data, "doc"));
        match kind.as_str() {
            "function" => {
                let mut f = Function::bound(name, signature(field(&data, "signature")));
                f.doc = doc;
                f.description = description;
                f.is_async = matches!(field(&data, "is_async"), Some(Value::Bool(true)));
                resources = resources.function(f);
            }
            "variable" => {
                let mut variable = match field(&data, "value") {
                    Some(value) => Variable::new(&name, value.clone()),
                    None => Variable::new(&name, Value::None)
                        .with_type_name(string(field(&data, "type")).unwrap_or_default()),
                };
                variable.description = description;
                resources = resources.variable(variable);
            }
            "hidden_type" => {
                if registry.is_bound(&cave_core::normalize_name(&name)) {
                    continue;
                }
                resources = resources.type_(type_schema(&name, &data, doc).hidden());
            }
            _ => {
                let mut schema = type_schema(&name, &data, doc);
                schema.description = description;
                resources = resources.type_(schema);
            }
        }
    }
    resources
}

fn type_schema(name: &str, data: &Value, doc: Option<String>) -> TypeSchema {
    let shape = if let Some(fields) = field(data, "fields") {
        TypeShape::Fields(
            items(Some(fields))
                .iter()
                .filter_map(|f| {
                    let f = items(Some(f));
                    let mut out = Field::new(string(f.first())?, string(f.get(1))?);
                    if matches!(f.get(2), Some(Value::Bool(true))) {
                        out = match string(f.get(4)) {
                            Some(repr) => out.default_repr(repr),
                            None => out.default_value(f.get(3).cloned().unwrap_or_default()),
                        };
                    }
                    Some(out)
                })
                .collect(),
        )
    } else if let Some(members) = field(data, "members") {
        TypeShape::Enum(
            items(Some(members))
                .iter()
                .filter_map(|m| {
                    let m = items(Some(m));
                    Some((string(m.first())?, m.get(1).cloned().unwrap_or_default()))
                })
                .collect(),
        )
    } else {
        TypeShape::Methods(
            items(field(data, "methods"))
                .iter()
                .filter_map(|m| {
                    let m = items(Some(m));
                    let mut method = Method::new(string(m.first())?, signature(m.get(1)));
                    method.doc = string(m.get(2));
                    Some(method)
                })
                .collect(),
        )
    };
    let mut schema = TypeSchema::with_shape(name, shape);
    schema.doc = doc;
    schema
}
