//! Resources as the child builds them (specs), and a Python file's exports as resources.

use crate::marshal::Data;
use crate::process::Callable;
use cave_core::{
    Entry, Field, Function, FunctionBody, Method, Param, ParamDefault, ParamKind, Registry,
    Resource, Resources, RuntimeError, Signature, TypeSchema, TypeShape, Value, Variable,
};

fn text(s: &str) -> Value {
    Value::Str(s.to_owned())
}

fn optional(s: Option<&str>) -> Value {
    s.map_or(Value::None, text)
}

/// `(name, kind, has_default, default)` per parameter, as the executor's `make_function`
/// takes them.
fn params(name: &str, params: &[Param]) -> Result<Value, RuntimeError> {
    let mut out = Vec::with_capacity(params.len());
    for p in params {
        let default = match &p.default {
            Some(ParamDefault::Value(v)) => v.clone(),
            Some(_) => {
                return Err(RuntimeError::InvalidResource {
                    name: name.to_owned(),
                    problem: format!(
                        "'{}' has a default that exists only in Python; declare host defaults as values",
                        p.name
                    ),
                });
            }
            None => Value::None,
        };
        out.push(Value::Tuple(vec![
            text(&p.name),
            text(p.kind.as_str()),
            Value::Bool(p.default.is_some()),
            default,
        ]));
    }
    Ok(Value::List(out))
}

/// The spec the child binds for one registered entry, and the host callable it needs under
/// `handle`, if any. `owned`: the child loaded the object itself (from a Python file).
/// A variable's value is borrowed, not copied: it is encoded straight from the registry.
pub(crate) fn spec<'a>(
    entry: &'a Entry,
    registry: &Registry,
    handle: u64,
    owned: bool,
) -> Result<(Data<'a>, Option<Callable>), RuntimeError> {
    let name = text(&entry.name);
    if owned {
        return Ok((Data::Owned(Value::Tuple(vec![text("owned"), name])), None));
    }
    let handle_value = Value::Int(handle.into());
    let value_spec = |value: &'a Value, record: Option<&str>| {
        Data::Tuple(vec![
            Data::from("value"),
            Data::Owned(text(&entry.name)),
            Data::Borrowed(value),
            Data::Owned(optional(record)),
        ])
    };
    let (spec, callable) = match &entry.resource {
        Resource::Variable(v) => {
            let record = v.type_name.as_deref().filter(|t| {
                matches!(
                    registry.type_schema(t).map(|s| &s.shape),
                    Some(TypeShape::Fields(_))
                )
            });
            return Ok((value_spec(&v.value, record), None));
        }
        Resource::Binding { value, .. } => return Ok((value_spec(value, None), None)),
        Resource::Function(f) => match &f.body {
            FunctionBody::Host(host) => (
                Value::Tuple(vec![
                    text("function"),
                    name,
                    params(&entry.name, &f.signature.params)?,
                    optional(f.doc.as_deref()),
                    Value::Bool(f.is_async),
                    handle_value,
                ]),
                Some(Callable::Function(host.clone())),
            ),
            FunctionBody::Python(source) => {
                (Value::Tuple(vec![text("source"), name, text(source)]), None)
            }
            _ => (Value::Tuple(vec![text("owned"), name]), None),
        },
        Resource::Type(t) => (type_spec(&entry.name, t)?, None),
        Resource::Object(o) => {
            let mut methods = Vec::new();
            for m in o.object.methods() {
                methods.push(Value::Tuple(vec![
                    text(&m.name),
                    params(&entry.name, &m.signature.params)?,
                    optional(m.doc.as_deref()),
                ]));
            }
            (
                Value::Tuple(vec![
                    text("object"),
                    name,
                    text(o.object.type_name()),
                    optional(o.object.doc().as_deref()),
                    Value::List(methods),
                    handle_value,
                ]),
                Some(Callable::Object(o.object.clone())),
            )
        }
        _ => {
            return Err(RuntimeError::InvalidResource {
                name: entry.name.clone(),
                problem: "this resource kind is not supported by the kernel runtime".to_owned(),
            });
        }
    };
    Ok((Data::Owned(spec), callable))
}

fn type_spec(name: &str, t: &TypeSchema) -> Result<Value, RuntimeError> {
    Ok(match &t.shape {
        TypeShape::Fields(fields) => {
            let mut spec = Vec::with_capacity(fields.len());
            for f in fields {
                let default = match &f.default {
                    Some(ParamDefault::Value(v)) => v.clone(),
                    Some(_) => {
                        return Err(RuntimeError::InvalidResource {
                            name: name.to_owned(),
                            problem: format!(
                                "'{}' has a default that exists only in Python; declare host defaults as values",
                                f.name
                            ),
                        });
                    }
                    None => Value::None,
                };
                spec.push(Value::Tuple(vec![
                    text(&f.name),
                    text(&f.annotation),
                    Value::Bool(f.default.is_some()),
                    default,
                ]));
            }
            Value::Tuple(vec![
                text("record"),
                text(name),
                optional(t.doc.as_deref()),
                Value::List(spec),
            ])
        }
        TypeShape::Enum(members) => Value::Tuple(vec![
            text("enum"),
            text(name),
            optional(t.doc.as_deref()),
            Value::List(
                members
                    .iter()
                    .map(|(m, v)| Value::Tuple(vec![text(m), v.clone()]))
                    .collect(),
            ),
        ]),
        _ => Value::Tuple(vec![text("class"), text(name), optional(t.doc.as_deref())]),
    })
}

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
pub(crate) fn exports_to_resources(described: &Value, registry: &Registry) -> Resources {
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
