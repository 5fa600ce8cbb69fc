//! `#[function]`: a free function as a host function.

use crate::doc;
use crate::options::Options;
use crate::signature::{self, python_name};
use proc_macro2::TokenStream;
use quote::quote;
use syn::ItemFn;

pub(crate) fn expand(args: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let options = Options::parse(args)?;
    let mut item: ItemFn = syn::parse2(item).map_err(|e| {
        syn::Error::new(
            e.span(),
            "#[cave_agent::function] goes on a free function (for methods, put #[cave_agent::object] on the impl block)",
        )
    })?;
    let parsed = signature::parse(&mut item.sig, "function")?;
    if parsed.receiver.is_some() {
        return Err(syn::Error::new_spanned(
            &item.sig.inputs,
            "this is a method: put #[cave_agent::object] on its impl block",
        ));
    }
    let krate = options.krate();
    let ident = &item.sig.ident;
    let vis = &item.vis;
    let py_name = options.name.clone().unwrap_or_else(|| python_name(ident));
    let docstring = match doc::docstring(&item.attrs) {
        Some(text) => quote!(.with_doc(#text)),
        None => quote!(),
    };
    let signature = parsed.signature(&krate);
    let schemas = parsed.schemas(&krate);
    let bind = parsed.bind();
    let arguments = parsed.arguments();
    let await_ = parsed.await_();
    let convert = parsed.convert(&krate);
    let note = format!(
        "The host function `{py_name}` for a runtime: `{ident}::function()` (made by `#[cave_agent::function]`)."
    );
    Ok(quote! {
        #item

        #[doc = #note]
        #[allow(non_camel_case_types)]
        #vis struct #ident {}

        impl #ident {
            #[doc = #note]
            #vis fn function() -> #krate::macro_support::Function {
                let mut __collected: ::std::vec::Vec<#krate::macro_support::TypeSchema> = ::std::vec::Vec::new();
                let __types = &mut __collected;
                #schemas
                #krate::macro_support::Function::host(
                    #py_name,
                    #signature,
                    |__args: #krate::macro_support::Args| async move {
                        #bind
                        let __result = #ident(#arguments) #await_;
                        #convert
                    },
                )
                #docstring
                .with_types(__collected)
            }
        }
    })
}
