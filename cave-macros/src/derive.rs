//! `#[derive(PythonType)]`: a struct as a record (a dataclass), an enum of unit variants as a
//! Python `Enum`.

use crate::doc;
use crate::options::Options;
use crate::signature::python_name;
use proc_macro2::TokenStream;
use quote::quote;
use syn::{Attribute, Data, DeriveInput, Fields};

pub(crate) fn expand(item: TokenStream) -> syn::Result<TokenStream> {
    let input: DeriveInput = syn::parse2(item)?;
    let options = Options::from_attributes(&input.attrs)?;
    if !input.generics.params.is_empty() {
        return Err(syn::Error::new_spanned(
            &input.generics,
            "PythonType needs a concrete type: the model sees one class per type",
        ));
    }
    refuse_renames(&input.attrs)?;
    let krate = options.krate();
    let ident = &input.ident;
    let name = options.name.clone().unwrap_or_else(|| ident.to_string());
    let class_doc = match doc::text(&input.attrs) {
        Some(text) => quote!(.with_doc(#text)),
        None => quote!(),
    };
    let (schema, nested) = match &input.data {
        Data::Struct(data) => {
            let Fields::Named(fields) = &data.fields else {
                return Err(syn::Error::new_spanned(
                    ident,
                    "PythonType makes a record from named fields: a tuple or unit struct has no field names for Python",
                ));
            };
            // Required fields first: a dataclass lists defaulted fields last, and serde reads
            // fields by name, so the order does not matter to Rust.
            let mut required = Vec::new();
            let mut optional = Vec::new();
            let mut nested = Vec::new();
            for field in &fields.named {
                refuse_renames(&field.attrs)?;
                let field_ident = field.ident.as_ref().expect("named fields have names");
                let py = python_name(field_ident);
                let ty = &field.ty;
                let description = match doc::text(&field.attrs) {
                    Some(text) => quote!(.with_description(#text)),
                    None => quote!(),
                };
                let is_option = matches!(ty, syn::Type::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == "Option"));
                let built = if is_option {
                    quote! {
                        #krate::macro_support::Field::new(#py, <#ty as #krate::macro_support::PythonType>::annotation())
                            .default_value(#krate::macro_support::Value::None)
                            #description
                    }
                } else {
                    quote! {
                        #krate::macro_support::Field::new(#py, <#ty as #krate::macro_support::PythonType>::annotation())
                            #description
                    }
                };
                if is_option {
                    optional.push(built);
                } else {
                    required.push(built);
                }
                nested.push(quote!(<#ty as #krate::macro_support::PythonType>::schemas(out);));
            }
            (
                quote! {
                    #krate::macro_support::TypeSchema::record(#name, [#(#required,)* #(#optional,)*]) #class_doc
                },
                nested,
            )
        }
        Data::Enum(data) => {
            let mut members = Vec::new();
            for variant in &data.variants {
                refuse_renames(&variant.attrs)?;
                if !matches!(variant.fields, Fields::Unit) {
                    return Err(syn::Error::new_spanned(
                        variant,
                        "PythonType makes a Python Enum from unit variants only: a variant with data has no Enum member form",
                    ));
                }
                let member = variant.ident.to_string();
                members.push(quote! {
                    (::std::string::String::from(#member), #krate::macro_support::Value::Str(::std::string::String::from(#member)))
                });
            }
            (
                quote! {
                    #krate::macro_support::TypeSchema::enumeration(#name, [#(#members),*]) #class_doc
                },
                Vec::new(),
            )
        }
        Data::Union(_) => {
            return Err(syn::Error::new_spanned(
                ident,
                "PythonType is for structs and enums, not unions",
            ));
        }
    };
    Ok(quote! {
        impl #krate::macro_support::PythonType for #ident {
            fn annotation() -> ::std::string::String {
                ::std::string::String::from(#name)
            }
            fn schemas(out: &mut ::std::vec::Vec<#krate::macro_support::TypeSchema>) {
                // Added before its fields' types, so that a type containing itself ends.
                if out.iter().any(|t| t.name == #name) {
                    return;
                }
                #krate::macro_support::push_schema(out, #schema);
                #(#nested)*
            }
        }
    })
}

/// serde renames would make the Python names differ from what serde reads: refused rather
/// than silently wrong.
fn refuse_renames(attrs: &[Attribute]) -> syn::Result<()> {
    for attr in attrs.iter().filter(|a| a.path().is_ident("serde")) {
        let text = quote!(#attr).to_string();
        if text.contains("rename")
            || text.contains("alias")
            || text.contains("flatten")
            || text.contains("tag")
            || text.contains("untagged")
        {
            return Err(syn::Error::new_spanned(
                attr,
                "PythonType does not follow serde renames, aliases, tags or flattening: the Python names would not be the ones serde reads; remove the attribute or write the TypeSchema by hand",
            ));
        }
    }
    Ok(())
}
