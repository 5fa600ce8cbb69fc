//! The registry both runtimes keep: what was registered, under which names, and how it reads
//! in the prompt. One set of naming rules for every backend.

use crate::{
    Function, NameError, NameKind, NameProblem, ObjectBinding, ParamKind, Resource, Resources,
    RuntimeError, TypeSchema, TypeShape, Value, Variable, is_identifier, normalize_name,
    validate_name,
};
use std::collections::BTreeSet;
use std::fmt::Write as _;

/// The registered resources rendered for the system prompt.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Description {
    /// The `<functions>` section.
    pub functions: String,
    /// The `<variables>` section.
    pub variables: String,
    /// The `<types>` section.
    pub types: String,
}

impl Description {
    /// A description from its three sections.
    pub fn new(
        functions: impl Into<String>,
        variables: impl Into<String>,
        types: impl Into<String>,
    ) -> Self {
        Self {
            functions: functions.into(),
            variables: variables.into(),
            types: types.into(),
        }
    }
}

/// A registered resource under its normalized name.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The name Python binds (NFKC-normalized).
    pub name: String,
    /// The resource, with its current value for a variable.
    pub resource: Resource,
}

/// The resources registered with a runtime.
///
/// [`claim`](Registry::claim) validates a whole batch before anything is recorded (names are
/// NFKC-normalized, must be identifiers and not hard keywords, and share one namespace across
/// kinds), so registration is all or nothing. The registry is what `reset` restores and what
/// [`describe`](Registry::describe) renders for the prompt.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    entries: Vec<Entry>,
    reserved: BTreeSet<String>,
    /// Values redacted like secret variables' without being bound (`(label, value)`).
    redacted: Vec<(String, String)>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Validates and records a batch; on any error nothing is recorded. Returns the new
    /// entries in binding order: types, functions, objects, variables, then bindings.
    pub fn claim(&mut self, batch: Resources) -> Result<Vec<Entry>, RuntimeError> {
        let rank = |r: &Resource| match r {
            Resource::Type(_) => 0,
            Resource::Function(_) => 1,
            Resource::Object(_) => 2,
            Resource::Variable(_) => 3,
            _ => 4,
        };
        let mut items = batch.into_items();
        items.sort_by_key(|r| rank(r));
        let mut claimed: Vec<Entry> = Vec::with_capacity(items.len());
        for resource in items {
            let name = validate_name(resource.kind(), resource.name())?;
            if let Resource::Type(t) = &resource {
                // A type a function or object brought along, registered before in the same
                // form (another function using the same record): nothing to do.
                let same = |e: &Entry| {
                    e.name == name && matches!(&e.resource, Resource::Type(o) if o == t)
                };
                if t.hidden && (self.entries.iter().any(same) || claimed.iter().any(same)) {
                    continue;
                }
            }
            let taken = self.is_bound(&name) || claimed.iter().any(|e| e.name == name);
            if taken {
                let problem = if name != resource.name() {
                    NameProblem::CollidesAfterNormalization {
                        existing: name.clone(),
                    }
                } else {
                    NameProblem::Exists
                };
                return Err(NameError {
                    kind: resource.kind(),
                    name: resource.name().to_owned(),
                    problem,
                }
                .into());
            }
            check_shape(&resource)?;
            claimed.push(Entry { name, resource });
        }
        self.entries.extend(claimed.iter().cloned());
        Ok(claimed)
    }

    /// Returns true if and only if `name` (normalized) is registered or reserved.
    pub fn is_bound(&self, name: &str) -> bool {
        self.reserved.contains(name) || self.entries.iter().any(|e| e.name == name)
    }

    /// Holds a name while a binding is being made; false if it is taken.
    pub fn reserve(&mut self, name: &str) -> bool {
        !self.is_bound(name) && self.reserved.insert(name.to_owned())
    }

    /// Releases a reserved name.
    pub fn release(&mut self, name: &str) {
        self.reserved.remove(name);
    }

    /// Records a hidden binding made by `bind_unique` (it survives `reset`).
    pub fn record_binding(&mut self, name: &str, value: Value) {
        self.reserved.remove(name);
        let resource = Resource::Binding {
            name: name.to_owned(),
            value,
        };
        self.entries.push(Entry {
            name: name.to_owned(),
            resource,
        });
    }

    /// The entry registered under `name` (normalized), if any.
    pub fn entry(&self, name: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.name == name)
    }

    /// Forgets a registered name (e.g. a resource the backend could not create).
    pub fn remove(&mut self, name: &str) -> Option<Entry> {
        let at = self.entries.iter().position(|e| e.name == name)?;
        Some(self.entries.remove(at))
    }

    /// Puts back entries [`remove`](Self::remove) took out (a replacement that failed).
    pub fn reinstate(&mut self, entries: Vec<Entry>) {
        for entry in entries {
            if !self.entries.iter().any(|e| e.name == entry.name) {
                self.entries.push(entry);
            }
        }
    }

    /// The `(name, value)` of every secret variable, and every value added with
    /// [`redact`](Self::redact), for redaction.
    pub fn secrets(&self) -> Vec<(String, String)> {
        self.entries
            .iter()
            .filter_map(|e| match &e.resource {
                Resource::Variable(v) if v.secret => match &v.value {
                    Value::Str(text) => Some((e.name.clone(), text.clone())),
                    _ => None,
                },
                _ => None,
            })
            .chain(self.redacted.iter().cloned())
            .collect()
    }

    /// Redacts `value` wherever secrets are (shown as `[redacted: LABEL]`) without binding it:
    /// a credential the host uses on the model's behalf (an MCP server's token) that a tool
    /// could echo back.
    pub fn redact(&mut self, label: impl Into<String>, value: impl Into<String>) {
        let value = value.into();
        if !self.redacted.iter().any(|(_, v)| *v == value) {
            self.redacted.push((label.into(), value));
        }
    }

    /// Every entry, in registration order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The registered variable called `name` (any spelling with the same NFKC form).
    pub fn variable(&self, name: &str) -> Option<&Variable> {
        let key = normalize_name(name);
        self.entries.iter().find_map(|e| match &e.resource {
            Resource::Variable(v) if e.name == key => Some(v),
            _ => None,
        })
    }

    /// The registered host object called `name`.
    pub fn object(&self, name: &str) -> Option<&ObjectBinding> {
        let key = normalize_name(name);
        self.entries.iter().find_map(|e| match &e.resource {
            Resource::Object(o) if e.name == key => Some(o),
            _ => None,
        })
    }

    /// The registered type called `name`.
    pub fn type_schema(&self, name: &str) -> Option<&TypeSchema> {
        self.entries.iter().find_map(|e| match &e.resource {
            Resource::Type(t) if e.name == name => Some(t),
            _ => None,
        })
    }

    /// The names of registered variables, in order.
    pub fn variable_names(&self) -> Vec<String> {
        self.entries
            .iter()
            .filter(|e| matches!(e.resource, Resource::Variable(_)))
            .map(|e| e.name.clone())
            .collect()
    }

    /// The error for a name that is not a registered variable (said not bound: the registry
    /// does not know the namespace; [`RuntimeExt::retrieve`](crate::RuntimeExt::retrieve)
    /// asks the runtime).
    fn unknown_variable(&self, name: &str) -> RuntimeError {
        RuntimeError::UnknownVariable {
            name: name.to_owned(),
            available: self.variable_names(),
            bound: false,
        }
    }

    /// Records a variable's new value after checking it against its declared type: `None` is
    /// always accepted; a variable declared by its value's type takes values of that type
    /// (`bool` counts as `int`, as in Python); an explicit `type_name` is not checked here.
    pub fn update_variable(&mut self, name: &str, value: Value) -> Result<String, RuntimeError> {
        let key = normalize_name(name);
        let unknown = self.unknown_variable(name);
        let variable = self
            .entries
            .iter_mut()
            .find_map(|e| match &mut e.resource {
                Resource::Variable(v) if e.name == key => Some(v),
                _ => None,
            })
            .ok_or(unknown)?;
        if variable.type_name.is_none() && value != Value::None && variable.value != Value::None {
            let expected = variable.value.python_type();
            let found = value.python_type();
            let compatible = expected == found || (expected == "int" && found == "bool");
            if !compatible {
                return Err(RuntimeError::TypeMismatch {
                    name: name.to_owned(),
                    expected: expected.to_owned(),
                    found: found.to_owned(),
                });
            }
        }
        if variable.secret
            && !matches!(&value, Value::Str(t) if t.chars().count() >= crate::MIN_SECRET_CHARS)
        {
            return Err(RuntimeError::InvalidResource {
                name: name.to_owned(),
                problem: format!(
                    "a secret stays a string of at least {} characters",
                    crate::MIN_SECRET_CHARS
                ),
            });
        }
        variable.value = value;
        Ok(key)
    }

    /// Whether a host function or object is registered and shown (what the model calls
    /// waits for the host).
    pub fn has_host_calls(&self) -> bool {
        self.entries.iter().any(|e| match &e.resource {
            Resource::Function(f) => !f.hidden && matches!(f.body, crate::FunctionBody::Host(_)),
            Resource::Object(_) => true,
            _ => false,
        })
    }

    /// Every function and method registered, for `search_tools` (hidden ones left out).
    pub fn tool_entries(&self) -> Vec<crate::ToolEntry> {
        let mut out = Vec::new();
        for entry in &self.entries {
            match &entry.resource {
                Resource::Function(f) if !f.hidden => {
                    let doc = [f.description.as_deref(), f.doc.as_deref()]
                        .into_iter()
                        .flatten()
                        .collect::<Vec<_>>()
                        .join("\n");
                    out.push(crate::ToolEntry::new(
                        entry.name.clone(),
                        f.signature.clone(),
                        doc,
                        String::new(),
                    ));
                }
                Resource::Object(o) => {
                    let object = format!(
                        "{} {} {}",
                        entry.name,
                        o.object.type_name(),
                        o.description.as_deref().unwrap_or("")
                    );
                    for m in o.object.methods() {
                        out.push(crate::ToolEntry::new(
                            format!("{}.{}", entry.name, m.name),
                            m.signature,
                            m.doc.unwrap_or_default(),
                            object.clone(),
                        ));
                    }
                }
                _ => {}
            }
        }
        out
    }

    /// The registered resources as prompt text, with tool search: each object named with its
    /// type, the first line of its doc and its number of methods, instead of every method;
    /// at most [`COMPACT_FUNCTIONS`] functions, a line each, without their docs. Variables and
    /// record and enum types are as [`describe`](Self::describe) shows them.
    pub fn describe_compact(&self) -> Description {
        self.describe_as(true)
    }

    /// The registered resources as prompt text.
    pub fn describe(&self) -> Description {
        self.describe_as(false)
    }

    fn describe_as(&self, compact: bool) -> Description {
        let mut functions = Vec::new();
        let mut more_functions = 0usize;
        let mut variables = Vec::new();
        let mut types = Vec::new();
        for entry in &self.entries {
            variables.extend(variable_line(entry));
            match &entry.resource {
                Resource::Function(f) if !f.hidden => {
                    if !compact {
                        functions.push(describe_function(&entry.name, f));
                    } else if functions.len() < COMPACT_FUNCTIONS {
                        functions.push(function_line(&entry.name, f));
                    } else {
                        more_functions += 1;
                    }
                }
                Resource::Object(o) => {
                    let text = if compact {
                        let summary = o
                            .object
                            .doc()
                            .and_then(|d| d.trim().lines().next().map(str::to_owned))
                            .unwrap_or_default();
                        crate::prompt::compact_object(
                            o.object.type_name(),
                            &summary,
                            o.object.methods().len(),
                        )
                    } else {
                        describe_type(&TypeSchema {
                            name: o.object.type_name().to_owned(),
                            doc: o.object.doc(),
                            description: None,
                            shape: TypeShape::Methods(o.object.methods()),
                            hidden: false,
                        })
                    };
                    if !types.contains(&text) {
                        types.push(text);
                    }
                }
                Resource::Type(t) if !t.hidden => types.push(describe_type(t)),
                _ => {}
            }
        }
        if more_functions > 0 {
            functions.push(crate::prompt::more_functions(more_functions));
        }
        sections(functions, variables, types)
    }
}

/// The `<variables>` line of a variable or host object (none for anything else).
fn variable_line(entry: &Entry) -> Option<String> {
    match &entry.resource {
        Resource::Variable(v) if !v.hidden => {
            let type_name = v.type_name.as_deref().unwrap_or(v.value.python_type());
            Some(describe_variable(
                &entry.name,
                type_name,
                v.description.as_deref(),
            ))
        }
        Resource::Object(o) => Some(describe_variable(
            &entry.name,
            o.object.type_name(),
            o.description.as_deref(),
        )),
        _ => None,
    }
}

/// How many functions a compact description lists (a line each); the rest are counted.
pub const COMPACT_FUNCTIONS: usize = 40;

/// The three sections, each with its line when empty.
fn sections(functions: Vec<String>, variables: Vec<String>, types: Vec<String>) -> Description {
    let section = |items: Vec<String>, empty: &str| {
        let items: Vec<String> = items.into_iter().filter(|s| !s.is_empty()).collect();
        if items.is_empty() {
            empty.to_owned()
        } else {
            items.join("\n")
        }
    };
    Description::new(
        section(functions, "No functions available"),
        section(variables, "No variables available"),
        section(types, "No types available"),
    )
}

/// Checks a `bind_unique` request and returns the prefix as Python binds it: `start` must be at
/// least 1 and `{prefix}_{start}` a usable name (so `bad-name` fails, and `\u{212a}` becomes `K`).
pub fn unique_prefix(prefix: &str, start: u64) -> Result<String, RuntimeError> {
    if start == 0 {
        return Err(RuntimeError::InvalidStart);
    }
    let suffix = format!("_{start}");
    let first = validate_name(NameKind::Prefix, &format!("{prefix}{suffix}"))?;
    Ok(first[..first.len() - suffix.len()].to_owned())
}

/// Checks what a resource declares beyond its name: parameter and field names, and that
/// fields without defaults come first (Python's dataclass rule).
fn check_shape(resource: &Resource) -> Result<(), RuntimeError> {
    let invalid = |problem: String| RuntimeError::InvalidResource {
        name: resource.name().to_owned(),
        problem,
    };
    let check_ident = |what: &str, name: &str| {
        if is_identifier(name) && validate_name(NameKind::Binding, name).is_ok() {
            Ok(())
        } else {
            Err(invalid(format!(
                "{what} '{name}' is not a usable Python identifier"
            )))
        }
    };
    let check_params = |params: &[crate::Param]| -> Result<(), RuntimeError> {
        let mut seen = BTreeSet::new();
        for p in params {
            check_ident("parameter", &p.name)?;
            if !seen.insert(p.name.as_str()) {
                return Err(invalid(format!("parameter '{}' appears twice", p.name)));
            }
        }
        Ok(())
    };
    match resource {
        Resource::Variable(v) if v.secret => match &v.value {
            Value::Str(text) if text.chars().count() >= crate::MIN_SECRET_CHARS => Ok(()),
            Value::Str(_) => Err(invalid(format!(
                "a secret needs at least {} characters to be told apart from ordinary output",
                crate::MIN_SECRET_CHARS
            ))),
            other => Err(invalid(format!(
                "a secret is a string, not {}",
                other.python_type()
            ))),
        },
        Resource::Function(f) => check_params(&f.signature.params),
        Resource::Object(o) => {
            for m in o.object.methods() {
                check_ident("method", &m.name)?;
                check_params(&m.signature.params)?;
            }
            Ok(())
        }
        Resource::Type(t) => match &t.shape {
            TypeShape::Fields(fields) => {
                let mut defaulted = false;
                for f in fields {
                    check_ident("field", &f.name)?;
                    if f.default.is_some() {
                        defaulted = true;
                    } else if defaulted {
                        return Err(invalid(format!(
                            "field '{}' has no default but follows a field with one; put required fields first",
                            f.name
                        )));
                    }
                }
                Ok(())
            }
            TypeShape::Enum(members) => members
                .iter()
                .try_for_each(|(m, _)| check_ident("member", m)),
            TypeShape::Methods(methods) => methods
                .iter()
                .try_for_each(|m| check_ident("method", &m.name)),
        },
        _ => Ok(()),
    }
}

fn push_doc(out: &mut String, indent: &str, doc: &str) {
    for line in doc.trim().lines() {
        out.push('\n');
        out.push_str(indent);
        out.push_str(line);
    }
}

/// A function's first line: its name and signature.
fn function_line(name: &str, f: &Function) -> String {
    format!(
        "- function: {}{name}{}",
        if f.is_async { "async " } else { "" },
        f.signature
    )
}

fn describe_function(name: &str, f: &Function) -> String {
    let mut out = function_line(name, f);
    if let Some(d) = &f.description {
        let _ = write!(out, "\n  description: {d}");
    }
    if let Some(doc) = f.doc.as_deref().filter(|d| !d.trim().is_empty()) {
        out.push_str("\n  doc:");
        push_doc(&mut out, "    ", doc);
    }
    out
}

fn describe_variable(name: &str, type_name: &str, description: Option<&str>) -> String {
    let mut out = format!("- name: {name}\n  type: {type_name}");
    if let Some(d) = description {
        let _ = write!(out, "\n  description: {d}");
    }
    out
}

fn describe_type(t: &TypeSchema) -> String {
    let mut out = match &t.shape {
        TypeShape::Enum(_) => format!("{} (Enum):", t.name),
        _ => format!("{}:", t.name),
    };
    if let Some(d) = &t.description {
        let _ = write!(out, "\n  description: {d}");
    }
    if let Some(doc) = t.doc.as_deref().filter(|d| !d.trim().is_empty())
        && !matches!(t.shape, TypeShape::Enum(_))
    {
        out.push_str("\n  doc:");
        let doc = doc.trim();
        if doc.contains('\n') {
            push_doc(&mut out, "    ", doc);
        } else {
            let _ = write!(out, " {doc}");
        }
    }
    match &t.shape {
        TypeShape::Fields(fields) => {
            out.push_str("\n  fields:");
            for f in fields {
                let _ = write!(out, "\n    - {}: {}", f.name, f.annotation);
                if let Some(d) = &f.default {
                    let _ = write!(out, " = {d}");
                }
                if let Some(d) = &f.description {
                    let _ = write!(out, "  # {d}");
                }
            }
        }
        TypeShape::Enum(members) => {
            for (m, v) in members {
                let _ = write!(out, "\n  - {m} = {v}");
            }
        }
        TypeShape::Methods(methods) => {
            let public: Vec<_> = methods
                .iter()
                .filter(|m| !m.name.starts_with('_'))
                .collect();
            if public.is_empty() {
                // A class with nothing to call has nothing to show.
                return String::new();
            }
            let (properties, public): (Vec<_>, Vec<_>) =
                public.into_iter().partition(|m| m.property);
            if !properties.is_empty() {
                out.push_str("\n  properties (read-only):");
                for p in properties {
                    let annotation = p.signature.returns.as_deref().unwrap_or("Any");
                    let _ = write!(out, "\n    - {}: {annotation}", p.name);
                    if let Some(doc) = p.doc.as_deref().filter(|d| !d.trim().is_empty()) {
                        push_doc(&mut out, "        ", doc);
                    }
                }
            }
            if public.is_empty() {
                return out;
            }
            out.push_str("\n  methods:");
            for m in public {
                let _ = write!(out, "\n    - {}{}", m.name, m.signature);
                if let Some(doc) = m.doc.as_deref().filter(|d| !d.trim().is_empty()) {
                    push_doc(&mut out, "        ", doc);
                }
            }
        }
    }
    out
}

impl ParamKind {
    /// The kind's name as the executor spells it (`positional_or_keyword`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            ParamKind::PositionalOrKeyword => "positional_or_keyword",
            ParamKind::PositionalOnly => "positional_only",
            ParamKind::KeywordOnly => "keyword_only",
            ParamKind::VarPositional => "var_positional",
            ParamKind::VarKeyword => "var_keyword",
        }
    }

    /// The kind the executor names `name`, if it is one.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "positional_or_keyword" => ParamKind::PositionalOrKeyword,
            "positional_only" => ParamKind::PositionalOnly,
            "keyword_only" => ParamKind::KeywordOnly,
            "var_positional" => ParamKind::VarPositional,
            "var_keyword" => ParamKind::VarKeyword,
            _ => return None,
        })
    }
}
