#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod derive;
mod doc;
mod function;
mod object;
mod options;
mod signature;

use proc_macro::TokenStream;

/// A Rust function (sync or async) as a host function: `NAME::function()` returns the
/// `Function` to register.
///
/// Its Python signature comes from the parameters (`Option<T>` is `T | None = None`;
/// `#[cave(default = EXPR)]` sets a default), its docstring from the doc comment (a
/// `# Arguments` list becomes an `Args:` section). A `Result<T, E>` with `E: Display` raises
/// the error's message in Python (`RuntimeError`, or the type of a `HostError`). Options:
/// `name = "python_name"`, `crate = "path"`.
#[proc_macro_attribute]
pub fn function(args: TokenStream, item: TokenStream) -> TokenStream {
    function::expand(args.into(), item.into())
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// On a struct: a class of host objects (its doc comment is the class docstring; fields
/// marked `#[cave(get)]` are read-only properties). On its `impl` block: the `pub` methods
/// taking `&self` or `&mut self` (sync or async) are the methods the model calls, and
/// `Shared<T>` becomes a `HostObject`. Options: `name = "PythonName"` (on the struct),
/// `crate = "path"`.
#[proc_macro_attribute]
pub fn object(args: TokenStream, item: TokenStream) -> TokenStream {
    object::expand(args.into(), item.into())
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// `PythonType` for a struct with named fields (a record, a dataclass in Python) or an enum
/// of unit variants (a Python `Enum`), so that functions and methods can take and return it.
#[proc_macro_derive(PythonType, attributes(cave))]
pub fn derive_python_type(item: TokenStream) -> TokenStream {
    derive::expand(item.into())
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}
