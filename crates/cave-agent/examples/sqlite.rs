//! Data: the host opens a SQLite database and gives the model a read-only handle to it (a
//! Rust object with `#[cave_agent::object]`). The model queries it into a pandas DataFrame,
//! then writes a chart as an HTML file where the host told it to; the host reads the file.
//!
//! Needs pandas in the runtime's Python (`pip install pandas`). Offline:
//! `cargo run -p cave-agent --example sqlite --features testing`. With `LLM_MODEL_ID` set, a
//! real model does it.

#[path = "common/mod.rs"]
mod common;

use cave_agent::Agent;
use cave_agent::testing::Reply;
use cave_agent::{
    InProcRuntime, Model, ObjectBinding, Resources, Runtime, Shared, Value, Variable,
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

fn script() -> Vec<Reply> {
    vec![
        common::code(
            "import pandas as pd\nrows = db.query('SELECT region, SUM(amount) AS total FROM sales GROUP BY region ORDER BY total DESC')\ndf = pd.DataFrame(rows)\nprint(df.to_string(index=False))",
        ),
        common::code(
            "top = df['total'].max()\nbars = ''.join(\n    f'<p>{r} <svg width=\"{int(300 * t / top)}\" height=\"12\"><rect width=\"100%\" height=\"100%\" fill=\"steelblue\"/></svg> {t:.2f}</p>'\n    for r, t in zip(df['region'], df['total'])\n)\nwith open(chart_path, 'w') as f:\n    f.write(f'<html><body><h1>Sales by region</h1>{bars}</body></html>')\nprint('written')",
        ),
        Reply::text(
            "East sold most (225.50), then north (200.50) and south (75.00); the chart is in chart.html.",
        ),
    ]
}

/// Runs the request; returns the chart the model wrote.
async fn run(
    model: Arc<dyn Model>,
    dir: &std::path::Path,
) -> Result<String, Box<dyn std::error::Error>> {
    let chart = dir.join("chart.html");
    let runtime = InProcRuntime::new()?;
    // Said before the model is asked, rather than as a failed cell.
    let probe = runtime
        .execute("import pandas", &cave_agent::DiscardOutput)
        .await?;
    if let Some(error) = probe.error {
        return Err(format!(
            "this example needs pandas in the Python the runtime embeds (pip install pandas): {}: {}",
            error.python_type, error.message
        )
        .into());
    }
    runtime
        .register(
            Resources::new()
                .object(
                    ObjectBinding::new("db", Shared::new(database()?))
                        .with_description("the shop's sales database (SQLite)"),
                )
                .variable(
                    Variable::new("chart_path", Value::Str(chart.display().to_string()))
                        .with_description("where to write the chart, as an HTML file"),
                ),
        )
        .await?;
    let mut agent = Agent::builder(model, runtime).build()?;
    common::show(
        agent.stream("Total the sales per region with pandas, and draw a bar chart of them into an HTML file at chart_path."),
        true,
    )
    .await;
    std::fs::read_to_string(&chart)
        .map_err(|e| format!("the model's code wrote no {}: {e}", chart.display()).into())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let dir = std::env::temp_dir().join(format!("cave-sqlite-example-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("could not create {}: {e}", dir.display());
        return std::process::ExitCode::FAILURE;
    }
    common::finish(run(common::model(script), &dir).await, |html| {
        println!(
            "\nThe host reads {} ({} bytes of HTML).",
            dir.join("chart.html").display(),
            html.len()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_model_charts_the_hosts_database() {
        let dir = std::env::temp_dir().join(format!("cave-sqlite-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let model = Arc::new(cave_agent::testing::ScriptedModel::new(script()));
        let html = run(model, &dir).await.unwrap();
        assert!(
            html.starts_with("<html><body><h1>Sales by region</h1>"),
            "{html}"
        );
        for bar in [
            "east <svg width=\"300\"",
            "north <svg width=\"266\"",
            "south <svg width=\"99\"",
        ] {
            assert!(html.contains(bar), "{bar} in {html}");
        }
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
