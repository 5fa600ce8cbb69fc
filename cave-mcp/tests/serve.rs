//! `SessionServer` as a library user serves it: a kernel runtime (real Python in a child
//! process) reached by rmcp's own client over an in-memory pipe.

use cave_core::{CodePolicy, Violation};
use cave_mcp::serve::{ClientApprovals, SessionServer};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use serde_json::{Value as Json, json};
use std::sync::Arc;

/// Refuses any cell that mentions `forbidden`.
struct NoForbidden;

impl CodePolicy for NoForbidden {
    fn check(&self, code: &str) -> Vec<Violation> {
        if code.contains("forbidden") {
            vec![Violation::new("the word 'forbidden' at line 1")]
        } else {
            Vec::new()
        }
    }
}

/// Serves `server` on one end of a pipe; a client (which declares no elicitation) on the other.
async fn connect(server: SessionServer) -> rmcp::service::RunningService<rmcp::RoleClient, ()> {
    let (client_end, server_end) = tokio::io::duplex(1 << 16);
    let (read, write) = tokio::io::split(server_end);
    tokio::spawn(server.serve_stdio(read, write));
    ().serve(tokio::io::split(client_end)).await.unwrap()
}

async fn call(
    client: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    tool: &'static str,
    arguments: Json,
) -> (bool, String, Option<Json>) {
    let Json::Object(arguments) = arguments else {
        panic!("arguments are an object")
    };
    let result = client
        .call_tool(CallToolRequestParams::new(tool).with_arguments(arguments))
        .await
        .unwrap();
    let text = result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n");
    (
        result.is_error == Some(true),
        text,
        result.structured_content,
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn cells_keep_state_and_the_policy_refuses() {
    let runtime = cave_runtime_kernel::KernelRuntime::new().unwrap();
    let server = SessionServer::new(Arc::new(runtime)).with_policy(Arc::new(NoForbidden));
    let client = connect(server).await;
    let tools = client.list_all_tools().await.unwrap();
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "drop_branch",
            "fork",
            "get_variable",
            "list_bound",
            "run_cell"
        ]
    );
    assert_eq!(
        call(&client, "run_cell", json!({"code": "n = 20\nn + 22"})).await,
        (false, "42\n".to_owned(), None)
    );
    let (error, text, _) = call(&client, "run_cell", json!({"code": "forbidden = n"})).await;
    assert!(error);
    assert!(
        text.starts_with("Code execution blocked: 1 violation found"),
        "{text}"
    );
    let (error, text, _) = call(&client, "run_cell", json!({"code": "1 / 0"})).await;
    assert!(error);
    assert!(text.contains("ZeroDivisionError"), "{text}");
    let (_, _, structured) = call(&client, "get_variable", json!({"name": "n"})).await;
    assert_eq!(structured, Some(json!({"name": "n", "value": 20})));
    // A call without its argument is the client's mistake, said as such.
    let Json::Object(empty) = json!({}) else {
        unreachable!()
    };
    let refused = client
        .call_tool(CallToolRequestParams::new("run_cell").with_arguments(empty))
        .await;
    assert!(refused.is_err(), "{refused:?}");
    client.cancel().await.unwrap();
}

/// A client that declared no elicitation cannot be asked: what needs approval is refused, and
/// says why.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_cannot_be_asked_is_refused() {
    let runtime = cave_runtime_kernel::KernelRuntime::new().unwrap();
    let server = SessionServer::new(Arc::new(runtime)).with_approvals(ClientApprovals::new(), true);
    let client = connect(server).await;
    let (error, text, _) = call(&client, "run_cell", json!({"code": "x = 1"})).await;
    assert!(error);
    assert!(text.contains("declared no elicitation"), "{text}");
    let (_, listed, _) = call(&client, "list_bound", json!({})).await;
    assert!(!listed.contains("  x ("), "the refused cell ran: {listed}");
    client.cancel().await.unwrap();
}

/// `list_bound` lists through a cell of its own: a namespace whose `sorted` never returns
/// does not hang it past the cell time limit, and the session goes on.
#[tokio::test(flavor = "multi_thread")]
async fn a_listing_that_never_returns_is_stopped() {
    let runtime = cave_runtime_kernel::KernelRuntime::new().unwrap();
    let server =
        SessionServer::new(Arc::new(runtime)).with_cell_timeout(std::time::Duration::from_secs(2));
    let client = connect(server).await;
    let code = "import time\ndef sorted(*a, **k):\n    while True:\n        time.sleep(0.1)";
    assert!(!call(&client, "run_cell", json!({"code": code})).await.0);
    let (_, listed, _) = call(&client, "list_bound", json!({})).await;
    assert!(listed.contains("could not be listed"), "{listed}");
    let (error, text, _) = call(&client, "run_cell", json!({"code": "del sorted\n1 + 1"})).await;
    assert!(!error, "{text}");
    assert_eq!(text, "2\n");
    client.cancel().await.unwrap();
}

/// `fork` makes a branch the other tools reach with `branch`: it starts from the session's
/// state and goes on on its own; a branch of a branch works; past the bound, `fork` refuses
/// until `drop_branch` ends one; a runtime that cannot fork is offered no
/// branches, and says which runtime can when asked all the same.
#[tokio::test(flavor = "multi_thread")]
async fn branches_go_on_on_their_own_within_a_bound() {
    let runtime = cave_runtime_kernel::KernelRuntime::new().unwrap();
    let server = SessionServer::new(Arc::new(runtime)).with_max_branches(2);
    let client = connect(server).await;
    call(&client, "run_cell", json!({"code": "tried = ['start']"})).await;
    let (error, _, made) = call(&client, "fork", json!({})).await;
    assert!(!error);
    assert_eq!(made, Some(json!({"branch": "b1"})));
    let (_, text, _) = call(
        &client,
        "run_cell",
        json!({"code": "tried.append('b1')\ntried", "branch": "b1"}),
    )
    .await;
    assert_eq!(text, "['start', 'b1']\n");
    let (_, _, made) = call(&client, "fork", json!({"from": "b1"})).await;
    assert_eq!(made, Some(json!({"branch": "b2"})));
    call(
        &client,
        "run_cell",
        json!({"code": "tried.append('b2')", "branch": "b2"}),
    )
    .await;
    let (_, _, value) = call(
        &client,
        "get_variable",
        json!({"name": "tried", "branch": "b2"}),
    )
    .await;
    assert_eq!(
        value,
        Some(json!({"name": "tried", "value": ["start", "b1", "b2"]}))
    );
    let (_, _, value) = call(&client, "get_variable", json!({"name": "tried"})).await;
    assert_eq!(value, Some(json!({"name": "tried", "value": ["start"]})));
    let (error, text, _) = call(&client, "fork", json!({})).await;
    assert!(error);
    assert!(text.contains("at most 2 live branches"), "{text}");
    let (_, listed, _) = call(&client, "list_bound", json!({})).await;
    assert!(listed.contains("the live branches are b1, b2"), "{listed}");
    let (error, _, _) = call(&client, "drop_branch", json!({"branch": "b1"})).await;
    assert!(!error);
    let (error, text, _) = call(&client, "run_cell", json!({"code": "1", "branch": "b1"})).await;
    assert!(error);
    assert!(
        text.contains("no branch \"b1\": the live branches are b2"),
        "{text}"
    );
    let (_, _, made) = call(&client, "fork", json!({})).await;
    assert_eq!(made, Some(json!({"branch": "b3"})), "names are not reused");
    client.cancel().await.unwrap();

    let cannot = cave_testing::EchoRuntime::default();
    let client = connect(SessionServer::new(Arc::new(cannot))).await;
    let tools = client.list_all_tools().await.unwrap();
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        ["get_variable", "list_bound", "run_cell"],
        "fork is not offered"
    );
    assert!(
        tools.iter().all(|t| !t.input_schema["properties"]
            .as_object()
            .unwrap()
            .contains_key("branch")),
        "{tools:?}"
    );
    let (error, text, _) = call(&client, "fork", json!({})).await;
    assert!(error);
    assert!(text.contains("the kernel runtime"), "{text}");
    client.cancel().await.unwrap();
}
