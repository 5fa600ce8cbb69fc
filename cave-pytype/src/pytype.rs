//! Rust types as the model sees them: Python annotations, the record and enum classes they
//! need, and the lock a host object's state lives behind. What `#[cave_agent::function]` and
//! `#[cave_agent::object]` build on; usable by hand too.

use async_trait::async_trait;
use cave_core::{Args, HostError, HostObject, Method, TypeSchema, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;

/// A Rust type as the model sees it in Python: its annotation, and the record and enum
/// classes it uses.
///
/// Implemented for numbers (`int`, `float`), `bool`, `String` and `char` (`str`), `()`
/// (`None`), [`Value`] (`Any`), `Vec`/`VecDeque` (`list[T]`), `Option` (`T | None`), maps
/// (`dict[K, V]`), sets (`set[T]`), tuples up to eight (`tuple[A, B]`), `Box` and `Arc`
/// (their content); `#[derive(cave_agent::PythonType)]` implements it for a struct (a record)
/// or an enum of unit variants.
pub trait PythonType {
    /// The annotation the model reads (`int`, `list[str]`, `Order | None`).
    fn annotation() -> String;
    /// Adds the record and enum classes this type uses to `out` (each name once).
    fn schemas(out: &mut Vec<TypeSchema>) {
        let _ = out;
    }
}

/// Adds `schema` unless a type of that name is already in `out`.
pub fn push_schema(out: &mut Vec<TypeSchema>, schema: TypeSchema) {
    if !out.iter().any(|t| t.name == schema.name) {
        out.push(schema);
    }
}

macro_rules! simple {
    ($annotation:literal: $($t:ty),+) => {
        $(impl PythonType for $t {
            fn annotation() -> String {
                $annotation.to_owned()
            }
        })+
    };
}

simple!("int": i8, i16, i32, i64, i128, isize, u8, u16, u32, u64, u128, usize);
simple!("float": f32, f64);
simple!("bool": bool);
simple!("str": String, char);
simple!("None": ());
simple!("Any": Value);

macro_rules! wrapper {
    ($($w:ident),+) => {
        $(impl<T: PythonType + ?Sized> PythonType for $w<T> {
            fn annotation() -> String {
                T::annotation()
            }
            fn schemas(out: &mut Vec<TypeSchema>) {
                T::schemas(out)
            }
        })+
    };
}

wrapper!(Box, Arc);

macro_rules! sequence {
    ($container:literal: $($s:ident),+) => {
        $(impl<T: PythonType> PythonType for $s<T> {
            fn annotation() -> String {
                format!(concat!($container, "[{}]"), T::annotation())
            }
            fn schemas(out: &mut Vec<TypeSchema>) {
                T::schemas(out)
            }
        })+
    };
}

sequence!("list": Vec, VecDeque);
sequence!("set": BTreeSet);

impl<T: PythonType, S> PythonType for HashSet<T, S> {
    fn annotation() -> String {
        format!("set[{}]", T::annotation())
    }
    fn schemas(out: &mut Vec<TypeSchema>) {
        T::schemas(out)
    }
}

impl<T: PythonType> PythonType for Option<T> {
    fn annotation() -> String {
        format!("{} | None", T::annotation())
    }
    fn schemas(out: &mut Vec<TypeSchema>) {
        T::schemas(out)
    }
}

impl<K: PythonType, V: PythonType, S> PythonType for HashMap<K, V, S> {
    fn annotation() -> String {
        format!("dict[{}, {}]", K::annotation(), V::annotation())
    }
    fn schemas(out: &mut Vec<TypeSchema>) {
        K::schemas(out);
        V::schemas(out);
    }
}

impl<K: PythonType, V: PythonType> PythonType for BTreeMap<K, V> {
    fn annotation() -> String {
        format!("dict[{}, {}]", K::annotation(), V::annotation())
    }
    fn schemas(out: &mut Vec<TypeSchema>) {
        K::schemas(out);
        V::schemas(out);
    }
}

macro_rules! tuple {
    ($($t:ident),+) => {
        impl<$($t: PythonType),+> PythonType for ($($t,)+) {
            fn annotation() -> String {
                let parts: Vec<String> = vec![$($t::annotation()),+];
                format!("tuple[{}]", parts.join(", "))
            }
            fn schemas(out: &mut Vec<TypeSchema>) {
                $($t::schemas(out);)+
            }
        }
    };
}

tuple!(A);
tuple!(A, B);
tuple!(A, B, C);
tuple!(A, B, C, D);
tuple!(A, B, C, D, E);
tuple!(A, B, C, D, E, F);
tuple!(A, B, C, D, E, F, G);
tuple!(A, B, C, D, E, F, G, H);

/// A Rust struct as a Python class of host objects: its name, docstring and read-only
/// properties. `#[cave_agent::object]` on the struct implements it; `#[cave_agent::object]` on
/// its `impl` block adds the methods and makes [`Shared<T>`] a [`HostObject`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a class of host objects",
    note = "put `#[cave_agent::object]` on the struct `{Self}` as well as on its impl block"
)]
pub trait ObjectClass: Send + Sync + 'static {
    /// The Python class name.
    const NAME: &'static str;
    /// The class docstring.
    fn doc() -> Option<&'static str> {
        None
    }
    /// The read-only properties (fields marked `#[cave(get)]`).
    fn properties() -> Vec<Method> {
        Vec::new()
    }
    /// Reads a property; `None` if there is no property `name`.
    fn property(&self, name: &str) -> Option<Result<Value, HostError>> {
        let _ = name;
        None
    }
    /// Adds the record and enum classes the properties use to `out`.
    fn property_types(out: &mut Vec<TypeSchema>) {
        let _ = out;
    }
}

/// The methods the model calls on a class of host objects. `#[cave_agent::object]` on the
/// impl block implements it; with it, [`Shared<T>`] is a [`HostObject`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` has no methods for the model",
    note = "put `#[cave_agent::object]` on an impl block of `{Self}`"
)]
#[async_trait]
pub trait ObjectMethods: ObjectClass + Sized {
    /// The methods, described.
    fn methods() -> Vec<Method>;
    /// Adds the record and enum classes the methods use to `out`.
    fn method_types(out: &mut Vec<TypeSchema>);
    /// Calls `method` on the shared object (the call takes the lock it needs).
    async fn call(this: &Shared<Self>, method: &str, args: Args) -> Result<Value, HostError>;
}

#[async_trait]
impl<T: ObjectMethods> HostObject for Shared<T> {
    fn type_name(&self) -> &str {
        T::NAME
    }
    fn doc(&self) -> Option<String> {
        T::doc().map(str::to_owned)
    }
    fn methods(&self) -> Vec<Method> {
        let mut methods = T::properties();
        methods.extend(T::methods());
        methods
    }
    fn types(&self) -> Vec<TypeSchema> {
        let mut types = Vec::new();
        T::property_types(&mut types);
        T::method_types(&mut types);
        types
    }
    async fn call(&self, method: &str, args: Args) -> Result<Value, HostError> {
        T::call(self, method, args).await
    }
}

/// A host object's state behind a lock, shared by the runtime and the host.
///
/// What a type with `#[cave_agent::object]` is registered as: the model's calls take the lock
/// (`&self` methods to read, `&mut self` methods to write), and the host reads the same state
/// with [`read`](Shared::read) after the run. [`Shared::new`] returns the `Arc` both hold.
#[derive(Debug, Default)]
pub struct Shared<T>(tokio::sync::RwLock<T>);

impl<T> Shared<T> {
    /// Wraps `value`; register a clone of the returned `Arc` and keep the other.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(value: T) -> Arc<Self> {
        Arc::new(Self(tokio::sync::RwLock::new(value)))
    }
    /// Waits for shared access.
    pub async fn read(&self) -> tokio::sync::RwLockReadGuard<'_, T> {
        self.0.read().await
    }
    /// Waits for exclusive access.
    pub async fn write(&self) -> tokio::sync::RwLockWriteGuard<'_, T> {
        self.0.write().await
    }
    /// Shared access from synchronous code outside an async runtime (panics inside one, as
    /// tokio's `blocking_read` does).
    pub fn blocking_read(&self) -> tokio::sync::RwLockReadGuard<'_, T> {
        self.0.blocking_read()
    }
    /// Shared access if nobody writes now.
    pub fn try_read(&self) -> Option<tokio::sync::RwLockReadGuard<'_, T>> {
        self.0.try_read().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotations_read_as_python() {
        assert_eq!(i64::annotation(), "int");
        assert_eq!(<Vec<Option<String>>>::annotation(), "list[str | None]");
        assert_eq!(
            <HashMap<String, Vec<f64>>>::annotation(),
            "dict[str, list[float]]"
        );
        assert_eq!(<(u8, bool, char)>::annotation(), "tuple[int, bool, str]");
        assert_eq!(<Arc<BTreeSet<i32>>>::annotation(), "set[int]");
        assert_eq!(<()>::annotation(), "None");
        assert_eq!(Value::annotation(), "Any");
    }
}
