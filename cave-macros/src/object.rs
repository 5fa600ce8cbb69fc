//! `#[object]`: on a struct, a class of host objects (name, docstring, read-only
//! properties); on its impl block, the methods the model calls.

use crate::doc;
use crate::options::{Options, take_marks};
use crate::signature::{self, Receiver, python_name};
use proc_macro2::TokenStream;
use quote::quote;
use syn::{Fields, ImplItem, Item, ItemImpl, ItemStruct, Type, Visibility};

pub(crate) fn expand(args: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let options = Options::parse(args)?;
    match syn::parse2::<Item>(item)? {
        Item::Struct(s) => class(options, s),
        Item::Impl(i) => methods(options, i),
        other => Err(syn::Error::new_spanned(
            other,
            "#[cave_agent::object] goes on a struct and on its impl block",
        )),
    }
}

/// `ObjectClass` for the struct.
fn class(options: Options, mut item: ItemStruct) -> syn::Result<TokenStream> {
    if !item.generics.params.is_empty() {
        return Err(syn::Error::new_spanned(
            &item.generics,
            "a class of host objects cannot be generic: the model sees one class; wrap a concrete type",
        ));
    }
    let krate = options.krate();
    let ident = &item.ident;
    let name = options.name.clone().unwrap_or_else(|| ident.to_string());
    let class_doc = match doc::text(&item.attrs) {
        Some(text) => quote!(::std::option::Option::Some(#text)),
        None => quote!(::std::option::Option::None),
    };
    let mut properties = Vec::new();
    let mut reads = Vec::new();
    let mut types = Vec::new();
    if let Fields::Named(fields) = &mut item.fields {
        for field in fields.named.iter_mut() {
            let marks = take_marks(&mut field.attrs)?;
            if marks.default.is_some() {
                return Err(syn::Error::new_spanned(
                    &field.ident,
                    "`default` is for parameters; a field can be marked `get`",
                ));
            }
            if !marks.get {
                continue;
            }
            let field_ident = field.ident.as_ref().expect("named fields have names");
            let ty = &field.ty;
            let py = python_name(field_ident);
            let doc = match doc::text(&field.attrs) {
                Some(text) => quote!(.with_doc(#text)),
                None => quote!(),
            };
            properties.push(quote! {
                #krate::macro_support::Method::property(#py, <#ty as #krate::macro_support::PythonType>::annotation()) #doc
            });
            reads.push(quote! {
                #py => ::std::option::Option::Some(#krate::macro_support::value(&self.#field_ident)),
            });
            types.push(quote!(<#ty as #krate::macro_support::PythonType>::schemas(out);));
        }
    } else {
        for field in item.fields.iter_mut() {
            if take_marks(&mut field.attrs)?.get {
                return Err(syn::Error::new_spanned(
                    &field.ty,
                    "`get` needs a named field: the property takes the field's name",
                ));
            }
        }
    }
    Ok(quote! {
        #item

        impl #krate::macro_support::ObjectClass for #ident {
            const NAME: &'static str = #name;
            fn doc() -> ::std::option::Option<&'static str> {
                #class_doc
            }
            fn properties() -> ::std::vec::Vec<#krate::macro_support::Method> {
                ::std::vec![#(#properties),*]
            }
            fn property(&self, name: &str) -> ::std::option::Option<::std::result::Result<#krate::macro_support::Value, #krate::macro_support::HostError>> {
                match name {
                    #(#reads)*
                    _ => ::std::option::Option::None,
                }
            }
            fn property_types(out: &mut ::std::vec::Vec<#krate::macro_support::TypeSchema>) {
                #(#types)*
            }
        }
    })
}

/// `ObjectMethods` (and so `HostObject` for `Shared<T>`), from the impl block's public
/// methods.
fn methods(options: Options, mut item: ItemImpl) -> syn::Result<TokenStream> {
    if let Some((_, path, _)) = &item.trait_ {
        return Err(syn::Error::new_spanned(
            path,
            "#[cave_agent::object] goes on the type's own impl block, not on a trait impl",
        ));
    }
    if !item.generics.params.is_empty() {
        return Err(syn::Error::new_spanned(
            &item.generics,
            "a class of host objects cannot be generic: the model sees one class; wrap a concrete type",
        ));
    }
    let self_ty: Type = (*item.self_ty).clone();
    let krate = options.krate();
    let mut described = Vec::new();
    let mut arms = Vec::new();
    let mut types = Vec::new();
    for impl_item in item.items.iter_mut() {
        let ImplItem::Fn(method) = impl_item else {
            continue;
        };
        let public = matches!(method.vis, Visibility::Public(_));
        let has_receiver = method.sig.receiver().is_some();
        if !public || !has_receiver {
            // Helpers and constructors stay Rust's; still strip marks the compiler would
            // not know.
            for input in method.sig.inputs.iter_mut() {
                if let syn::FnArg::Typed(t) = input {
                    take_marks(&mut t.attrs)?;
                }
            }
            continue;
        }
        let parsed = signature::parse(&mut method.sig, "method")?;
        let ident = &method.sig.ident;
        let py = python_name(ident);
        let signature = parsed.signature(&krate);
        let doc = match doc::docstring(&method.attrs) {
            Some(text) => quote!(.with_doc(#text)),
            None => quote!(),
        };
        described.push(quote!(#krate::macro_support::Method::new(#py, #signature) #doc));
        let schemas = parsed.schemas(&krate);
        types.push(schemas);
        let bind = parsed.bind();
        let arguments = parsed.arguments();
        let await_ = parsed.await_();
        let convert = parsed.convert(&krate);
        let guard = match parsed.receiver {
            Some(Receiver::Exclusive) => quote!(let mut __this = __shared.write().await;),
            _ => quote!(let __this = __shared.read().await;),
        };
        arms.push(quote! {
            #py => {
                #bind
                let __result = {
                    #guard
                    __this.#ident(#arguments) #await_
                };
                #convert
            }
        });
    }
    Ok(quote! {
        #item

        #[#krate::macro_support::async_trait]
        impl #krate::macro_support::ObjectMethods for #self_ty {
            fn methods() -> ::std::vec::Vec<#krate::macro_support::Method> {
                ::std::vec![#(#described),*]
            }
            fn method_types(__types: &mut ::std::vec::Vec<#krate::macro_support::TypeSchema>) {
                #(#types)*
            }
            async fn call(
                __shared: &#krate::macro_support::Shared<Self>,
                __method: &str,
                __args: #krate::macro_support::Args,
            ) -> ::std::result::Result<#krate::macro_support::Value, #krate::macro_support::HostError> {
                match __method {
                    #(#arms)*
                    __other => {
                        let __this = __shared.read().await;
                        match <Self as #krate::macro_support::ObjectClass>::property(&*__this, __other) {
                            ::std::option::Option::Some(__read) => __read,
                            ::std::option::Option::None => ::std::result::Result::Err(
                                #krate::macro_support::no_attribute(<Self as #krate::macro_support::ObjectClass>::NAME, __other),
                            ),
                        }
                    }
                }
            }
        }
    })
}
