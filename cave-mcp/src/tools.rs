//! A server's tools as one host object: each tool a method, each call a `tools/call`.

use crate::schema::{ToolMethod, tool_method};
use crate::{McpError, McpServer};
use async_trait::async_trait;
use cave_core::{
    Args, HostError, HostObject, Method, ObjectBinding, Resources, Runtime, RuntimeExt, Value,
};
use serde_json::Value as Json;
use std::collections::HashSet;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

/// How many times a call yields for a notification the server sent before its answer (the
/// client runs notification handlers on tasks of their own).
const NOTICE_TURNS: usize = 8;

/// How long a tool call may take unless told otherwise.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// An MCP server's tools as a host object: bind it (with [`McpTools::binding`]) and the
/// model's code calls `name.tool(...)`.
pub struct McpTools {
    server: Arc<McpServer>,
    type_name: String,
    tools: RwLock<Vec<ToolMethod>>,
    timeout: Duration,
}

impl std::fmt::Debug for McpTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpTools")
            .field("server", &self.server.name())
            .field("type_name", &self.type_name)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl McpTools {
    /// Lists `server`'s tools; each call may take `timeout`.
    pub async fn new(server: Arc<McpServer>, timeout: Duration) -> Result<Self, McpError> {
        let type_name = class_name(server.name());
        let tools = Self {
            server,
            type_name,
            tools: RwLock::new(Vec::new()),
            timeout,
        };
        tools.reload().await?;
        Ok(tools)
    }

    /// The server.
    pub fn server(&self) -> &Arc<McpServer> {
        &self.server
    }

    /// Lists the tools again. Returns true if and only if the methods changed.
    pub async fn reload(&self) -> Result<bool, McpError> {
        let listed = self.server.tools().await?;
        let mut taken = HashSet::new();
        let methods: Vec<ToolMethod> = listed
            .iter()
            .map(|tool| {
                let method = tool_method(
                    &tool.name,
                    tool.description.as_deref(),
                    &tool.input_schema,
                    &taken,
                    self.server.name(),
                    tool.output_schema.as_deref(),
                );
                taken.insert(method.python.clone());
                method
            })
            .collect();
        let mut tools = self.tools.write().unwrap_or_else(PoisonError::into_inner);
        let changed = tools
            .iter()
            .map(|t| &t.method)
            .ne(methods.iter().map(|t| &t.method));
        *tools = methods;
        Ok(changed)
    }

    /// Lists the tools again if the server said they changed. Returns true if and only if
    /// the methods changed.
    pub async fn reload_if_changed(&self) -> Result<bool, McpError> {
        if self.server.tools_changed() {
            self.reload().await
        } else {
            Ok(false)
        }
    }

    /// Keeps `runtime`'s binding of this object current: each time the server says its tools
    /// changed, they are listed again and, when the methods differ, the object is bound anew
    /// (its resources passed through `wrap`, the host's guards), so that the next cell can
    /// call the new tools and the next run's prompt describes them. Ends with the server's
    /// session.
    pub fn follow_changes(
        self: &Arc<Self>,
        runtime: Arc<dyn Runtime>,
        wrap: impl Fn(Resources) -> Resources + Send + Sync + 'static,
    ) -> tokio::task::JoinHandle<()> {
        let server = self.server.clone();
        // Weak: following must not keep the object (or the session) alive.
        let tools = Arc::downgrade(self);
        // The methods as the runtime has them bound.
        let mut bound = self.methods();
        tokio::spawn(async move {
            while server.tools_change().await {
                let Some(tools) = tools.upgrade() else { return };
                if let Err(e) = tools.reload_if_changed().await {
                    tracing::warn!(server = server.name(), error = %e, "the changed tools could not be listed");
                    continue;
                }
                let methods = tools.methods();
                if methods == bound {
                    continue;
                }
                let batch = wrap(Resources::new().object(tools.binding()));
                match runtime.replace(batch).await {
                    Ok(()) => bound = methods,
                    Err(e) => {
                        tracing::warn!(server = server.name(), error = %e, "the changed tools could not be bound");
                    }
                }
            }
        })
    }

    /// This object bound under the server's name, described as what it is.
    pub fn binding(self: &Arc<Self>) -> ObjectBinding {
        let what = match self.server.info() {
            Some(info) => format!(
                "the MCP server `{}` ({info}): its tools, as methods",
                self.server.name()
            ),
            None => format!(
                "the MCP server `{}`: its tools, as methods",
                self.server.name()
            ),
        };
        ObjectBinding::new(self.server.name(), self.clone() as Arc<dyn HostObject>)
            .with_description(what)
    }

    fn tool(&self, method: &str) -> Option<ToolMethod> {
        let tools = self.tools.read().unwrap_or_else(PoisonError::into_inner);
        tools.iter().find(|t| t.python == method).cloned()
    }
}

#[async_trait]
impl HostObject for McpTools {
    fn type_name(&self) -> &str {
        &self.type_name
    }

    fn methods(&self) -> Vec<Method> {
        let tools = self.tools.read().unwrap_or_else(PoisonError::into_inner);
        tools.iter().map(|t| t.method.clone()).collect()
    }

    fn mcp_server(&self) -> Option<&str> {
        Some(self.server.name())
    }

    fn doc(&self) -> Option<String> {
        Some(format!(
            "The tools of the MCP server `{}`: each call is a `tools/call` to it, and returns its structured result as a value, else its text.",
            self.server.name()
        ))
    }

    async fn call(&self, method: &str, args: Args) -> Result<Value, HostError> {
        let Some(tool) = self.tool(method) else {
            return Err(HostError::new(
                "AttributeError",
                format!(
                    "the MCP server `{}` has no tool {method:?} (any more)",
                    self.server.name()
                ),
            ));
        };
        let mut arguments = serde_json::Map::new();
        for (python, property) in &tool.params {
            match args.value(python) {
                // An optional argument left out: the server's own default applies.
                None | Some(Value::None) => {}
                Some(value) => {
                    let json: Json = cave_core::from_value(value.clone()).map_err(|e| {
                        HostError::new(
                            "TypeError",
                            format!("argument {python:?} cannot be sent as JSON: {e}"),
                        )
                    })?;
                    arguments.insert(property.clone(), json);
                }
            }
        }
        let result = self
            .server
            .call(&tool.tool, arguments, self.timeout)
            .await
            .map_err(|e| e.host_error())?;
        // A tool that changed the tool list said so before it answered: the new list is
        // taken now, and the object bound anew (by `follow_changes`) as the cell ends, so that
        // the next cell has it. The client hands notifications to their handler on a task of
        // their own, which may run just after the answer arrives: it gets a few turns first.
        for _ in 0..NOTICE_TURNS {
            if self.server.tools_changed() {
                break;
            }
            tokio::task::yield_now().await;
        }
        if self.server.tools_changed() && self.reload().await.is_ok() {
            self.server.wake_followers();
        }
        let value = tool_result(&result, self.server.name(), &tool.tool, tool.unwrap)?;
        // Images are shown among the cell's output as well (the value keeps their bytes).
        for item in image_items(&result, &tool.tool) {
            cave_cell::show_from_host(item);
        }
        Ok(value)
    }
}

/// A `CallToolResult` as the Python value the call returns: the structured content when there
/// is some (with `unwrap`, the value inside the SDKs' `{"result": ...}`), else the text (one
/// `str`), else a list of the pieces; an error result raises.
pub(crate) fn tool_result(
    result: &Json,
    server: &str,
    tool: &str,
    unwrap: bool,
) -> Result<Value, HostError> {
    let pieces: Vec<&Json> = result
        .get("content")
        .and_then(Json::as_array)
        .map(|c| c.iter().collect())
        .unwrap_or_default();
    let texts: Vec<&str> = pieces
        .iter()
        .filter_map(|p| (p.get("type")? == "text").then(|| p.get("text")?.as_str())?)
        .collect();
    if result.get("isError").and_then(Json::as_bool) == Some(true) {
        let text = if texts.is_empty() {
            "(no message)".to_owned()
        } else {
            texts.join("\n")
        };
        return Err(HostError::new(
            "RuntimeError",
            format!("the MCP tool {tool:?} of `{server}` failed: {text}"),
        ));
    }
    let convert = |json: &Json| {
        cave_core::to_value(json)
            .map_err(|e| HostError::runtime(format!("the result of {tool:?}: {e}")))
    };
    if let Some(structured) = result.get("structuredContent") {
        return match structured.get("result") {
            Some(inner) if unwrap => convert(inner),
            _ => convert(structured),
        };
    }
    if pieces.is_empty() {
        return Ok(Value::None);
    }
    if texts.len() == pieces.len() {
        return Ok(Value::Str(texts.join("\n")));
    }
    let items = pieces
        .iter()
        .map(|piece| piece_value(piece))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Value::List(items))
}

/// The images among a result's pieces, as display items.
fn image_items(result: &Json, tool: &str) -> Vec<cave_core::DisplayItem> {
    use base64::Engine as _;
    use cave_core::{DisplayData, DisplayItem};
    let pieces = result.get("content").and_then(Json::as_array);
    pieces
        .into_iter()
        .flatten()
        .filter(|piece| piece.get("type").and_then(Json::as_str) == Some("image"))
        .filter_map(|piece| {
            let mime = piece.get("mimeType").and_then(Json::as_str)?;
            let data = piece.get("data").and_then(Json::as_str)?;
            let data = base64::engine::general_purpose::STANDARD
                .decode(data)
                .ok()?;
            Some(DisplayItem::new([
                (mime.to_owned(), DisplayData::Bytes(data)),
                (
                    "text/plain".to_owned(),
                    DisplayData::Text(format!("<image from the MCP tool {tool:?}>")),
                ),
            ]))
        })
        .collect()
}

/// One piece of content: text as `str`; an image, audio or embedded file as a dict with its
/// bytes (`display({mime: data}, raw=True)` shows an image); anything else as its JSON.
fn piece_value(piece: &Json) -> Result<Value, HostError> {
    use base64::Engine as _;
    let decode = |data: Option<&Json>| -> Result<Value, HostError> {
        let data = data.and_then(Json::as_str).unwrap_or("");
        base64::engine::general_purpose::STANDARD
            .decode(data)
            .map(Value::Bytes)
            .map_err(|e| {
                HostError::runtime(format!("the server sent data that is not base64: {e}"))
            })
    };
    let text = |key: &str| {
        piece
            .get(key)
            .and_then(Json::as_str)
            .map(|s| Value::Str(s.to_owned()))
    };
    let dict = |pairs: Vec<(&str, Option<Value>)>| {
        Value::Dict(
            pairs
                .into_iter()
                .filter_map(|(k, v)| Some((Value::Str(k.to_owned()), v?)))
                .collect(),
        )
    };
    Ok(match piece.get("type").and_then(Json::as_str) {
        Some("text") => text("text").unwrap_or(Value::None),
        Some(kind @ ("image" | "audio")) => dict(vec![
            ("type", Some(Value::Str(kind.to_owned()))),
            ("mime_type", text("mimeType")),
            ("data", Some(decode(piece.get("data"))?)),
        ]),
        Some("resource") => {
            let resource = piece.get("resource").cloned().unwrap_or_default();
            let field = |key: &str| {
                resource
                    .get(key)
                    .and_then(Json::as_str)
                    .map(|s| Value::Str(s.to_owned()))
            };
            let blob = match resource.get("blob") {
                Some(blob) => Some(decode(Some(blob))?),
                None => None,
            };
            dict(vec![
                ("type", Some(Value::Str("resource".to_owned()))),
                ("uri", field("uri")),
                ("mime_type", field("mimeType")),
                ("text", field("text")),
                ("data", blob),
            ])
        }
        _ => cave_core::to_value(piece).map_err(HostError::runtime)?,
    })
}

/// The Python class name for a server's tools: `git` → `GitTools`.
fn class_name(server: &str) -> String {
    let mut name = String::new();
    let mut upper = true;
    for c in server.chars() {
        if c.is_ascii_alphanumeric() {
            name.extend(if upper {
                c.to_uppercase().collect::<Vec<_>>()
            } else {
                vec![c]
            });
            upper = false;
        } else {
            upper = true;
        }
    }
    if !name.starts_with(|c: char| c.is_ascii_alphabetic()) {
        name.insert_str(0, "Mcp");
    }
    name.push_str("Tools");
    name
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn class_names_come_from_server_names() {
        assert_eq!(class_name("git"), "GitTools");
        assert_eq!(class_name("my-server_2"), "MyServer2Tools");
        assert_eq!(class_name("42"), "Mcp42Tools");
        assert_eq!(class_name(""), "McpTools");
    }

    #[test]
    fn results_become_values() {
        let text =
            json!({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]});
        assert_eq!(
            tool_result(&text, "s", "t", false),
            Ok(Value::Str("a\nb".into()))
        );
        let structured = json!({"content": [{"type": "text", "text": "{\"n\": 1}"}], "structuredContent": {"n": 1}});
        assert_eq!(
            tool_result(&structured, "s", "t", false),
            Ok(Value::Dict(vec![(Value::Str("n".into()), Value::Int(1))]))
        );
        let wrapped = json!({"content": [{"type": "text", "text": "212.0"}], "structuredContent": {"result": 212.0}});
        assert_eq!(
            tool_result(&wrapped, "s", "t", true),
            Ok(Value::Float(212.0))
        );
        assert_eq!(
            tool_result(&wrapped, "s", "t", false),
            Ok(Value::Dict(vec![(
                Value::Str("result".into()),
                Value::Float(212.0)
            )]))
        );
        let error = json!({"content": [{"type": "text", "text": "no such repo"}], "isError": true});
        let raised = tool_result(&error, "git", "log", false).unwrap_err();
        assert_eq!(raised.python_type, "RuntimeError");
        assert_eq!(
            raised.message,
            "the MCP tool \"log\" of `git` failed: no such repo"
        );
        assert_eq!(
            tool_result(&json!({"content": []}), "s", "t", false),
            Ok(Value::None)
        );
        let mixed = json!({"content": [{"type": "text", "text": "chart:"}, {"type": "image", "mimeType": "image/png", "data": "iVBO"}]});
        let Ok(Value::List(items)) = tool_result(&mixed, "s", "t", false) else {
            panic!()
        };
        assert_eq!(items[0], Value::Str("chart:".into()));
        let Value::Dict(image) = &items[1] else {
            panic!()
        };
        assert_eq!(
            image[1],
            (
                Value::Str("mime_type".into()),
                Value::Str("image/png".into())
            )
        );
        assert_eq!(
            image[2],
            (
                Value::Str("data".into()),
                Value::Bytes(vec![0x89, 0x50, 0x4e])
            )
        );
        let bad =
            json!({"content": [{"type": "text", "text": "x"}, {"type": "image", "data": "@@"}]});
        assert!(tool_result(&bad, "s", "t", false).is_err());
    }
}
