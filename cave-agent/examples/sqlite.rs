//! The analyst: the host opens a SQLite database and gives the model a read-only handle to it
//! (a Rust object with `#[cave_agent::object]`). The model queries it into a pandas DataFrame,
//! shows it as a table and draws a bar chart with matplotlib; the host gets both as files in
//! its display directory (`display-1.html`, `display-2.png`) and as items in the response.
//!
//! Needs pandas and matplotlib in the runtime's Python (`pip install pandas matplotlib`).
//! Offline, replaying the model's answers from its cassette (`examples/cassettes/sqlite.jsonl`;
//! the Python really runs): `cargo run -p cave-agent --example sqlite --features testing`.
//! With `LLM_MODEL_ID` set, a real model does it. The run's events are written beside the
//! files, so that `cave view DIR/session.jsonl` shows the session in a browser.

#[path = "common/mod.rs"]
mod common;

use cave_agent::Agent;
use cave_agent::AgentExt;
use cave_agent::models::ReplayModel;
use cave_agent::{
    InProcRuntime, Model, ObjectBinding, OpenAiModel, Resources, Runtime, Shared, Value,
};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// A read-only view of the shop's SQLite database.
#[cave_agent::object]
struct Database {
    connection: Mutex<rusqlite::Connection>,
}

#[cave_agent::object]
impl Database {
    /// The tables and their columns, as `CREATE TABLE` statements.
    pub fn schema(&self) -> Result<Vec<String>, String> {
        let connection = self.connection.lock().map_err(|e| e.to_string())?;
        let mut statement = connection
            .prepare("SELECT sql FROM sqlite_master WHERE type = 'table'")
            .map_err(|e| e.to_string())?;
        let rows = statement
            .query_map([], |row| row.get::<_, String>(0))
            .map_err(|e| e.to_string())?;
        rows.collect::<Result<_, _>>().map_err(|e| e.to_string())
    }

    /// Runs a read-only query (`SELECT ...`); returns one dict per row.
    ///
    /// # Arguments
    /// * `sql` - the query; anything that would change the database is refused
    pub fn query(&self, sql: String) -> Result<Vec<BTreeMap<String, Value>>, String> {
        let connection = self.connection.lock().map_err(|e| e.to_string())?;
        let mut statement = connection.prepare(&sql).map_err(|e| e.to_string())?;
        if !statement.readonly() {
            return Err("only queries that read are allowed".to_owned());
        }
        let columns: Vec<String> = statement.column_names().map(str::to_owned).collect();
        let mut rows = statement.query([]).map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(|e| e.to_string())? {
            let mut record = BTreeMap::new();
            for (i, column) in columns.iter().enumerate() {
                use rusqlite::types::ValueRef;
                let value = match row.get_ref(i).map_err(|e| e.to_string())? {
                    ValueRef::Null => Value::None,
                    ValueRef::Integer(n) => Value::Int(n.into()),
                    ValueRef::Real(x) => Value::Float(x),
                    ValueRef::Text(t) => Value::Str(String::from_utf8_lossy(t).into_owned()),
                    ValueRef::Blob(b) => Value::Bytes(b.to_vec()),
                };
                record.insert(column.clone(), value);
            }
            out.push(record);
        }
        Ok(out)
    }
}

/// The shop's database, in memory.
fn database() -> rusqlite::Result<Database> {
    let connection = rusqlite::Connection::open_in_memory()?;
    connection.execute_batch(
        "CREATE TABLE sales (id INTEGER PRIMARY KEY, region TEXT NOT NULL, product TEXT NOT NULL, amount REAL NOT NULL);
         INSERT INTO sales (region, product, amount) VALUES
           ('north', 'tea', 120.0), ('north', 'cups', 80.5), ('south', 'tea', 45.0),
           ('east', 'pots', 210.0), ('south', 'cups', 30.0), ('east', 'tea', 15.5);",
    )?;
    Ok(Database {
        connection: Mutex::new(connection),
    })
}

/// The model's answers, recorded from the tests' `script`.
const CASSETTE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/cassettes/sqlite.jsonl"
);

/// What the host got: the files in its display directory, and the response's items.
struct Shown {
    files: Vec<std::path::PathBuf>,
    items: Vec<cave_agent::DisplayItem>,
    /// The run's events as JSON Lines (what `cave view` reads).
    session: std::path::PathBuf,
}

/// Runs the request; returns what the model's code showed.
async fn run(
    model: Arc<dyn Model>,
    dir: &std::path::Path,
) -> Result<Shown, Box<dyn std::error::Error>> {
    let runtime = InProcRuntime::new()?;
    // Said before the model is asked, rather than as a failed cell.
    let probe = runtime
        .execute("import pandas, matplotlib", &cave_agent::DiscardOutput)
        .await?;
    if let Some(error) = probe.error {
        return Err(format!(
            "this example needs pandas and matplotlib in the Python the runtime embeds (pip install pandas matplotlib): {}: {}",
            error.python_type, error.message
        )
        .into());
    }
    runtime
        .register(
            Resources::new().object(
                ObjectBinding::new("db", Shared::new(database()?))
                    .with_description("the shop's sales database (SQLite)"),
            ),
        )
        .await?;
    let mut builder = Agent::builder(model, runtime);
    builder.display_dir(dir);
    let mut agent = builder.build()?;
    let events = common::show(
        agent.stream("Total the sales per region with pandas, show them as a table, and draw a bar chart of them."),
        true,
    )
    .await;
    if let Some(cave_agent::Event::Stopped {
        stop_reason, error, ..
    }) = events.last()
        && *stop_reason != cave_agent::StopReason::Completed
    {
        return Err(format!("the run ended {stop_reason:?}: {error:?}").into());
    }
    let session = dir.join("session.jsonl");
    let lines: String = events
        .iter()
        .map(|event| serde_json::to_string(event).map(|line| line + "\n"))
        .collect::<Result<_, _>>()?;
    std::fs::write(&session, lines)?;
    let items = events
        .into_iter()
        .filter_map(|event| match event {
            cave_agent::Event::Display { item, .. } => item.map(|item| *item),
            _ => None,
        })
        .collect();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|path| *path != session)
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    Ok(Shown {
        files,
        items,
        session,
    })
}

/// A real model when `LLM_MODEL_ID` is set, else the cassette.
fn model() -> Result<Arc<dyn Model>, Box<dyn std::error::Error>> {
    if common::live() {
        return Ok(Arc::new(OpenAiModel::from_env()?));
    }
    Ok(Arc::new(ReplayModel::open(CASSETTE)?))
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let dir = std::env::temp_dir().join(format!("cave-analyst-{}", std::process::id()));
    let result = match model() {
        Ok(model) => run(model, &dir).await,
        Err(error) => Err(error),
    };
    common::finish(result, |shown| {
        println!("\nThe host has {} items; the files:", shown.items.len());
        for file in &shown.files {
            println!("  {}", file.display());
        }
        println!(
            "To see the session in a browser: cave view {}",
            shown.session.display()
        );
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the cassette was recorded from (`write_cassette` below records it again).
    fn script() -> Vec<cave_agent::testing::Reply> {
        vec![
            common::code(
                "import pandas as pd\nrows = db.query('SELECT region, SUM(amount) AS total FROM sales GROUP BY region ORDER BY total DESC')\ndf = pd.DataFrame(rows)\ndisplay(df)",
            ),
            common::code(
                "import matplotlib.pyplot as plt\nax = df.plot.bar(x='region', y='total', legend=False, color='steelblue')\nax.set_ylabel('sales')\nax.set_title('Sales by region')\nplt.show()",
            ),
            cave_agent::testing::Reply::text(
                "East sold most (225.50), then north (200.50) and south (75.00); the table and the chart are above.",
            ),
        ]
    }

    /// The example as it runs offline: its cassette replayed, the Python run for real.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_model_tabulates_and_charts_the_hosts_database() {
        let dir = std::env::temp_dir().join(format!("cave-analyst-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let model = ReplayModel::open(CASSETTE).unwrap();
        let shown = run(Arc::new(model), &dir).await.unwrap_or_else(|e| {
            panic!("{e} (if the prompt texts changed, record the cassette again: cargo test -p cave-agent --all-features --example sqlite -- --ignored write_cassette)")
        });
        assert_eq!(
            shown.files,
            [dir.join("display-1.html"), dir.join("display-2.png")]
        );
        let table = std::fs::read_to_string(&shown.files[0]).unwrap();
        assert!(
            table.contains("<table") && table.contains("east"),
            "{table}"
        );
        let png = std::fs::read(&shown.files[1]).unwrap();
        let (width, height) = cave_agent::image_size("image/png", &png).expect("a png");
        assert!(width > 200 && height > 150, "{width}×{height}");
        assert_eq!(shown.items.len(), 2);
        assert!(
            shown.items[0].text().contains("225.5"),
            "{}",
            shown.items[0].text()
        );
        let session = std::fs::read_to_string(&shown.session).unwrap();
        assert_eq!(session.matches("\"type\":\"display\"").count(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Records `examples/cassettes/sqlite.jsonl` again from [`script`] (after a change to the
    /// prompt texts or the script).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "writes examples/cassettes/sqlite.jsonl"]
    async fn write_cassette() {
        let dir = std::env::temp_dir().join(format!("cave-analyst-rec-{}", std::process::id()));
        let scripted = cave_agent::testing::ScriptedModel::new(script());
        let model = cave_agent::models::RecordingModel::create(scripted, CASSETTE).unwrap();
        run(Arc::new(model), &dir).await.unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_database_handle_refuses_writes() {
        let db = database().unwrap();
        assert_eq!(
            db.query("DELETE FROM sales".into()),
            Err("only queries that read are allowed".to_owned())
        );
        assert_eq!(
            db.query("SELECT COUNT(*) AS n FROM sales".into()).unwrap(),
            vec![BTreeMap::from([("n".to_owned(), Value::Int(6))])]
        );
    }
}
