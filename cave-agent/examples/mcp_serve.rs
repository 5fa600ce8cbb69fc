//! The runtime as an MCP server: a Python session that holds the host's data (`orders`) and a
//! host function that needs approval (`refund`), served to any MCP client over stdio. The
//! client's model runs cells with `run_cell`, reads values with `get_variable`, and each call
//! of `refund` is asked of the client's user (MCP elicitation).
//!
//! `cargo run -p cave-agent --example mcp_serve --features mcp-serve`, then point a client at
//! that command (or at `cave mcp serve`, which does the same from options).

use cave_agent::mcp::serve::{ClientApprovals, SessionServer};
use cave_agent::{
    Approver, Args, Function, KernelRuntime, Param, Resources, Runtime, Signature, Value, Variable,
    requiring_approval,
};
use std::sync::Arc;

/// The session: the kernel runtime (its own process, so nothing a cell writes reaches the MCP
/// stream on stdout), the orders, and `refund` behind the client's approval.
async fn session() -> Result<SessionServer, Box<dyn std::error::Error>> {
    let runtime = KernelRuntime::new()?;
    let orders = serde_json::json!([
        {"id": 1, "customer": "ada", "total": 120.0},
        {"id": 2, "customer": "grace", "total": 80.5},
    ]);
    let refund = Function::host(
        "refund",
        Signature::new([Param::new("order_id").annotated("int")]).returns("str"),
        |args: Args| async move {
            let id: i64 = args.get("order_id")?;
            Ok(Value::Str(format!("order {id} refunded")))
        },
    )
    .with_doc("Refund an order in full.");
    let approvals = ClientApprovals::new();
    let refund = requiring_approval(refund, approvals.clone() as Arc<dyn Approver>);
    runtime
        .register(
            Resources::new()
                .variable(Variable::new("orders", cave_agent::to_value(&orders)?))
                .function(refund),
        )
        .await?;
    Ok(SessionServer::new(Arc::new(runtime)).with_approvals(approvals, false))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = session().await?;
    eprintln!("serving a Python session over MCP on stdio (end of input stops it)");
    server
        .serve_stdio(tokio::io::stdin(), tokio::io::stdout())
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value as Json, json};
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    /// The result of the call `id`, read past other messages.
    async fn answer(
        answers: &mut tokio::io::Lines<BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>,
        id: u64,
    ) -> Json {
        loop {
            let line = answers.next_line().await.unwrap().expect("an answer");
            let message: Json = serde_json::from_str(&line).unwrap();
            if message["id"] == id {
                return message["result"].clone();
            }
        }
    }

    /// A client speaking MCP by hand (no elicitation declared): the data is there, and the
    /// guarded call is refused, since this client cannot be asked.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_runs_cells_on_the_hosts_data() {
        let (client, server_end) = tokio::io::duplex(1 << 16);
        let (read, write) = tokio::io::split(server_end);
        tokio::spawn(session().await.unwrap().serve_stdio(read, write));
        let (answers, mut requests) = tokio::io::split(client);
        let mut answers = BufReader::new(answers).lines();
        let cell = |id: u64, code: &str| {
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                   "params": {"name": "run_cell", "arguments": {"code": code}}})
        };
        let messages = [
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "example-test", "version": "1"}}}),
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            cell(2, "sum(o['total'] for o in orders)"),
        ];
        for message in messages {
            requests
                .write_all(format!("{message}\n").as_bytes())
                .await
                .unwrap();
        }
        let total = answer(&mut answers, 2).await;
        assert_eq!(total["content"][0]["text"], "200.5\n");
        let refused = cell(3, "refund(1)");
        requests
            .write_all(format!("{refused}\n").as_bytes())
            .await
            .unwrap();
        let refused = answer(&mut answers, 3).await;
        assert_eq!(refused["isError"], true);
        let text = refused["content"][0]["text"].as_str().unwrap();
        assert!(text.contains("PermissionError"), "{text}");
    }
}
