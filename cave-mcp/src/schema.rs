//! A server's tools as Python methods: names made identifiers, signatures from each tool's
//! `inputSchema`, the description as the docstring. The schema comes from the server, so it is
//! read defensively: a bounded depth, and what is not understood left unannotated.

use cave_core::{Method, Param, Signature, Value, is_identifier, validate_name};
use serde_json::Value as Json;
use std::collections::HashSet;

/// How deep an annotation is read into nested schemas (`list[list[dict]]`).
const MAX_DEPTH: usize = 4;

/// The most keys of an output schema the method's doc lists.
const MAX_SHOWN_KEYS: usize = 64;

/// The most values an `enum` is shown with as a `Literal[...]`; a longer one is shown as its
/// type (the description still says what it takes).
const MAX_LITERALS: usize = 24;

/// One tool, as the runtime shows it.
#[derive(Clone, Debug)]
pub(crate) struct ToolMethod {
    /// The method's name (an identifier).
    pub(crate) python: String,
    /// The tool's name on the server.
    pub(crate) tool: String,
    /// Each parameter: its identifier and the property it stands for.
    pub(crate) params: Vec<(String, String)>,
    /// What the model sees.
    pub(crate) method: Method,
    /// The output schema is the official SDKs' wrapping of a value that is not an object
    /// (`{"result": value}`): the call returns the value.
    pub(crate) unwrap: bool,
}

/// `raw` as a Python identifier: other characters become `_`, a leading digit gets a `_`
/// before it, a keyword one after it; `taken` names are avoided with a number.
pub(crate) fn identifier(raw: &str, taken: &HashSet<String>) -> String {
    let mut name: String = raw
        .chars()
        .map(|c| {
            if c == '_'
                || c.is_ascii_alphanumeric()
                || (!c.is_ascii() && is_identifier(&format!("a{c}")))
            {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.is_empty() || !is_identifier(&name) {
        name.insert(0, '_');
    }
    if validate_name(cave_core::NameKind::Variable, &name).is_err() {
        name.push('_');
    }
    let mut unique = name.clone();
    let mut n = 2;
    while taken.contains(&unique) {
        unique = format!("{name}_{n}");
        n += 1;
    }
    unique
}

/// The method for a tool named `tool` with this description and `inputSchema`.
pub(crate) fn tool_method(
    tool: &str,
    description: Option<&str>,
    input_schema: &serde_json::Map<String, Json>,
    taken: &HashSet<String>,
    server: &str,
    output_schema: Option<&serde_json::Map<String, Json>>,
) -> ToolMethod {
    let python = identifier(tool, taken);
    let properties = input_schema
        .get("properties")
        .and_then(Json::as_object)
        .cloned()
        .unwrap_or_default();
    let required: Vec<&str> = input_schema
        .get("required")
        .and_then(Json::as_array)
        .map(|r| r.iter().filter_map(Json::as_str).collect())
        .unwrap_or_default();
    // Required parameters first (in the order the schema lists them), then the optional ones.
    let mut order: Vec<(&String, bool)> = Vec::new();
    for name in &required {
        if let Some((key, _)) = properties.get_key_value(*name) {
            order.push((key, true));
        }
    }
    for key in properties.keys() {
        if !required.contains(&key.as_str()) {
            order.push((key, false));
        }
    }
    let mut names = HashSet::new();
    let mut params = Vec::new();
    let mut signature = Vec::new();
    let mut docs = Vec::new();
    for (key, is_required) in order {
        let name = identifier(key, &names);
        names.insert(name.clone());
        let schema = &properties[key.as_str()];
        let mut param = Param::new(&name);
        // The schema's default, when the runtime can hold it (JSON's numbers, strings, lists
        // and objects all convert); `None` (the server's own default applies) otherwise.
        let default = (!is_required)
            .then(|| {
                schema
                    .get("default")
                    .and_then(|d| cave_core::to_value(d).ok())
            })
            .flatten()
            .filter(|d| *d != Value::None);
        if let Some(annotation) = annotation(schema, 0) {
            param = param.annotated(
                if is_required || default.is_some() || annotation.starts_with("Optional[") {
                    annotation
                } else {
                    format!("Optional[{annotation}]")
                },
            );
        }
        if !is_required {
            param = param.default_value(default.unwrap_or(Value::None));
        }
        signature.push(param);
        let described = schema.get("description").and_then(Json::as_str);
        let renamed = (name != *key).then(|| format!(" (`{key}`)"));
        if described.is_some() || renamed.is_some() {
            docs.push(format!(
                "    {name}{}: {}",
                renamed.unwrap_or_default(),
                described.unwrap_or("").trim()
            ));
        }
        params.push((name, key.clone()));
    }
    let mut doc = description.unwrap_or("").trim().to_owned();
    if !docs.is_empty() {
        doc.push_str("\n\nArgs:\n");
        doc.push_str(&docs.join("\n"));
    }
    let origin = if python == tool {
        format!("(MCP tool of the server `{server}`.)")
    } else {
        format!("(MCP tool `{tool}` of the server `{server}`.)")
    };
    doc = if doc.is_empty() {
        origin
    } else {
        format!("{doc}\n\n{origin}")
    };
    let mut signature = Signature::new(signature);
    let wrapped = output_schema.and_then(wrapped_result);
    // MCP output schemas are objects: a dict, whose keys the doc lists, unless it is the SDKs'
    // wrapping.
    let returns = match (output_schema, wrapped) {
        (_, Some(result)) => annotation(result, 0),
        (Some(_), None) => Some("dict".to_owned()),
        (None, None) => None,
    };
    if let Some(returns) = returns {
        signature = signature.returns(returns);
    }
    if let Some(keys) = output_schema
        .filter(|_| wrapped.is_none())
        .and_then(result_keys)
    {
        doc.push_str(&format!("\n\nReturns a dict: {keys}."));
    }
    let mut method = Method::new(&python, signature);
    method.doc = Some(doc);
    ToolMethod {
        python,
        tool: tool.to_owned(),
        params,
        method,
        unwrap: wrapped.is_some(),
    }
}

/// The keys of an object output schema with their annotations, those it may leave out marked:
/// `city: str, celsius: float, summary?: Optional[str]`. None without properties, or with
/// more than the doc lists.
fn result_keys(output: &serde_json::Map<String, Json>) -> Option<String> {
    let properties = output.get("properties")?.as_object()?;
    if properties.is_empty() || properties.len() > MAX_SHOWN_KEYS {
        return None;
    }
    let required: Vec<&str> = output
        .get("required")
        .and_then(Json::as_array)
        .map(|r| r.iter().filter_map(Json::as_str).collect())
        .unwrap_or_default();
    let keys: Vec<String> = properties
        .iter()
        .map(|(key, schema)| {
            // The key as the server spells it, quoted when it is not a plain word.
            let valid = validate_name(cave_core::NameKind::Variable, key).is_ok_and(|n| n == *key);
            let shown = if valid && is_identifier(key) {
                key.clone()
            } else {
                format!("{key:?}")
            };
            let optional = if required.contains(&key.as_str()) {
                ""
            } else {
                "?"
            };
            let annotation = annotation(schema, 0).unwrap_or_else(|| "object".to_owned());
            format!("{shown}{optional}: {annotation}")
        })
        .collect();
    Some(keys.join(", "))
}

/// The schema of the value inside the official SDKs' wrapping, when `output` is one: an
/// object whose one property, required, is `result` (the Python SDK returns a function's
/// `float`, `list[str]` or `None` as `{"result": ...}`, and describes it so).
pub(crate) fn wrapped_result(output: &serde_json::Map<String, Json>) -> Option<&Json> {
    let properties = output.get("properties")?.as_object()?;
    let required = output.get("required")?.as_array()?;
    (output.get("type").is_none_or(|t| t == "object")
        && properties.len() == 1
        && required.len() == 1
        && required[0] == "result")
        .then(|| properties.get("result"))
        .flatten()
}

/// The Python annotation for a JSON Schema, when it is one of the simple forms.
fn annotation(schema: &Json, depth: usize) -> Option<String> {
    if depth > MAX_DEPTH {
        return None;
    }
    let union = |types: Vec<Option<String>>| -> Option<String> {
        let mut types: Vec<String> = types.into_iter().collect::<Option<_>>()?;
        let nullable = types.iter().any(|t| t == "None");
        types.retain(|t| t != "None");
        types.dedup();
        let inner = match types.len() {
            0 => return Some("None".to_owned()),
            1 => types.remove(0),
            _ => format!("Union[{}]", types.join(", ")),
        };
        Some(if nullable {
            format!("Optional[{inner}]")
        } else {
            inner
        })
    };
    if let Some(literal) = literal(schema) {
        return Some(literal);
    }
    match schema.get("type") {
        Some(Json::String(kind)) => simple(kind, schema, depth),
        Some(Json::Array(kinds)) => union(
            kinds
                .iter()
                .map(|k| k.as_str().and_then(|k| simple(k, schema, depth)))
                .collect(),
        ),
        _ => {
            let alternatives = schema
                .get("anyOf")
                .or_else(|| schema.get("oneOf"))
                .and_then(Json::as_array)?;
            union(
                alternatives
                    .iter()
                    .map(|s| annotation(s, depth + 1))
                    .collect(),
            )
        }
    }
}

/// `Literal[...]` for a schema's `enum` (or `const`) of strings, integers, booleans and
/// nulls, up to `MAX_LITERALS` of them.
fn literal(schema: &Json) -> Option<String> {
    let values: Vec<&Json> = match (schema.get("enum"), schema.get("const")) {
        (Some(Json::Array(values)), _) => values.iter().collect(),
        (None, Some(value)) => vec![value],
        _ => return None,
    };
    if values.is_empty() || values.len() > MAX_LITERALS {
        return None;
    }
    let nullable = values.iter().any(|v| v.is_null());
    let shown: Vec<String> = values
        .into_iter()
        .filter(|v| !v.is_null())
        .map(|v| match v {
            Json::String(_) | Json::Bool(_) => cave_core::to_value(v).ok().map(|v| v.to_string()),
            Json::Number(n) if n.is_i64() || n.is_u64() => Some(n.to_string()),
            _ => None,
        })
        .collect::<Option<_>>()?;
    Some(match (shown.is_empty(), nullable) {
        (true, _) => "None".to_owned(),
        (false, true) => format!("Optional[Literal[{}]]", shown.join(", ")),
        (false, false) => format!("Literal[{}]", shown.join(", ")),
    })
}

fn simple(kind: &str, schema: &Json, depth: usize) -> Option<String> {
    Some(
        match kind {
            "string" => "str",
            "integer" => "int",
            "number" => "float",
            "boolean" => "bool",
            "null" => "None",
            "object" => "dict",
            "array" => {
                return Some(
                    match schema.get("items").and_then(|i| annotation(i, depth + 1)) {
                        Some(item) => format!("list[{item}]"),
                        None => "list".to_owned(),
                    },
                );
            }
            _ => return None,
        }
        .to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn method(tool: &str, schema: Json) -> ToolMethod {
        let Json::Object(schema) = schema else {
            panic!()
        };
        tool_method(
            tool,
            Some("Does it."),
            &schema,
            &HashSet::new(),
            "srv",
            None,
        )
    }

    fn shown(m: &ToolMethod) -> Vec<String> {
        m.method
            .signature
            .params
            .iter()
            .map(|p| {
                format!(
                    "{}: {}{}",
                    p.name,
                    p.annotation.as_deref().unwrap_or("?"),
                    if p.default.is_some() { " = None" } else { "" }
                )
            })
            .collect()
    }

    #[test]
    fn names_become_identifiers_and_keep_their_originals() {
        let none = HashSet::new();
        assert_eq!(identifier("get-time", &none), "get_time");
        assert_eq!(identifier("git.log", &none), "git_log");
        assert_eq!(identifier("2fa", &none), "_2fa");
        assert_eq!(identifier("class", &none), "class_");
        assert_eq!(identifier("", &none), "_");
        assert_eq!(identifier("héllo wörld", &none), "héllo_wörld");
        let taken = HashSet::from(["get_time".to_owned(), "get_time_2".to_owned()]);
        assert_eq!(identifier("get.time", &taken), "get_time_3");
        let m = method("get-time", json!({"type": "object"}));
        assert_eq!(m.python, "get_time");
        assert!(
            m.method
                .doc
                .as_deref()
                .unwrap()
                .ends_with("(MCP tool `get-time` of the server `srv`.)"),
            "{:?}",
            m.method.doc
        );
    }

    #[test]
    fn signatures_come_from_the_input_schema() {
        let m = method(
            "search",
            json!({
                "type": "object",
                "properties": {
                    "limit": {"type": "integer", "description": "How many."},
                    "query": {"type": "string"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "when": {"type": ["string", "null"]},
                    "filter": {"anyOf": [{"type": "object"}, {"type": "null"}]},
                    "odd-name": {"type": "boolean"},
                    "blob": {"$ref": "#/defs/x"}
                },
                "required": ["query", "limit"]
            }),
        );
        assert_eq!(
            shown(&m),
            [
                "query: str",
                "limit: int",
                "blob: ? = None",
                "filter: Optional[dict] = None",
                "odd_name: Optional[bool] = None",
                "tags: Optional[list[str]] = None",
                "when: Optional[str] = None",
            ]
        );
        assert_eq!(m.params[4], ("odd_name".to_owned(), "odd-name".to_owned()));
        let doc = m.method.doc.unwrap();
        assert!(
            doc.starts_with("Does it.\n\nArgs:\n    limit: How many.\n    odd_name (`odd-name`): "),
            "{doc}"
        );
    }

    #[test]
    fn enums_defaults_and_results_are_typed() {
        let Json::Object(input) = json!({
            "type": "object",
            "properties": {
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                "days": {"type": "integer", "default": 3},
                "level": {"enum": [1, 2, null]},
                "mode": {"const": "fast"},
                "many": {"type": "string", "enum": (0..30).map(|i| i.to_string()).collect::<Vec<_>>()}
            },
            "required": ["mode"]
        }) else {
            panic!()
        };
        let Json::Object(wrapped) = json!({
            "type": "object",
            "title": "forecastOutput",
            "properties": {"result": {"type": "array", "items": {"type": "number"}}},
            "required": ["result"]
        }) else {
            panic!()
        };
        let m = tool_method(
            "forecast",
            None,
            &input,
            &HashSet::new(),
            "srv",
            Some(&wrapped),
        );
        assert_eq!(
            shown(&m),
            [
                "mode: Literal['fast']",
                "days: int = None",
                "level: Optional[Literal[1, 2]] = None",
                "many: Optional[str] = None",
                "unit: Literal['celsius', 'fahrenheit'] = None",
            ]
        );
        let defaults: Vec<Option<String>> = m
            .method
            .signature
            .params
            .iter()
            .map(|p| match &p.default {
                Some(cave_core::ParamDefault::Value(v)) => Some(v.to_string()),
                _ => None,
            })
            .collect();
        assert_eq!(
            defaults,
            [
                None,
                Some("3".into()),
                Some("None".into()),
                Some("None".into()),
                Some("'celsius'".into())
            ]
        );
        assert!(m.unwrap);
        assert_eq!(m.method.signature.returns.as_deref(), Some("list[float]"));
        // An object that is not the wrapping stays a dict.
        let Json::Object(record) = json!({
            "type": "object",
            "properties": {"result": {"type": "number"}, "unit": {"type": "string"}},
            "required": ["result"]
        }) else {
            panic!()
        };
        let m = tool_method("t", None, &input, &HashSet::new(), "srv", Some(&record));
        assert!(!m.unwrap);
        assert_eq!(m.method.signature.returns.as_deref(), Some("dict"));
        let doc = m.method.doc.clone().unwrap_or_default();
        assert!(
            doc.contains("\n\nReturns a dict: result: float, unit?: str."),
            "{doc}"
        );
        // Keys that are not plain words are quoted, as the result spells them.
        let Json::Object(odd) = json!({
            "type": "object",
            "properties": {"first-name": {"type": "string"}, "class": {"type": "string"}},
            "required": ["class"]
        }) else {
            panic!()
        };
        let m = tool_method("t", None, &input, &HashSet::new(), "srv", Some(&odd));
        let doc = m.method.doc.clone().unwrap_or_default();
        assert!(
            doc.contains("Returns a dict: \"class\": str, \"first-name\"?: str."),
            "{doc}"
        );
        let m = tool_method("t", None, &input, &HashSet::new(), "srv", None);
        assert_eq!(m.method.signature.returns, None);
    }

    #[test]
    fn hostile_schemas_are_bounded() {
        let mut deep = json!({"type": "string"});
        for _ in 0..100 {
            deep = json!({"type": "array", "items": deep});
        }
        let m = method(
            "t",
            json!({"properties": {"x": deep, "y": 5, "z": {"type": 7}}, "required": ["x", "missing", 3]}),
        );
        assert_eq!(
            shown(&m),
            [
                "x: list[list[list[list[list]]]]",
                "y: ? = None",
                "z: ? = None"
            ]
        );
    }
}
