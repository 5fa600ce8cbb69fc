//! Real MCP servers (the official Python SDK's, and PyPI's `mcp-server-time`) as host objects,
//! called from real Python across the kernel runtime's process boundary (the in-process
//! runtime's turn is in cave-agent's `tests/mcp.rs`, which links libpython).

#[path = "support/scenario.rs"]
mod scenario;
#[path = "support/servers.rs"]
mod servers;

use cave_core::{Resources, Runtime};
use cave_mcp::{McpError, McpServer, McpTools, StdioServer};
use cave_testing::process::{alive, ends};
use scenario::{edge, edge_server, run, stdio_tools, tools_as_methods};
use servers::venv;
use std::sync::Arc;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread")]
async fn tools_are_methods_across_the_kernels_process_boundary() {
    let Some(venv) = venv() else { return };
    let runtime = cave_runtime_kernel::KernelRuntime::new().unwrap();
    tools_as_methods(&runtime, &venv).await;
}

/// What the model sees: identifiers for names, signatures from the schemas, the original
/// name in the docstring.
#[tokio::test(flavor = "multi_thread")]
async fn signatures_and_docs_come_from_the_tools() {
    let Some(venv) = venv() else { return };
    let tools = edge(&venv, Duration::from_secs(5)).await;
    let methods = cave_core::HostObject::methods(&*tools);
    let add = methods.iter().find(|m| m.name == "add").unwrap();
    let params: Vec<String> = add
        .signature
        .params
        .iter()
        .map(|p| {
            format!(
                "{}: {} {}",
                p.name,
                p.annotation.as_deref().unwrap_or("?"),
                p.default.is_some()
            )
        })
        .collect();
    assert_eq!(params, ["a: int false", "b: int true"]);
    let stats = methods.iter().find(|m| m.name == "word_stats").unwrap();
    let doc = stats.doc.as_deref().unwrap();
    assert!(doc.starts_with("Counts the words of a text"), "{doc}");
    assert!(
        doc.ends_with("(MCP tool `word-stats` of the server `edge`.)"),
        "{doc}"
    );
    assert_eq!(cave_core::HostObject::type_name(&*tools), "EdgeTools");
    assert!(
        tools
            .binding()
            .description
            .unwrap()
            .starts_with("the MCP server `edge` (cave-edge"),
    );
}

/// PyPI's `mcp-server-time`, as published.
#[tokio::test(flavor = "multi_thread")]
async fn a_published_server_answers_from_python() {
    let Some(venv) = venv() else { return };
    let command = format!(
        "{} --local-timezone UTC",
        venv.join("bin/mcp-server-time").display()
    );
    let command = StdioServer::from_command_line(&command).unwrap();
    let tools = stdio_tools("clock", &command, Duration::from_secs(30)).await;
    let runtime = kernel_with(&tools).await;
    let out = run(
        &runtime,
        "now = clock.get_current_time('Europe/Paris')\nprint(now['timezone'], type(now['datetime']).__name__)\nprint(clock.convert_time('UTC', '12:00', 'Asia/Tokyo')['target']['datetime'][11:16])",
    )
    .await;
    assert_eq!(out, "Europe/Paris str\n21:00\n");
}

/// A server that fails to start names itself and says what it wrote; a program that is not
/// there says so; a bad command line is refused before anything runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_that_cannot_start_says_why() {
    let Some(venv) = venv() else { return };
    let mut failing = edge_server(&venv);
    failing.env.push(("EDGE_FAIL_AT_START".into(), "1".into()));
    let error = McpServer::stdio("edge", &failing).await.unwrap_err();
    assert!(matches!(error, McpError::Start { .. }), "{error:?}");
    let message = error.to_string();
    assert!(
        message.starts_with("the MCP server `edge` did not start:"),
        "{message}"
    );
    assert!(
        message.contains("missing configuration EDGE_TOKEN"),
        "{message}"
    );

    let missing = McpServer::stdio(
        "nope",
        &StdioServer::new("/nonexistent/mcp-server", Vec::<String>::new()),
    )
    .await
    .unwrap_err();
    assert!(
        missing
            .to_string()
            .contains("cannot run /nonexistent/mcp-server"),
        "{missing}"
    );

    let quoted = StdioServer::from_command_line("uvx 'mcp-server-time").unwrap_err();
    assert!(
        quoted.to_string().contains("a quote is not closed"),
        "{quoted}"
    );
    let parsed = StdioServer::from_command_line("npx -y \"@scope/server x\" --flag=a\\ b").unwrap();
    assert_eq!(parsed.program, "npx");
    assert_eq!(parsed.args, ["-y", "@scope/server x", "--flag=a b"]);
}

/// Closing (or dropping) a server ends its process.
#[tokio::test(flavor = "multi_thread")]
async fn a_closed_or_dropped_server_leaves_no_process() {
    let Some(venv) = venv() else { return };
    for close in [true, false] {
        let server = Arc::new(McpServer::stdio("edge", &edge_server(&venv)).await.unwrap());
        let reply = server
            .call("pid", serde_json::Map::new(), Duration::from_secs(10))
            .await
            .unwrap();
        let pid: u32 = reply["content"][0]["text"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(alive(pid));
        if close {
            server.close(Duration::from_secs(2)).await;
        } else {
            drop(server);
        }
        assert!(ends(pid), "closed: {close}");
    }
}

/// A server over streamable HTTP: its tools as methods with the token sent; a wrong token is
/// a start error that says what the server answered, and never shows the token.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_over_http_with_a_token() {
    let Some(venv) = venv() else { return };
    let edge = servers::HttpEdge::start(&venv, "s3cret-token-77");
    let wrong =
        cave_mcp::HttpServer::new(&edge.url).header("Authorization", "Bearer nope-token-11");
    let error = McpServer::http("edge", &wrong).await.unwrap_err();
    let message = error.to_string();
    assert!(
        message.starts_with("the MCP server `edge` did not start:"),
        "{message}"
    );
    assert!(message.contains("401"), "{message}");
    assert!(!message.contains("nope-token-11") && !format!("{wrong:?}").contains("nope-token-11"));

    let right =
        cave_mcp::HttpServer::new(&edge.url).header("Authorization", "Bearer s3cret-token-77");
    let server = McpServer::http("edge", &right).await.unwrap();
    let tools = Arc::new(
        McpTools::new(Arc::new(server), Duration::from_secs(2))
            .await
            .unwrap(),
    );
    let runtime = kernel_with(&tools).await;
    let out = run(
        &runtime,
        "print(edge.add(4, 5))\nprint(edge.word_stats('a b'))\ntry:\n    edge.slow(10)\nexcept TimeoutError:\n    print('timed out')\ntry:\n    edge.fail('x')\nexcept RuntimeError as e:\n    print('failed:', e)",
    )
    .await;
    assert!(
        out.starts_with("9\n2 words\ntimed out\nfailed: the MCP tool \"fail\" of `edge` failed: "),
        "{out}"
    );
    tools.server().close(Duration::from_secs(2)).await;
}

/// PyPI's `mcp-server-git` on a real repository: tools that change it and read it, called from
/// one cell.
#[tokio::test(flavor = "multi_thread")]
async fn a_published_git_server_commits_and_logs() {
    let Some(venv) = venv() else { return };
    let program = venv.join("bin/mcp-server-git");
    if !program.is_file() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI installs mcp-server-git"
        );
        eprintln!(
            "skipped: no mcp-server-git in {} (cargo xtask test installs it)",
            venv.display()
        );
        return;
    }
    let repo = std::env::temp_dir().join(format!("cave-mcp-git-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&repo);
    std::fs::create_dir_all(&repo).unwrap();
    let git = |args: &[&str]| {
        let status = std::process::Command::new("git")
            .args([
                "-c",
                "user.email=test@example.invalid",
                "-c",
                "user.name=Test",
            ])
            .args(args)
            .current_dir(&repo)
            .status()
            .unwrap();
        assert!(status.success(), "git {args:?}");
    };
    git(&["init", "-q"]);
    git(&["commit", "-q", "--allow-empty", "-m", "first commit"]);
    std::fs::write(repo.join("a.txt"), "a\n").unwrap();
    std::fs::write(repo.join("b.txt"), "b\n").unwrap();

    let mut command = StdioServer::new(
        program.display().to_string(),
        ["--repository".to_owned(), repo.display().to_string()],
    );
    // The server commits as this author.
    for (key, value) in [
        ("GIT_AUTHOR_NAME", "Test"),
        ("GIT_AUTHOR_EMAIL", "test@example.invalid"),
        ("GIT_COMMITTER_NAME", "Test"),
        ("GIT_COMMITTER_EMAIL", "test@example.invalid"),
    ] {
        command.env.push((key.to_owned(), value.to_owned()));
    }
    let tools = stdio_tools("git", &command, Duration::from_secs(30)).await;
    let runtime = kernel_with(&tools).await;
    let code = format!(
        "repo = {:?}\nprint('a.txt' in git.git_status(repo_path=repo))\ngit.git_add(repo_path=repo, files=['a.txt', 'b.txt'])\ngit.git_commit(repo_path=repo, message='two files')\nlog = git.git_log(repo_path=repo, max_count=5)\nprint('two files' in str(log), 'first commit' in str(log))",
        repo.display().to_string()
    );
    let out = run(&runtime, &code).await;
    assert_eq!(out, "True\nTrue True\n");
    let log = std::process::Command::new("git")
        .args(["log", "--format=%s"])
        .current_dir(&repo)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&log.stdout),
        "two files\nfirst commit\n"
    );
    tools.server().close(Duration::from_secs(2)).await;
    std::fs::remove_dir_all(&repo).unwrap();
}

/// The reference servers' "everything" server (npm): text, structured content, an image among
/// text pieces, resource links, and a long-running tool past the limit.
#[tokio::test(flavor = "multi_thread")]
async fn a_published_node_server_answers_with_text_structures_and_images() {
    let Some(script) = std::env::var_os("CAVE_MCP_EVERYTHING") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI installs server-everything (cargo xtask test)"
        );
        eprintln!(
            "skipped: no server-everything (CAVE_MCP_EVERYTHING; cargo xtask test installs it)"
        );
        return;
    };
    let command = StdioServer::new(
        "node",
        [
            std::path::PathBuf::from(script).display().to_string(),
            "stdio".to_owned(),
        ],
    );
    let tools = stdio_tools("every", &command, Duration::from_secs(2)).await;
    let runtime = kernel_with(&tools).await;
    let code = "print(every.echo('hi'))\nprint(every.get_sum(2, 3))\nweather = every.get_structured_content('New York')\nprint(sorted(weather))\npieces = every.get_tiny_image()\nimage = [p for p in pieces if isinstance(p, dict)][0]\nprint(image['mime_type'], image['data'][:4])\ntry:\n    every.trigger_long_running_operation(duration=30, steps=3)\nexcept TimeoutError:\n    print('timed out')\nprint(every.echo('still here'))";
    let (execution, shown) = cave_testing::contract::run_shown(&runtime, code).await;
    let out = execution.output;
    // The image is also shown among the cell's output.
    let items = shown.items();
    assert_eq!(items.len(), 1, "{items:?}");
    let png = items[0].get("image/png").expect("a PNG form");
    assert!(png.as_bytes().starts_with(b"\x89PNG"), "{png:?}");
    assert!(items[0].text().starts_with("<image from the MCP tool"));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "Echo: hi", "{out}");
    assert!(lines[1].contains('5'), "{out}");
    assert!(
        lines[2].starts_with('[') && lines[2].contains("'temperature'"),
        "{out}"
    );
    assert_eq!(lines[3], "image/png b'\\x89PNG'", "{out}");
    assert_eq!(lines[4..], ["timed out", "Echo: still here"], "{out}");
    tools.server().close(Duration::from_secs(2)).await;
}

/// A kernel runtime with `tools` bound under its server's name.
async fn kernel_with(tools: &Arc<McpTools>) -> cave_runtime_kernel::KernelRuntime {
    let runtime = cave_runtime_kernel::KernelRuntime::new().unwrap();
    runtime
        .register(Resources::new().object(tools.binding()))
        .await
        .unwrap();
    runtime
}
