//! Rust signatures as Python ones: the checks, the `Signature` value, the argument binding and
//! the conversion of the result. Shared by functions and methods.

use crate::options::take_marks;
use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Expr, FnArg, GenericArgument, Ident, Pat, PathArguments, ReturnType, Signature, Type};

/// A parameter the model passes.
pub(crate) struct Parameter {
    pub(crate) ident: Ident,
    pub(crate) ty: Type,
    pub(crate) default: Option<Expr>,
    /// An `Option` with nothing required after it: `= None` in Python.
    pub(crate) none_default: bool,
}

/// How a method takes its object.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Receiver {
    /// `&self`: a read lock.
    Shared,
    /// `&mut self`: the write lock.
    Exclusive,
}

/// What a function returns, as the model sees it.
pub(crate) struct Returns {
    /// The type Python gets (`T` of a `Result<T, E>`; `()` when nothing is returned).
    ty: Type,
    /// The Rust function returns a `Result`.
    fallible: bool,
}

/// The parts of a signature the macros use; `#[cave(...)]` marks are removed from `sig`.
pub(crate) struct Parsed {
    pub(crate) receiver: Option<Receiver>,
    pub(crate) params: Vec<Parameter>,
    pub(crate) returns: Returns,
    pub(crate) is_async: bool,
}

/// Checks a signature the model can call and reads it.
pub(crate) fn parse(sig: &mut Signature, what: &str) -> syn::Result<Parsed> {
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        return Err(syn::Error::new_spanned(
            &sig.generics,
            format!(
                "a {what} the model calls cannot be generic: Python gives one concrete type per parameter; write a wrapper with concrete types"
            ),
        ));
    }
    if let Some(unsafety) = &sig.unsafety {
        return Err(syn::Error::new_spanned(
            unsafety,
            format!("the model cannot call an `unsafe` {what}: wrap it in a safe one"),
        ));
    }
    if let Some(variadic) = &sig.variadic {
        return Err(syn::Error::new_spanned(
            variadic,
            "variadic parameters cannot come from Python: take a `Vec<T>`",
        ));
    }
    let mut receiver = None;
    let mut params = Vec::new();
    for input in sig.inputs.iter_mut() {
        match input {
            FnArg::Receiver(r) => {
                if r.reference.is_none() {
                    return Err(syn::Error::new_spanned(
                        r,
                        "a method the model calls takes `&self` or `&mut self`: the object stays in the host",
                    ));
                }
                receiver = Some(if r.mutability.is_some() {
                    Receiver::Exclusive
                } else {
                    Receiver::Shared
                });
            }
            FnArg::Typed(typed) => {
                let marks = take_marks(&mut typed.attrs)?;
                let Pat::Ident(pat) = &*typed.pat else {
                    return Err(syn::Error::new_spanned(
                        &typed.pat,
                        "name the parameter (`point: (i64, i64)`): Python passes arguments by name",
                    ));
                };
                if marks.get {
                    return Err(syn::Error::new_spanned(
                        &typed.pat,
                        "`get` marks a struct field; on a parameter use `default = EXPR`",
                    ));
                }
                check_type(&typed.ty, "a parameter")?;
                params.push(Parameter {
                    ident: pat.ident.clone(),
                    ty: (*typed.ty).clone(),
                    default: marks.default,
                    none_default: false,
                });
            }
        }
    }
    // Python's rule: once a parameter has a default, every later one has one. Trailing
    // `Option`s default to `None`; an `Option` before a required parameter is required.
    let mut trailing = true;
    for p in params.iter_mut().rev() {
        if p.default.is_some() {
            continue;
        }
        if trailing && is_option(&p.ty) {
            p.none_default = true;
        } else {
            trailing = false;
        }
    }
    let mut defaulted: Option<&Parameter> = None;
    for p in &params {
        let has_default = p.default.is_some() || p.none_default;
        match (defaulted, has_default) {
            (None, true) => defaulted = Some(p),
            (Some(first), false) => {
                return Err(syn::Error::new_spanned(
                    &first.ident,
                    format!(
                        "`{}` has a default but `{}` after it has none: in Python, parameters with defaults come last; move it after the required ones",
                        first.ident, p.ident
                    ),
                ));
            }
            _ => {}
        }
    }
    let returns = match &sig.output {
        ReturnType::Default => Returns {
            ty: syn::parse_quote!(()),
            fallible: false,
        },
        ReturnType::Type(_, ty) => {
            check_type(ty, "the result")?;
            match result_ok(ty) {
                Some(ok) => Returns {
                    ty: ok,
                    fallible: true,
                },
                None => Returns {
                    ty: (**ty).clone(),
                    fallible: false,
                },
            }
        }
    };
    Ok(Parsed {
        receiver,
        params,
        returns,
        is_async: sig.asyncness.is_some(),
    })
}

/// Refuses the types Python cannot give or take, saying what to write instead.
fn check_type(ty: &Type, place: &str) -> syn::Result<()> {
    match ty {
        Type::Reference(r) => {
            let instead = match &*r.elem {
                Type::Path(p) if p.path.is_ident("str") => "`String`".to_owned(),
                Type::Slice(s) => format!(
                    "`Vec<{}>`",
                    quote!(#s).to_string().trim_matches(['[', ']', ' '])
                ),
                other => format!("`{}`", quote!(#other)),
            };
            Err(syn::Error::new_spanned(
                ty,
                format!(
                    "{place} cannot be a reference: values cross from Python as owned data; use {instead}"
                ),
            ))
        }
        Type::ImplTrait(_) => Err(syn::Error::new_spanned(
            ty,
            format!(
                "{place} cannot be `impl Trait`: the model needs a concrete type (a struct with `#[derive(cave_agent::PythonType)]`, `String`, `Vec<T>`…)"
            ),
        )),
        Type::TraitObject(_) => Err(syn::Error::new_spanned(
            ty,
            format!("{place} cannot be a trait object: use a concrete type"),
        )),
        Type::BareFn(_) => Err(syn::Error::new_spanned(
            ty,
            format!(
                "{place} cannot be a function pointer: Python functions do not cross; register a host function instead"
            ),
        )),
        Type::Ptr(_) => Err(syn::Error::new_spanned(
            ty,
            format!("{place} cannot be a raw pointer"),
        )),
        Type::Never(_) | Type::Infer(_) | Type::Macro(_) | Type::Verbatim(_) => Err(
            syn::Error::new_spanned(ty, format!("{place} needs a concrete, named type")),
        ),
        Type::Paren(p) => check_type(&p.elem, place),
        Type::Group(g) => check_type(&g.elem, place),
        Type::Array(a) => check_type(&a.elem, place),
        Type::Slice(s) => check_type(&s.elem, place),
        Type::Tuple(t) => t.elems.iter().try_for_each(|e| check_type(e, place)),
        Type::Path(p) => {
            for segment in &p.path.segments {
                if let PathArguments::AngleBracketed(args) = &segment.arguments {
                    for arg in &args.args {
                        match arg {
                            GenericArgument::Type(t) => check_type(t, place)?,
                            GenericArgument::Lifetime(l) => {
                                return Err(syn::Error::new_spanned(
                                    l,
                                    format!("{place} cannot borrow: use an owned type"),
                                ));
                            }
                            _ => {}
                        }
                    }
                }
            }
            Ok(())
        }
        _ => Err(syn::Error::new_spanned(
            ty,
            format!("{place} needs a concrete, named type"),
        )),
    }
}

/// `T` when `ty` is `Result<T, E>` (or a one-argument alias such as `io::Result<T>`).
fn result_ok(ty: &Type) -> Option<Type> {
    let Type::Path(p) = ty else { return None };
    let last = p.path.segments.last()?;
    if last.ident != "Result" {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    match args.args.first()? {
        GenericArgument::Type(t) => Some(t.clone()),
        _ => None,
    }
}

/// Returns true if and only if `ty` is written `Option<...>`.
fn is_option(ty: &Type) -> bool {
    matches!(ty, Type::Path(p) if p.qself.is_none() && p.path.segments.last().is_some_and(|s| s.ident == "Option"))
}

/// The Python name of a Rust identifier (`r#type` is `type`).
pub(crate) fn python_name(ident: &Ident) -> String {
    let name = ident.to_string();
    name.strip_prefix("r#").map(str::to_owned).unwrap_or(name)
}

impl Parsed {
    /// The `Signature` value.
    pub(crate) fn signature(&self, krate: &TokenStream) -> TokenStream {
        let params = self.params.iter().map(|p| {
            let name = python_name(&p.ident);
            let ty = &p.ty;
            let default = match &p.default {
                Some(expr) => quote_spanned! {expr.span()=>
                    .default_value(#krate::macro_support::default_value::<#ty>(#name, #expr))
                },
                None if p.none_default => {
                    quote!(.default_value(#krate::macro_support::Value::None))
                }
                None => quote!(),
            };
            quote! {
                #krate::macro_support::Param::new(#name)
                    .annotated(<#ty as #krate::macro_support::PythonType>::annotation())
                    #default
            }
        });
        let returns = &self.returns.ty;
        quote! {
            #krate::macro_support::Signature::new([#(#params),*])
                .returns(<#returns as #krate::macro_support::PythonType>::annotation())
        }
    }

    /// Statements adding the record and enum types of the signature to `__types` (a
    /// `&mut Vec<TypeSchema>`).
    pub(crate) fn schemas(&self, krate: &TokenStream) -> TokenStream {
        let types = self
            .params
            .iter()
            .map(|p| &p.ty)
            .chain(std::iter::once(&self.returns.ty));
        quote! {
            #(<#types as #krate::macro_support::PythonType>::schemas(__types);)*
        }
    }

    /// Statements binding each parameter from `__args`.
    pub(crate) fn bind(&self) -> TokenStream {
        let binds = self.params.iter().map(|p| {
            let ident = &p.ident;
            let ty = &p.ty;
            let name = python_name(ident);
            quote_spanned! {ty.span()=> let #ident: #ty = __args.get(#name)?; }
        });
        quote!(#(#binds)*)
    }

    /// The call's arguments, in order.
    pub(crate) fn arguments(&self) -> TokenStream {
        let idents = self.params.iter().map(|p| &p.ident);
        quote!(#(#idents),*)
    }

    /// `.await` when the function is async.
    pub(crate) fn await_(&self) -> TokenStream {
        if self.is_async {
            quote!(.await)
        } else {
            quote!()
        }
    }

    /// The expression turning `__result` into `Result<Value, HostError>`.
    pub(crate) fn convert(&self, krate: &TokenStream) -> TokenStream {
        if self.returns.fallible {
            quote! {
                match __result {
                    ::std::result::Result::Ok(__ok) => #krate::macro_support::value(&__ok),
                    ::std::result::Result::Err(__err) => ::std::result::Result::Err(#krate::macro_support::error(__err)),
                }
            }
        } else {
            quote!(#krate::macro_support::value(&__result))
        }
    }
}
