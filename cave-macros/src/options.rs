//! The attributes' options: `name = "..."`, `crate = "..."`, and `#[cave(...)]` on
//! parameters and fields.

use proc_macro2::TokenStream;
use quote::quote;
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::{Attribute, Expr, Lit, Meta, Token};

/// What `#[function(...)]`, `#[object(...)]` or `#[cave(...)]` on a derive say.
#[derive(Default)]
pub(crate) struct Options {
    /// The Python name.
    pub(crate) name: Option<String>,
    /// The path of the crate the generated code names.
    pub(crate) krate: Option<syn::Path>,
}

impl Options {
    /// Parses `name = "...", crate = "..."`.
    pub(crate) fn parse(args: TokenStream) -> syn::Result<Options> {
        let mut options = Options::default();
        let metas = Punctuated::<Meta, Token![,]>::parse_terminated.parse2(args)?;
        for meta in metas {
            options.apply(&meta)?;
        }
        Ok(options)
    }

    /// Reads `#[cave(crate = "...")]` (and `name`) among a derive's attributes.
    pub(crate) fn from_attributes(attrs: &[Attribute]) -> syn::Result<Options> {
        let mut options = Options::default();
        for attr in attrs.iter().filter(|a| a.path().is_ident("cave")) {
            let metas = attr.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated)?;
            for meta in metas {
                options.apply(&meta)?;
            }
        }
        Ok(options)
    }

    fn apply(&mut self, meta: &Meta) -> syn::Result<()> {
        let Meta::NameValue(pair) = meta else {
            return Err(syn::Error::new_spanned(
                meta,
                "expected `name = \"...\"` or `crate = \"...\"`",
            ));
        };
        let text = string(&pair.value)?;
        if pair.path.is_ident("name") {
            self.name = Some(text);
        } else if pair.path.is_ident("crate") {
            self.krate = Some(syn::parse_str(&text)?);
        } else {
            return Err(syn::Error::new_spanned(
                &pair.path,
                "unknown option: expected `name` or `crate`",
            ));
        }
        Ok(())
    }

    /// The crate path, `::cave_agent` unless told otherwise.
    pub(crate) fn krate(&self) -> TokenStream {
        match &self.krate {
            Some(path) => quote!(#path),
            None => quote!(::cave_agent),
        }
    }
}

fn string(expr: &Expr) -> syn::Result<String> {
    match expr {
        Expr::Lit(lit) => match &lit.lit {
            Lit::Str(s) => Ok(s.value()),
            _ => Err(syn::Error::new_spanned(expr, "expected a string literal")),
        },
        _ => Err(syn::Error::new_spanned(expr, "expected a string literal")),
    }
}

/// What `#[cave(...)]` says on a parameter or a field.
#[derive(Default)]
pub(crate) struct Marks {
    /// `default = EXPR`.
    pub(crate) default: Option<Expr>,
    /// `get`: a read-only property.
    pub(crate) get: bool,
}

/// Reads and removes the `#[cave(...)]` attributes of a parameter or field.
pub(crate) fn take_marks(attrs: &mut Vec<Attribute>) -> syn::Result<Marks> {
    let mut marks = Marks::default();
    let mut kept = Vec::with_capacity(attrs.len());
    for attr in attrs.drain(..) {
        if !attr.path().is_ident("cave") {
            kept.push(attr);
            continue;
        }
        let metas = attr.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated)?;
        for meta in metas {
            match &meta {
                Meta::NameValue(pair) if pair.path.is_ident("default") => {
                    marks.default = Some(pair.value.clone());
                }
                Meta::Path(path) if path.is_ident("get") => marks.get = true,
                _ => {
                    return Err(syn::Error::new_spanned(
                        &meta,
                        "expected `default = EXPR` (on a parameter) or `get` (on a field)",
                    ));
                }
            }
        }
    }
    *attrs = kept;
    Ok(marks)
}
