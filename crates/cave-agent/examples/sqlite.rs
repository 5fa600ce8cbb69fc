//! The analyst: the host opens a SQLite database and gives the model a read-only handle to it
//! (a Rust object with `#[cave_agent::object]`). The model queries it into a pandas DataFrame,
//! shows it as a table and draws a bar chart with matplotlib; the host gets both as files in
//! its display directory (`display-1.html`, `display-2.png`) and as items in the response.
//!
//! Needs pandas and matplotlib in the runtime's Python (`pip install pandas matplotlib`).
//! Offline, with the script of what a model answers:
//! `cargo run -p cave-agent --example sqlite --features testing`. With `LLM_MODEL_ID` set, a
//! real model does it.

#[path = "common/mod.rs"]
mod common;

use cave_agent::Agent;
use cave_agent::testing::Reply;
use cave_agent::{InProcRuntime, Model, ObjectBinding, Resources, Runtime, Shared, Value};
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

fn script() -> Vec<Reply> {
    vec![
        common::code(
            "import pandas as pd\nrows = db.query('SELECT region, SUM(amount) AS total FROM sales GROUP BY region ORDER BY total DESC')\ndf = pd.DataFrame(rows)\ndisplay(df)",
        ),
        common::code(
            "import matplotlib.pyplot as plt\nax = df.plot.bar(x='region', y='total', legend=False, color='steelblue')\nax.set_ylabel('sales')\nax.set_title('Sales by region')\nplt.show()",
        ),
        Reply::text(
            "East sold most (225.50), then north (200.50) and south (75.00); the table and the chart are above.",
        ),
    ]
}

/// What the host got: the files in its display directory, and the response's items.
struct Shown {
    files: Vec<std::path::PathBuf>,
    items: Vec<cave_agent::DisplayItem>,
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
    let items = events
        .into_iter()
        .filter_map(|event| match event {
            cave_agent::Event::Display { item, .. } => item.map(|item| *item),
            _ => None,
        })
        .collect();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    Ok(Shown { files, items })
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let dir = std::env::temp_dir().join(format!("cave-analyst-{}", std::process::id()));
    common::finish(run(common::model(script), &dir).await, |shown| {
        println!("\nThe host has {} items; the files:", shown.items.len());
        for file in &shown.files {
            println!("  {}", file.display());
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_model_tabulates_and_charts_the_hosts_database() {
        let dir = std::env::temp_dir().join(format!("cave-analyst-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let model = Arc::new(cave_agent::testing::ScriptedModel::new(script()));
        let shown = run(model, &dir).await.unwrap();
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
