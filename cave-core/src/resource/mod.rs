//! What a host injects into a runtime: variables, functions, types, host objects, bindings.

mod name;

pub use name::{NameError, NameKind, NameProblem, is_identifier, normalize_name, validate_name};

use crate::{Value, ValueError, from_value, to_value};
use async_trait::async_trait;
use serde::{Serialize, de::DeserializeOwned};
use std::any::Any;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

/// A batch of resources registered together: all of them, or none.
#[derive(Clone, Debug, Default)]
pub struct Resources {
    items: Vec<Resource>,
}

impl Resources {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }
    /// Adds a variable.
    pub fn variable(mut self, variable: Variable) -> Self {
        self.items.push(Resource::Variable(variable));
        self
    }
    /// Adds a function, and the record and enum types its signature uses (hidden: the model
    /// sees them in the signature, and can construct them).
    pub fn function(mut self, function: Function) -> Self {
        let types = function.types.clone();
        self.items.push(Resource::Function(function));
        self.add_types(types);
        self
    }
    /// Adds a type.
    pub fn type_(mut self, schema: TypeSchema) -> Self {
        self.items.push(Resource::Type(schema));
        self
    }
    /// Adds a host object, and the record and enum types its methods use (hidden).
    pub fn object(mut self, object: ObjectBinding) -> Self {
        let types = object.object.types();
        self.items.push(Resource::Object(object));
        self.add_types(types);
        self
    }
    /// Adds types a resource uses, hidden, each once per batch (the registry skips those
    /// already registered the same way).
    fn add_types(&mut self, types: Vec<TypeSchema>) {
        for schema in types {
            let present = self
                .items
                .iter()
                .any(|r| matches!(r, Resource::Type(t) if t.name == schema.name));
            if !present {
                self.items.push(Resource::Type(schema.hidden()));
            }
        }
    }
    /// Adds a hidden binding: bound in the namespace, absent from the prompt.
    pub fn binding(mut self, name: impl Into<String>, value: Value) -> Self {
        self.items.push(Resource::Binding {
            name: name.into(),
            value,
        });
        self
    }
    /// Adds every resource of `other`.
    pub fn with(mut self, other: Resources) -> Self {
        self.items.extend(other.items);
        self
    }
    /// The resources, in the order they were added.
    pub fn items(&self) -> &[Resource] {
        &self.items
    }
    /// Takes the resources out of the batch.
    pub fn into_items(self) -> Vec<Resource> {
        self.items
    }
    /// Returns true if and only if the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
    /// The names of the resources, in order.
    pub fn names(&self) -> Vec<&str> {
        self.items.iter().map(Resource::name).collect()
    }
    /// The same batch, each resource passed through `f`: how a host wraps every host call of a
    /// batch (with cave-guards' `requiring_approval`, `audited` and their object forms).
    pub fn map(self, f: impl FnMut(Resource) -> Resource) -> Self {
        Self {
            items: self.items.into_iter().map(f).collect(),
        }
    }
    /// The same batch, every resource hidden from the prompt (`true`) or shown (`false`).
    /// Objects are always shown; hidden bindings stay hidden.
    pub fn with_hidden(self, hidden: bool) -> Self {
        let items = self
            .items
            .into_iter()
            .map(|item| match item {
                Resource::Function(mut f) => {
                    f.hidden = hidden;
                    Resource::Function(f)
                }
                Resource::Variable(mut v) => {
                    v.hidden = hidden;
                    Resource::Variable(v)
                }
                Resource::Type(mut t) => {
                    t.hidden = hidden;
                    Resource::Type(t)
                }
                other => other,
            })
            .collect();
        Self { items }
    }
}

impl FromIterator<Resource> for Resources {
    fn from_iter<I: IntoIterator<Item = Resource>>(items: I) -> Self {
        Self {
            items: items.into_iter().collect(),
        }
    }
}

/// One resource of a batch.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Resource {
    /// A variable, shown in the prompt.
    Variable(Variable),
    /// A function, shown in the prompt.
    Function(Function),
    /// A type, shown in the prompt unless hidden.
    Type(TypeSchema),
    /// A host object, shown in the prompt as a variable.
    Object(ObjectBinding),
    /// A hidden binding.
    Binding {
        /// The name.
        name: String,
        /// The value.
        value: Value,
    },
}

impl Resource {
    /// The name the resource is registered under (before normalization).
    pub fn name(&self) -> &str {
        match self {
            Resource::Variable(v) => &v.name,
            Resource::Function(f) => &f.name,
            Resource::Type(t) => &t.name,
            Resource::Object(o) => &o.name,
            Resource::Binding { name, .. } => name,
        }
    }
    /// What kind of name it claims.
    pub fn kind(&self) -> NameKind {
        match self {
            Resource::Variable(_) => NameKind::Variable,
            Resource::Function(_) => NameKind::Function,
            Resource::Type(_) => NameKind::Type,
            Resource::Object(_) => NameKind::Object,
            Resource::Binding { .. } => NameKind::Binding,
        }
    }
}

/// A variable the model can read and change; the host retrieves it afterwards.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Variable {
    /// Its name.
    pub name: String,
    /// Its value.
    pub value: Value,
    /// The Python type name shown in the prompt (defaults to the value's; set it for a value
    /// of a registered type, or for `None` meant to hold something else).
    pub type_name: Option<String>,
    /// What it is for, shown in the prompt.
    pub description: Option<String>,
    /// Bound for code to use, but not shown in the prompt.
    pub hidden: bool,
    /// A secret: code can use it; its value is replaced by `[redacted: NAME]` wherever it
    /// appears in what the model reads, the events and the logs.
    pub secret: bool,
}

impl Variable {
    /// A variable holding a plain value.
    pub fn new(name: impl Into<String>, value: Value) -> Self {
        Self {
            name: name.into(),
            value,
            type_name: None,
            description: None,
            hidden: false,
            secret: false,
        }
    }
    /// A secret string (an API token, a password): the model's code can use it, the prompt
    /// names it without its value, and any occurrence of the value (or of its `repr`, JSON,
    /// base64 and hex forms) in execution output, events and history becomes
    /// `[redacted: NAME]`. At least [`MIN_SECRET_CHARS`](crate::MIN_SECRET_CHARS) characters.
    pub fn secret(name: impl Into<String>, value: impl Into<String>) -> Self {
        let mut variable = Self::new(name, Value::Str(value.into()));
        variable.secret = true;
        variable.with_description("a secret: use it in code; its value is never shown to you")
    }
    /// Hides it from the prompt (code can still use it).
    pub fn hidden(mut self) -> Self {
        self.hidden = true;
        self
    }
    /// A variable holding any serializable Rust value.
    pub fn from_serialize<T: Serialize + ?Sized>(
        name: impl Into<String>,
        value: &T,
    ) -> Result<Self, ValueError> {
        Ok(Self::new(name, to_value(value)?))
    }
    /// Sets the description shown in the prompt.
    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }
    /// Sets the Python type name shown in the prompt (and constructed, for a registered type).
    pub fn with_type_name(mut self, type_name: impl Into<String>) -> Self {
        self.type_name = Some(type_name.into());
        self
    }
}

/// How a parameter can be passed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ParamKind {
    /// By position or by keyword.
    #[default]
    PositionalOrKeyword,
    /// By position only (before `/`).
    PositionalOnly,
    /// By keyword only (after `*`).
    KeywordOnly,
    /// `*args`.
    VarPositional,
    /// `**kwargs`.
    VarKeyword,
}

/// A parameter's default value.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum ParamDefault {
    /// A value the host gave (converted into Python when the function is bound).
    Value(Value),
    /// A default that exists only in Python (a function loaded from Python), as its `repr`.
    Python(String),
}

impl fmt::Display for ParamDefault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamDefault::Value(v) => write!(f, "{v}"),
            ParamDefault::Python(repr) => f.write_str(repr),
        }
    }
}

/// One parameter of a Python-style signature.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Param {
    /// Its name.
    pub name: String,
    /// Its annotation, as Python would write it (`int`, `list[str]`, `Optional[Point]`).
    pub annotation: Option<String>,
    /// Its default.
    pub default: Option<ParamDefault>,
    /// How it is passed.
    pub kind: ParamKind,
}

impl Param {
    /// A required positional-or-keyword parameter.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            annotation: None,
            default: None,
            kind: ParamKind::default(),
        }
    }
    /// Sets the annotation.
    pub fn annotated(mut self, annotation: impl Into<String>) -> Self {
        self.annotation = Some(annotation.into());
        self
    }
    /// Sets the default.
    pub fn default_value(mut self, default: Value) -> Self {
        self.default = Some(ParamDefault::Value(default));
        self
    }
    /// Sets a default that exists only in Python, by its `repr` (for runtimes describing a
    /// function Python defined).
    pub fn default_repr(mut self, repr: impl Into<String>) -> Self {
        self.default = Some(ParamDefault::Python(repr.into()));
        self
    }
    /// Sets how it is passed.
    pub fn kind(mut self, kind: ParamKind) -> Self {
        self.kind = kind;
        self
    }
}

/// A Python-style signature: parameters and a return annotation. One representation for
/// host functions and functions Python defined alike (runtimes describe the latter parameter
/// by parameter).
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Signature {
    /// The parameters, in order.
    pub params: Vec<Param>,
    /// The return annotation.
    pub returns: Option<String>,
}

impl Signature {
    /// A signature with these parameters and no return annotation.
    pub fn new(params: impl IntoIterator<Item = Param>) -> Self {
        Self {
            params: params.into_iter().collect(),
            returns: None,
        }
    }
    /// The signature of a callable whose parameters cannot be known (a C function Python
    /// cannot inspect): `(*args, **kwargs)`.
    pub fn unknown() -> Self {
        Self::new([
            Param::new("args").kind(ParamKind::VarPositional),
            Param::new("kwargs").kind(ParamKind::VarKeyword),
        ])
    }
    /// Sets the return annotation.
    pub fn returns(mut self, annotation: impl Into<String>) -> Self {
        self.returns = Some(annotation.into());
        self
    }
}

/// Writes the signature as Python shows it: `(a: int, b: int = 2, *, c=None) -> int`.
impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("(")?;
        let mut first = true;
        let mut sep = |f: &mut fmt::Formatter<'_>| {
            if !std::mem::take(&mut first) {
                f.write_str(", ")?;
            }
            Ok::<_, fmt::Error>(())
        };
        let mut star_written = false;
        for (i, p) in self.params.iter().enumerate() {
            if p.kind == ParamKind::KeywordOnly && !star_written {
                sep(f)?;
                f.write_str("*")?;
                star_written = true;
            }
            sep(f)?;
            match p.kind {
                ParamKind::VarPositional => {
                    star_written = true;
                    f.write_str("*")?
                }
                ParamKind::VarKeyword => f.write_str("**")?,
                _ => {}
            }
            f.write_str(&p.name)?;
            match (&p.annotation, &p.default) {
                (Some(a), Some(d)) => write!(f, ": {a} = {d}")?,
                (Some(a), None) => write!(f, ": {a}")?,
                (None, Some(d)) => write!(f, "={d}")?,
                (None, None) => {}
            }
            let next_is_positional_only = self
                .params
                .get(i + 1)
                .is_some_and(|n| n.kind == ParamKind::PositionalOnly);
            if p.kind == ParamKind::PositionalOnly && !next_is_positional_only {
                sep(f)?;
                f.write_str("/")?;
            }
        }
        f.write_str(")")?;
        if let Some(r) = &self.returns {
            write!(f, " -> {r}")?;
        }
        Ok(())
    }
}

/// Arguments of a host call, bound to the signature by the runtime (as Python binds them):
/// one value per declared parameter, in order, defaults filled in; `*args` arrives as a
/// tuple and `**kwargs` as a dict.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Args {
    values: Vec<(String, Value)>,
}

impl Args {
    /// Arguments with these names and values, in signature order.
    pub fn new(values: Vec<(String, Value)>) -> Self {
        Self { values }
    }
    /// The value of a parameter.
    pub fn value(&self, name: &str) -> Option<&Value> {
        self.values.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }
    /// The value of a parameter, converted with serde.
    pub fn get<T: DeserializeOwned>(&self, name: &str) -> Result<T, HostError> {
        let value = self
            .value(name)
            .ok_or_else(|| HostError::new("TypeError", format!("missing argument '{name}'")))?;
        from_value(value.clone())
            .map_err(|e| HostError::new("TypeError", format!("argument '{name}': {e}")))
    }
    /// All values in signature order.
    pub fn values(&self) -> &[(String, Value)] {
        &self.values
    }
    /// `name=value, ...` as Python would show the values, at most `max_chars` characters (for
    /// approvals and audit records).
    pub fn summary(&self, max_chars: usize) -> String {
        let text = self
            .values
            .iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect::<Vec<_>>()
            .join(", ");
        match crate::shorten(&text, max_chars) {
            (head, true) => format!("{head}…"),
            (_, false) => text,
        }
    }
}

/// An error a host function or method raises; the model sees it as a Python exception of
/// `python_type` (e.g. `ValueError`) with `message`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{python_type}: {message}")]
#[non_exhaustive]
pub struct HostError {
    /// The Python exception type to raise (a builtin name such as `ValueError`).
    pub python_type: String,
    /// The exception's message.
    pub message: String,
}

impl HostError {
    /// An error raised as `python_type(message)`.
    pub fn new(python_type: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            python_type: python_type.into(),
            message: message.into(),
        }
    }
    /// An error raised as `RuntimeError(message)`, for any Rust error.
    pub fn runtime(error: impl fmt::Display) -> Self {
        Self::new("RuntimeError", error.to_string())
    }
}

/// A function implemented by the host and called from Python.
#[async_trait]
pub trait HostFunction: Send + Sync {
    /// Calls it with arguments bound to its signature.
    async fn call(&self, args: Args) -> Result<Value, HostError>;
}

#[async_trait]
impl<F, Fut> HostFunction for F
where
    F: Fn(Args) -> Fut + Send + Sync,
    Fut: Future<Output = Result<Value, HostError>> + Send,
{
    async fn call(&self, args: Args) -> Result<Value, HostError> {
        self(args).await
    }
}

/// How a function is implemented.
#[derive(Clone)]
#[non_exhaustive]
pub enum FunctionBody {
    /// By the host.
    Host(Arc<dyn HostFunction>),
    /// By Python source defining a function of the same name.
    Python(String),
    /// By a Python object the runtime itself bound (e.g. loaded from a Python file); the
    /// descriptor only tells the prompt about it.
    Bound,
}

impl fmt::Debug for FunctionBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FunctionBody::Host(_) => f.write_str("Host(..)"),
            FunctionBody::Python(src) => f.debug_tuple("Python").field(src).finish(),
            FunctionBody::Bound => f.write_str("Bound"),
        }
    }
}

/// A function the model can call.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Function {
    /// Its name.
    pub name: String,
    /// Its signature.
    pub signature: Signature,
    /// Its docstring, shown in the prompt.
    pub doc: Option<String>,
    /// A description, shown in the prompt.
    pub description: Option<String>,
    /// Returns true if and only if it is shown as `async def` (calls must be awaited).
    pub is_async: bool,
    /// Its implementation.
    pub body: FunctionBody,
    /// Bound for code to use, but not shown in the prompt.
    pub hidden: bool,
    /// Record and enum types its signature uses; [`Resources::function`] registers them
    /// (hidden) with it.
    pub types: Vec<TypeSchema>,
}

impl Function {
    /// A function implemented by a host closure or any [`HostFunction`].
    pub fn host(
        name: impl Into<String>,
        signature: Signature,
        f: impl HostFunction + 'static,
    ) -> Self {
        Self {
            name: name.into(),
            signature,
            doc: None,
            description: None,
            is_async: false,
            body: FunctionBody::Host(Arc::new(f)),
            hidden: false,
            types: Vec::new(),
        }
    }
    /// A function defined by Python source (`def name(...): ...`).
    pub fn python(
        name: impl Into<String>,
        signature: Signature,
        source: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            signature,
            doc: None,
            description: None,
            is_async: false,
            body: FunctionBody::Python(source.into()),
            hidden: false,
            types: Vec::new(),
        }
    }
    /// A function that is already a Python object in the runtime (loaded by the runtime, e.g.
    /// from a Python file), described by `signature`.
    pub fn bound(name: impl Into<String>, signature: Signature) -> Self {
        Self {
            name: name.into(),
            signature,
            doc: None,
            description: None,
            is_async: false,
            body: FunctionBody::Bound,
            hidden: false,
            types: Vec::new(),
        }
    }
    /// Sets the docstring.
    pub fn with_doc(mut self, doc: impl Into<String>) -> Self {
        self.doc = Some(doc.into());
        self
    }
    /// Sets the description.
    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }
    /// Marks it as a coroutine function for the model.
    pub fn asynchronous(mut self) -> Self {
        self.is_async = true;
        self
    }
    /// Hides it from the prompt (code can still call it).
    pub fn hidden(mut self) -> Self {
        self.hidden = true;
        self
    }
    /// The same function (name, signature, docs, types) with another host implementation:
    /// how a function is wrapped (an approval, an audit record).
    pub fn with_body(mut self, body: impl HostFunction + 'static) -> Self {
        self.body = FunctionBody::Host(Arc::new(body));
        self
    }
    /// The record and enum types its signature uses, registered with it.
    pub fn with_types(mut self, types: impl IntoIterator<Item = TypeSchema>) -> Self {
        self.types.extend(types);
        self
    }
}

/// A field of a type schema.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Field {
    /// Its name.
    pub name: String,
    /// Its annotation.
    pub annotation: String,
    /// Its default.
    pub default: Option<ParamDefault>,
    /// What it means, shown after it.
    pub description: Option<String>,
}

impl Field {
    /// A required field.
    pub fn new(name: impl Into<String>, annotation: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            annotation: annotation.into(),
            default: None,
            description: None,
        }
    }
    /// Sets the default.
    pub fn default_value(mut self, default: Value) -> Self {
        self.default = Some(ParamDefault::Value(default));
        self
    }
    /// Sets a default that exists only in Python, by its `repr` (a class loaded from Python).
    pub fn default_repr(mut self, repr: impl Into<String>) -> Self {
        self.default = Some(ParamDefault::Python(repr.into()));
        self
    }
    /// Sets the description.
    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }
}

/// A method of a type or host object.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Method {
    /// Its name.
    pub name: String,
    /// Its signature, without `self`.
    pub signature: Signature,
    /// Its docstring.
    pub doc: Option<String>,
    /// A read-only property rather than a method: read as `obj.name`, it calls the host with
    /// no arguments; its signature's return annotation is its type.
    pub property: bool,
}

impl Method {
    /// A method with this signature.
    pub fn new(name: impl Into<String>, signature: Signature) -> Self {
        Self {
            name: name.into(),
            signature,
            doc: None,
            property: false,
        }
    }
    /// A read-only property of this type (`int`, `list[str]`, …).
    pub fn property(name: impl Into<String>, annotation: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            signature: Signature::default().returns(annotation),
            doc: None,
            property: true,
        }
    }
    /// Sets the docstring.
    pub fn with_doc(mut self, doc: impl Into<String>) -> Self {
        self.doc = Some(doc.into());
        self
    }
}

/// What a type is made of.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum TypeShape {
    /// A record (a dataclass in Python): fields the model constructs it with.
    Fields(Vec<Field>),
    /// An enumeration: member names and values.
    Enum(Vec<(String, Value)>),
    /// A class known by its methods (e.g. the type of host objects).
    Methods(Vec<Method>),
}

/// A class the model can use: constructed from a schema by the runtime.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct TypeSchema {
    /// The class name.
    pub name: String,
    /// Its docstring.
    pub doc: Option<String>,
    /// A description, shown in the prompt.
    pub description: Option<String>,
    /// Fields, members or methods.
    pub shape: TypeShape,
    /// Bound for code to use, but not shown in the prompt.
    pub hidden: bool,
}

impl TypeSchema {
    /// A record type with these fields.
    pub fn record(name: impl Into<String>, fields: impl IntoIterator<Item = Field>) -> Self {
        Self::with_shape(name, TypeShape::Fields(fields.into_iter().collect()))
    }
    /// An enumeration with these members.
    pub fn enumeration(
        name: impl Into<String>,
        members: impl IntoIterator<Item = (String, Value)>,
    ) -> Self {
        Self::with_shape(name, TypeShape::Enum(members.into_iter().collect()))
    }
    /// A type of this shape.
    pub fn with_shape(name: impl Into<String>, shape: TypeShape) -> Self {
        Self {
            name: name.into(),
            doc: None,
            description: None,
            shape,
            hidden: false,
        }
    }
    /// Sets the docstring.
    pub fn with_doc(mut self, doc: impl Into<String>) -> Self {
        self.doc = Some(doc.into());
        self
    }
    /// Sets the description.
    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }
    /// Hides it from the prompt.
    pub fn hidden(mut self) -> Self {
        self.hidden = true;
        self
    }
}

/// A Rust object the model operates through its methods.
///
/// The runtime exposes it as a Python object whose methods call [`call`](HostObject::call);
/// the object itself never leaves the host, so the host sees every change the model's code
/// makes, and gets the same object back.
#[async_trait]
pub trait HostObject: Any + Send + Sync {
    /// The Python class name shown to the model.
    fn type_name(&self) -> &str;
    /// The methods the model may call.
    fn methods(&self) -> Vec<Method>;
    /// Calls a method with arguments bound to its signature.
    async fn call(&self, method: &str, args: Args) -> Result<Value, HostError>;
    /// The class docstring.
    fn doc(&self) -> Option<String> {
        None
    }
    /// Record and enum types its methods use; [`Resources::object`] registers them (hidden)
    /// with it.
    fn types(&self) -> Vec<TypeSchema> {
        Vec::new()
    }
    /// The object this one forwards to, when it is a wrapper (an approval guard, an audit
    /// record), so that retrieving the binding hands back the original. `None` for the
    /// original itself.
    fn wrapped(&self) -> Option<Arc<dyn HostObject>> {
        None
    }
    /// The MCP server whose tools this object's methods call, when it is one (the ledger
    /// counts those calls apart from host calls).
    fn mcp_server(&self) -> Option<&str> {
        None
    }
}

/// Returns true if and only if `object`, or the object a wrapper of it forwards to, calls an
/// MCP server's tools ([`HostObject::mcp_server`]).
pub fn calls_mcp(object: &Arc<dyn HostObject>) -> bool {
    let mut object = object.clone();
    // Bounded: wrappers are few, and a wrapper that returns itself must not loop.
    for _ in 0..16 {
        if object.mcp_server().is_some() {
            return true;
        }
        match object.wrapped() {
            Some(inner) => object = inner,
            None => return false,
        }
    }
    false
}

/// A host object registered under a name.
#[derive(Clone)]
#[non_exhaustive]
pub struct ObjectBinding {
    /// Its name.
    pub name: String,
    /// The object.
    pub object: Arc<dyn HostObject>,
    /// What it is for, shown in the prompt.
    pub description: Option<String>,
}

impl ObjectBinding {
    /// Binds `object` as `name`.
    pub fn new(name: impl Into<String>, object: Arc<dyn HostObject>) -> Self {
        Self {
            name: name.into(),
            object,
            description: None,
        }
    }
    /// Sets the description.
    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }
}

impl fmt::Debug for ObjectBinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectBinding")
            .field("name", &self.name)
            .field("type", &self.object.type_name())
            .field("description", &self.description)
            .finish()
    }
}
