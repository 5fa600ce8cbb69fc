//! Resources as the child builds them (specs).

use crate::marshal::Data;
use crate::worker::Callable;
use cave_core::{
    Entry, FunctionBody, Param, ParamDefault, Registry, Resource, RuntimeError, TypeSchema,
    TypeShape, Value,
};

fn text(s: &str) -> Value {
    Value::Str(s.to_owned())
}

fn optional(s: Option<&str>) -> Value {
    s.map_or(Value::None, text)
}

/// A parameter's or field's default as the executor takes it (`None` when there is none: the
/// flag beside it tells them apart). A default that exists only in Python cannot be sent.
fn host_default(
    resource: &str,
    what: &str,
    default: Option<&ParamDefault>,
) -> Result<Value, RuntimeError> {
    match default {
        Some(ParamDefault::Value(v)) => Ok(v.clone()),
        Some(_) => Err(RuntimeError::InvalidResource {
            name: resource.to_owned(),
            problem: format!(
                "'{what}' has a default that exists only in Python; declare host defaults as values"
            ),
        }),
        None => Ok(Value::None),
    }
}

/// `(name, kind, has_default, default)` per parameter, as the executor's `make_function`
/// takes them.
fn params(name: &str, params: &[Param]) -> Result<Value, RuntimeError> {
    let mut out = Vec::with_capacity(params.len());
    for p in params {
        let default = host_default(name, &p.name, p.default.as_ref())?;
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
                Some(Callable::Function(entry.name.clone(), host.clone())),
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
                    Value::Bool(m.property),
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
                Some(Callable::Object(entry.name.clone(), o.object.clone())),
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
                let default = host_default(name, &f.name, f.default.as_ref())?;
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
